# The single drain of an owned command's output.
#
# Exactly one task reads each pipe, from the spawn to the end of the
# teardown; timeout and cancellation never start a second reader, so output
# read before a deadline is never lost to a re-read after the kill. The
# drain reads with os.read on a non-blocking fd (in 1 MiB chunks from a pipe
# enlarged to 1 MiB once the command proves a heavy writer) and sleeps in
# trio.lowlevel.wait_readable only when the pipe is empty.
#
# What is read goes into a Capture: the record of the stream, bounded by
# max_output. It keeps the first half of the limit (the head) and the most
# recent half (the tail) and counts every byte it had to drop in between, so
# memory stays bounded whatever the command writes.
#
# Consumers (run.stream(), run.lines()) never touch the pipe: they follow
# the Capture by absolute byte offset. By default a consumer that falls so
# far behind that the bytes it has not seen were dropped from the record
# skips to the oldest retained byte and is told how many it missed; the
# drain never waits for it, so a slow or stopped consumer can neither stall
# the command nor hang the teardown, and the record stays intact.
#
# A *lossless* consumer (stream(..., lossless=True), e.g. a CLI forwarding
# output) instead holds the drain back: the drain reads from the pipe only
# as much as fits in the tail without dropping a byte that consumer has not
# read yet, so a slow consumer slows the command down (its writes block on
# the full pipe) instead of losing bytes. The teardown still cannot hang: its
# drain wait is bounded by drain_wait, after which the drain is abandoned.
#
# Abandoning (after drain_wait in the teardown) cancels the reader and closes
# the read end; bytes read until then are kept.

from __future__ import annotations

import codecs
import errno
import itertools
import os
from collections import deque
from collections.abc import AsyncIterator

import trio

FIRST_READ_SIZE = 1 << 16
READ_SIZE = 1 << 20
PIPE_SIZE = 1 << 20
DEFAULT_MAX_OUTPUT = 64 << 20


