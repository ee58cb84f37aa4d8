# One inotify instance per trio run, shared by every cgroup domain.
#
# "populated 0" in cgroup.events is announced to pollers as POLLPRI, which
# trio cannot wait for, but the file also raises an inotify IN_MODIFY event.
# Closing an inotify descriptor that has held a watch costs ~7 ms here (the
# kernel waits for an SRCU grace period), so a descriptor per command would
# dominate a short command's cost. Instead each trio run gets one descriptor
# (in a RunVar) and one system task that reads its events and wakes the
# waiter of each watch; adding and removing a watch costs microseconds. The
# descriptor is closed when the run ends.

from __future__ import annotations

import os
import struct
from functools import cache
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    import ctypes

_IN_MODIFY = 0x00000002
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_EVENT = struct.Struct("iIII")


@cache
def _libc() -> ctypes.CDLL:
    # dlopen(NULL): the symbols this process has loaded, libc's among them.
    # No file is looked up (find_library would run ldconfig), and ctypes is
    # imported only by a run that watches a cgroup.
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _raise_errno(path: str | None = None) -> None:
    import ctypes

    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err), path)


class Inotify:
    """A shared inotify descriptor with per-watch wake-ups."""

    def __init__(self) -> None:
        fd = _libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            _raise_errno()
        self.fd = fd
        self._events: dict[int, trio.Event] = {}
        trio.lowlevel.spawn_system_task(self._reader, name="trio_procown inotify reader")

    def add(self, path: str) -> int:
        wd = int(_libc().inotify_add_watch(self.fd, os.fsencode(path), _IN_MODIFY))
        if wd < 0:
            _raise_errno(path)
        return wd

    def remove(self, wd: int) -> None:
        self._events.pop(wd, None)
        _libc().inotify_rm_watch(self.fd, wd)

    def event(self, wd: int) -> trio.Event:
        """The event set at the next change of watch `wd` (get it *before*
        checking the file, so that a change in between is not missed)."""
        ev = self._events.get(wd)
        if ev is None:
            ev = self._events[wd] = trio.Event()
        return ev

    async def _reader(self) -> None:
        try:
            while True:
                await trio.lowlevel.wait_readable(self.fd)
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    continue
                offset = 0
                while offset + _EVENT.size <= len(data):
                    wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                    offset += _EVENT.size + length
                    if mask & _IN_Q_OVERFLOW:
                        # The kernel dropped events (its queue was full):
                        # every waiter looks at its file again.
                        events, self._events = self._events, {}
                        for waiter in events.values():
                            waiter.set()
                        continue
                    ev = self._events.pop(wd, None)
                    if ev is not None:
                        ev.set()
        finally:
            for ev in self._events.values():
                ev.set()
            trio.lowlevel.notify_closing(self.fd)
            os.close(self.fd)


_SHARED: trio.lowlevel.RunVar[Inotify] = trio.lowlevel.RunVar("trio_procown_inotify")


def shared() -> Inotify:
    """This trio run's inotify instance, created on first use."""
    try:
        return _SHARED.get()
    except LookupError:
        inotify = Inotify()
        _SHARED.set(inotify)
        return inotify
