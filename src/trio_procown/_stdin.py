# Feeding an owned command's stdin.
#
# stdin=None gives the command /dev/null, never the caller's stdin. A path
# is opened and handed to the command as its stdin (the command reads the
# file itself; no copy through us). An open file descriptor (or an object
# with fileno()) is handed over as is, like a shell's redirection: the
# command inherits the same open file description, so it reads from, and
# moves, the caller's file offset; the caller keeps its fd open. bytes and
# a trio ReceiveStream need a feeder: a task in the command's nursery that
# writes into a pipe. The feeder is cancelled and the pipe closed by the
# teardown, so a command that stops reading its stdin cannot hold the
# teardown: a blocked write is a cancellable wait_writable.

from __future__ import annotations

import errno
import os
from typing import Protocol, TypeAlias, Union

import trio


class HasFileno(Protocol):
    """An open file object: its fileno() is passed to the command."""

    def fileno(self) -> int: ...


# None: /dev/null; bytes-like: fed through a pipe; str / PathLike: a file
# the command reads itself; int / HasFileno: an open fd the command inherits;
# a ReceiveStream: copied through a pipe.
StdinSource: TypeAlias = Union[
    bytes, bytearray, memoryview, str, "os.PathLike[str]", int, HasFileno, trio.abc.ReceiveStream, None
]


class Feeder:
    """Writes bytes or a ReceiveStream into the command's stdin pipe."""

    def __init__(self, fd: int, source: bytes | trio.abc.ReceiveStream) -> None:
        # bytes(...) copies bytearray/memoryview input once, so the caller
        # may reuse its buffer while we feed.
        self.fd: int | None = fd
        self.source = source
        self.written = 0
        self.scope = trio.CancelScope(shield=True)  # ended by the teardown only
        os.set_blocking(fd, False)

    async def _write_all(self, data: bytes | bytearray | memoryview) -> bool:
        view = memoryview(data)
        while view:
            assert self.fd is not None
            try:
                n = os.write(self.fd, view[: 1 << 20])
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.fd)
                continue
            except BrokenPipeError:
                return False
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    return False
                raise
            self.written += n
            view = view[n:]
        return True

    @trio.lowlevel.enable_ki_protection  # a ^C goes to the main task
    async def run(self) -> None:
        try:
            with self.scope:
                if isinstance(self.source, trio.abc.ReceiveStream):
                    while True:
                        chunk = await self.source.receive_some()
                        if not chunk or not await self._write_all(chunk):
                            return
                else:
                    await self._write_all(self.source)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