def enlarge_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer (fewer wake-ups); ignore refusal."""
    import fcntl  # POSIX only; imported here so the package imports anywhere

    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsz is None:
        return
    try:
        fcntl.fcntl(fd, setsz, PIPE_SIZE)
    except OSError:
        pass


class Capture:
    """A bounded record of one stream: the head, the tail, and a drop count."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            msg = f"max_output must be >= 0, not {limit!r}"
            raise ValueError(msg)
        self.limit = limit
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0  # bytes in _tail, possibly > tail_limit by < 1 chunk
        self.total = 0  # bytes appended in all

    def append(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
            if not data:
                return
        if self.tail_limit == 0:
            return
        self._tail.append(data)
        self._tail_len += len(data)
        # Drop whole chunks that lie entirely before the tail window.
        while self._tail_len - len(self._tail[0]) >= self.tail_limit:
            self._tail_len -= len(self._tail.popleft())

    @property
    def kept(self) -> int:
        return len(self._head) + min(self._tail_len, self.tail_limit)

    @property
    def dropped(self) -> int:
        return self.total - self.kept

    @property
    def tail_start(self) -> int:
        """Absolute offset of the first retained tail byte."""
        return self.total - min(self._tail_len, self.tail_limit)

    def _tail_bytes(self) -> bytes:
        joined = b"".join(self._tail)
        return joined[len(joined) - min(self._tail_len, self.tail_limit) :]

    def getvalue(self) -> bytes:
        """Head plus tail, without marker: the receipt counts what was dropped."""
        if not self._tail:
            return bytes(self._head)
        return bytes(self._head) + self._tail_bytes()

    def read_from(self, offset: int) -> tuple[int, bytes, int]:
        """Bytes from absolute `offset` on: (new offset, data, bytes skipped)."""
        if offset < len(self._head):
            return len(self._head), bytes(self._head[offset:]), 0
        if offset >= self.total:
            return offset, b"", 0
        start = self.tail_start
        skipped = 0
        if offset < start:
            skipped = start - offset
            offset = start
        # Only the newest chunks that hold [offset, total): a consumer close
        # behind the writer costs what it reads, not the whole tail (up to
        # half of max_output, joined at every read before).
        need = self.total - offset
        parts: list[bytes] = []
        have = 0
        for chunk in reversed(self._tail):
            parts.append(chunk)
            have += len(chunk)
            if have >= need:
                break
        joined = b"".join(reversed(parts))  # (one part: that part itself, no copy)
        return self.total, joined[len(joined) - need :], skipped


class Drain:
    """The one reader of one pipe."""

    def __init__(self, name: str, fd: int, limit: int) -> None:
        self.name = name
        self.fd: int | None = fd
        self.capture = Capture(limit)
        self.eof = False
        self.abandoned = False
        self.closed_by_reader = False  # close_by_reader(): the consumer went away
        self.done = trio.Event()
        # The reading task's scope, made by it (see run()): shielded, so that
        # only abandon() (or pause(), for a handoff) ends the task early,
        # never an outer cancel. Before the task runs, those two only set
        # their flag, which the task sees when it starts.
        self._scope: trio.CancelScope | None = None
        self._pausing = False
        self._stopped = trio.Event()
        self._holders: set[ChunkStream] = set()  # lossless consumers
        self._progress: trio.Event | None = None
        self._changed: trio.Event | None = None
        self.skipped = 0  # bytes consumers skipped because they were dropped first
        self._parked = False  # the reading task waits for the pipe to be readable
        self._reading = False  # a reading task has begun and not ended (it may be between reads)
        os.set_blocking(fd, False)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    @trio.lowlevel.enable_ki_protection  # a ^C goes to the main task, never kills the drain
    async def run(self) -> None:
        """Read until EOF or until abandoned. Runs as a nursery task.

        After pause() it may be started again, in another nursery: the pipe,
        the record and the consumers carry over, and at no moment do two
        tasks read the pipe.
        """
        if self.done.is_set():
            return  # reached EOF (or was abandoned) before a handoff restarted it
        fd = self.fd
        assert fd is not None
        append = self.capture.append
        if self.abandoned:
            self._finish()
            return
        if self._pausing:  # paused before this task got to run
            self._pausing = False
            self._stopped.set()
            return
        self._scope = trio.CancelScope(shield=True)
        if self._stopped.is_set():  # (paused and started again: a pause() to come waits for this run)
            self._stopped = trio.Event()
        self._reading = True
        # Start small: most commands print little, and enlarging a pipe
        # costs as much as a tenth of a spawn. A full first read means a
        # heavy writer: then enlarge the pipe and read in big chunks.
        size = FIRST_READ_SIZE
        enlarged = False
        try:
            with self._scope:
                while True:
                    want = size
                    if self._holders:
                        room = self._room()
                        while room <= 0:
                            await self._wait_progress()
                            room = self._room()
                        want = min(size, room)
                    try:
                        data = os.read(fd, want)
                    except BlockingIOError:
                        self._parked = True
                        try:
                            await trio.lowlevel.wait_readable(fd)
                        except trio.ClosedResourceError:
                            if self.eof:  # take_eof() read the end and closed the pipe
                                return
                            raise
                        finally:
                            self._parked = False
                        if self.eof:  # ... after this task was woken, before it ran
                            return
                        continue
                    except OSError as exc:
                        if exc.errno != errno.EIO:
                            raise
                        data = b""
                    if not data:
                        self.eof = True
                        return
                    if len(data) == want == size == FIRST_READ_SIZE:
                        if not enlarged:
                            enlarge_pipe(fd)
                            enlarged = True
                        size = READ_SIZE
                    elif size == READ_SIZE and len(data) < FIRST_READ_SIZE:
                        # The burst is over: back to small reads. A read
                        # asking for 1 MiB costs ~12 us more than one for
                        # 64 KiB when it returns a line (its buffer is
                        # allocated whole, then shrunk).
                        size = FIRST_READ_SIZE
                    append(data)
                    self._notify()
                    # A fast writer keeps the pipe readable: yield anyway, so
                    # the event loop (teardown deadlines, consumers) never
                    # stalls behind this loop.
                    await trio.lowlevel.checkpoint()
        finally:
            self._reading = False
            if self._pausing and not self.eof and not self.abandoned:
                self._pausing = False
                self._stopped.set()
            else:
                self._finish()

    def take_eof(self) -> bool:
        """Once the command has exited, see at once whether the pipe is at
        its end, instead of waiting for the reading task's turn: True if the
        drain is done. Only while that task waits for the pipe (trio runs
        one task at a time, so no byte is read by two) and no lossless
        consumer holds it back. Also before that task first runs (a command
        that exits at once is often over before its drain got a turn): the
        task then finds the drain done, or reads on after what was kept
        here. Never while the task is between two reads of its own. One
        read: a chunk found there is kept, in order, and the rest (and the
        end) is left to the task."""
        if self.done.is_set():
            return True
        fd = self.fd
        between_reads = self._reading and not self._parked
        if fd is None or between_reads or self._holders or self._pausing or self.abandoned:
            return False
        try:
            data = os.read(fd, FIRST_READ_SIZE)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno != errno.EIO:
                return False  # the reading task meets it too, and says so
            data = b""
        if data:
            self.capture.append(data)  # in order: the task is parked, and reads after this
            self._notify()
            return False
        self.eof = True
        self._finish()  # closing the pipe wakes the parked task, which returns
        return True

    def _room(self) -> int:
        """How many bytes may be appended without dropping any byte that a
        lossless consumer has not read yet."""
        cap = self.capture
        room = READ_SIZE
        for holder in self._holders:
            keep_from = max(holder.offset, cap.head_limit)
            room = min(room, cap.tail_limit + keep_from - cap.total)
        return room

    async def _wait_progress(self) -> None:
        if self._progress is None:
            self._progress = trio.Event()
        await self._progress.wait()

    def _advanced(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    def _finish(self) -> None:
        self._close()
        self.done.set()
        self._notify()
        self._stopped.set()

    async def pause(self) -> None:
        """Stop the reading task without closing the pipe (for a handoff)."""
        if self.done.is_set():
            return
        self._pausing = True
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()

    def abandon(self) -> None:
        """Stop reading at once and close the read end; keep what was read."""
        if self.done.is_set():
            return
        self.abandoned = True
        if self._scope is not None:
            self._scope.cancel()

    def close_by_reader(self) -> None:
        """The consumer went away: stop reading and close the read end, so
        the command's next write sees a broken pipe, as it would without us."""
        if self.done.is_set():
            return
        self.closed_by_reader = True
        self.abandon()

    def _close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    async def wait_changed(self) -> None:
        if self.done.is_set():
            return
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def chunks(self, *, lossless: bool = False) -> ChunkStream:
        """Every retained byte from the start, then live, until the end."""
        return ChunkStream(self, lossless=lossless)


class ChunkStream:
    """An async iterator over one stream's bytes, following the drain's record.

    A plain iterator class rather than an async generator, so that a consumer
    may stop at any point (break out of ``async for``) without leaving an
    unfinished generator for the garbage collector.
    """

    def __init__(self, drain: Drain, *, lossless: bool = False) -> None:
        self._drain = drain
        self.offset = 0
        self.skipped = 0  # bytes dropped from the record before we read them
        self.lossless = lossless
        if lossless:
            if drain.capture.tail_limit < 1:
                msg = "a lossless stream needs max_output of at least 2 bytes"
                raise ValueError(msg)
            drain._holders.add(self)

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> bytes:
        drain = self._drain
        while True:
            self.offset, data, skipped = drain.capture.read_from(self.offset)
            self.skipped += skipped
            if data:
                if self.lossless:
                    drain._advanced()
                await trio.lowlevel.checkpoint()
                return data
            if drain.done.is_set() and self.offset >= drain.capture.total:
                self.close()
                raise StopAsyncIteration
            await drain.wait_changed()

    def close(self) -> None:
        """Stop following; a lossless stream stops holding the drain back."""
        if self.lossless:
            self._drain._holders.discard(self)
            self._drain._advanced()
            self.lossless = False

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ChunkStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class LineStream:
    """An async iterator over text lines (newline kept), decoded incrementally
    so a character split across chunks comes out whole.

    A line still open is kept as a list of pieces, joined once its newline
    (or the end) comes: a long line arriving in many small chunks (a
    progress bar redrawn with carriage returns) costs its length, not its
    length times the number of chunks. A line that reaches `max_line`
    characters and goes on is yielded in pieces of `max_line` characters
    (only the last with the newline), so memory stays bounded whatever the
    command writes."""

    def __init__(self, chunks: AsyncIterator[bytes], encoding: str, errors: str, max_line: int) -> None:
        self._chunks = chunks
        self._decoder = codecs.getincrementaldecoder(encoding)(errors=errors)
        self._max_line = max(1, max_line)
        self._parts: list[str] = []  # the line still open
        self._open = 0  # characters in _parts
        self._ready: deque[str] = deque()
        self._finished = False

    def __aiter__(self) -> LineStream:
        return self

    async def __anext__(self) -> str:
        while not self._ready:
            if self._finished:
                raise StopAsyncIteration
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._finished = True
                self._take(self._decoder.decode(b"", final=True))
                if self._open:
                    self._flush()
                continue
            self._take(self._decoder.decode(chunk))
        return self._ready.popleft()

    def _take(self, text: str) -> None:
        pieces = text.split("\n")
        last = pieces.pop()  # the line left open
        if pieces:
            self._extend(pieces[0])
            self._end_line()
            if len(text) < self._max_line or max(map(len, pieces)) < self._max_line:
                self._ready.extend(line + "\n" for line in itertools.islice(pieces, 1, None))
            else:
                for line in itertools.islice(pieces, 1, None):
                    self._extend(line)
                    self._end_line()
        self._extend(last)

    def _flush(self) -> None:
        """Yield the open line (or piece) as it is, and start a new one."""
        self._ready.append("".join(self._parts))
        self._parts, self._open = [], 0

    def _end_line(self) -> None:
        self._parts.append("\n")
        self._flush()

    def _extend(self, text: str) -> None:
        """Add `text` (no newline) to the open line, yielding full pieces."""
        while text:
            if self._open >= self._max_line:
                self._flush()
            piece = text[: self._max_line - self._open]
            self._parts.append(piece)
            self._open += len(piece)
            text = text[len(piece) :]


def lines(
    chunks: AsyncIterator[bytes], encoding: str, errors: str, max_line: int = DEFAULT_MAX_OUTPUT
) -> LineStream:
    """Split a byte stream into text lines; see LineStream."""
    return LineStream(chunks, encoding, errors, max_line)
