# Reading the process table.
#
# The teardown needs three questions answered about other processes: which
# processes belong to a process group, which carry our census cookie in their
# environment, and what their command lines are. On Linux we read /proc
# directly: psutil would answer the same questions, but a psutil.Process per
# pid costs several times more, and this runs on every command's exit.
#
# A full scan of /proc/*/stat costs about as much as a whole spawn (~0.5 ms
# for 60 processes on the project's machines), too slow for the common path.
# So a scan may be narrowed to the pids allocated *since the command was
# spawned*. Linux hands out pids cyclically upward, so every descendant of the
# command has a pid allocated after a mark taken just before the spawn: in
# (mark.last_pid, now.last_pid], or, if the counter wrapped once, in
# (mark.last_pid, pid_max) plus [1, now.last_pid]. last_pid is the newest pid
# allocated in our namespace (/proc/loadavg). Lapping the mark would need
# more allocations than there are free pids; the kernel's clone counter
# (/proc/stat "processes") bounds the allocations since the mark, so the
# narrow ranges are used only while 4 x clones + 3 x (tasks + clones) <
# pid_max - 300 (see ranges_since): then they provably hold every
# descendant. Otherwise, or without a mark, the scan
# is full. A narrow range of at most DIRECT_PROBE_MAX pids is probed pid by
# pid; a wider one means a busy machine, and goes to the shared full scan.
#
# A full scan is shared. When many commands are torn down together (500
# cancelled by one scope), each teardown would otherwise read the whole
# process table several times, and the scans alone would starve the event
# loop for seconds. Full scans therefore go through a per-run coalescer:
# the first teardown that asks yields once, so that every teardown asking in
# the same scheduling batch joins the same round, then one scan serves them
# all. A round always *starts* after each of its requests was made, so a
# shared table is never older than the question it answers. The census's
# cookie index (one environ read per live process) is built lazily, once
# per table.
#
# Non-Linux platforms fall back to psutil for everything.

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import trio

# psutil is imported where it is used: only off Linux.

IS_LINUX = sys.platform.startswith("linux")


@dataclass(frozen=True, slots=True, kw_only=True)
class PidMark:
    """Where the pid counter stood before a spawn (see the module comment).

    Keyword-only: three ints in a row are easy to pass in the wrong order.
    """

    last_pid: int  # newest pid allocated in our namespace
    forks: int  # clones since boot (/proc/stat "processes")
    tasks: int = 0  # tasks on the machine then


def _read_small(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def pid_mark() -> PidMark | None:
    """A mark to take just before a spawn; None where it cannot be read."""
    if not IS_LINUX:
        return None
    try:
        load = _read_small("/proc/loadavg").split()
        stat = _read_small("/proc/stat")
        at = stat.index(b"\nprocesses ") + 11
        forks = int(stat[at : stat.index(b"\n", at)])
        return PidMark(last_pid=int(load[4]), forks=forks, tasks=int(load[3].split(b"/")[1]))
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _pid_max() -> int | None:
    try:
        return int(_read_small("/proc/sys/kernel/pid_max"))
    except (OSError, ValueError):
        return None


def ranges_since(mark: PidMark | None) -> list[tuple[int, int]] | None:
    """Inclusive pid ranges allocated since `mark`, or None when they cannot
    be proven to hold every pid allocated since (module comment)."""
    pid_max = _pid_max()
    now = pid_mark() if mark is not None and pid_max is not None else None
    if mark is None or pid_max is None or now is None:
        return None
    # Pids allocated since the mark are at most the clones since; pids in
    # use are at most three per task (its own, and a process group and a
    # session id it may keep alive). While the allocations plus the pids in
    # use stay below pid_max - 300 (the kernel's reserved low pids), the
    # counter cannot have lapped the mark.
    clones = now.forks - mark.forks
    if 4 * clones + 3 * (mark.tasks + clones) >= pid_max - 300:
        return None
    if now.last_pid >= mark.last_pid:
        return [(mark.last_pid + 1, now.last_pid)]
    return [(mark.last_pid + 1, pid_max - 1), (1, now.last_pid)]  # wrapped once


def width(ranges: list[tuple[int, int]]) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges if hi >= lo)


# How many times an environment read is retried while the process is seen
# inside execve() (each retry yields the CPU once).
EXEC_RETRIES = 200

# A range of at most this many pids is probed pid by pid, which is cheaper
# than listing /proc.
DIRECT_PROBE_MAX = 64


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One row of the process table, as far as the teardown cares."""

    pid: int
    ppid: int
    pgrp: int
    state: str  # single letter as in /proc/PID/stat; "Z" is a zombie
    start: int = 0  # start time in clock ticks since boot (0: unknown)

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def _all_pids() -> Iterator[int]:
    return (int(n) for n in os.listdir("/proc") if n.isdigit())


def is_process(pid: int) -> bool:
    """True if `pid` is a thread-group leader (a process), not a thread.

    /proc lists only processes, but /proc/TID opens for any thread too.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError):
        return False
    return False


def candidate_pids(ranges: list[tuple[int, int]] | None) -> Iterator[int]:
    """Pids in `ranges` (see ranges_since), or every pid when None. A narrow
    range is probed pid by pid instead of listing /proc."""
    if ranges is None:
        return _all_pids()
    if width(ranges) <= DIRECT_PROBE_MAX:
        return (p for lo, hi in ranges for p in range(lo, hi + 1) if is_process(p))
    return (p for p in _all_pids() if any(lo <= p <= hi for lo, hi in ranges))


def read_stat(pid: int) -> ProcInfo | None:
    """Parse /proc/PID/stat; None if the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name is in parentheses and may itself contain ") ".
    fields = raw.rpartition(b") ")[2].split(b" ", 20)
    try:
        return ProcInfo(pid, int(fields[1]), int(fields[2]), fields[0].decode(), int(fields[19]))
    except (IndexError, ValueError):
        return None


def process_info(pid: int) -> ProcInfo | None:
    """`pid`'s row of the process table on any platform; None if it is gone.

    On Linux this is read_stat. Elsewhere psutil answers, and `start` is the
    creation time in microseconds since the epoch (still a stable identity
    for one pid), the process group 0 when it cannot be read.
    """
    if IS_LINUX:
        return read_stat(pid)
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            zombie = proc.status() == psutil.STATUS_ZOMBIE
            ppid, start = proc.ppid(), int(proc.create_time() * 1_000_000)
    except (psutil.Error, OSError):
        return None
    try:
        pgrp = os.getpgid(pid)
    except OSError:
        pgrp = 0
    return ProcInfo(pid, ppid, pgrp, "Z" if zombie else "S", start)


def cmdline(pid: int) -> str:
    """The command line of `pid` as one string, or "" when unreadable."""
    if IS_LINUX:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            return ""
        if raw:
            return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        info = read_stat(pid)
        return f"[{pid}]" if info is None else ""
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return ""


def snapshot(mark: PidMark | None) -> list[ProcInfo]:
    """The processes that may descend from a command spawned after `mark`,
    zombies included (narrowed as the module comment explains)."""
    return _snapshot(ranges_since(mark))


def _snapshot(ranges: list[tuple[int, int]] | None) -> list[ProcInfo]:
    if IS_LINUX:
        rows = []
        for pid in candidate_pids(ranges):
            info = read_stat(pid)
            if info is not None:
                rows.append(info)
        return rows
    return _psutil_rows()


def _psutil_rows() -> list[ProcInfo]:
    import psutil

    rows = []
    for proc in psutil.process_iter(["pid", "ppid", "status"]):
        try:
            zombie = proc.info["status"] == psutil.STATUS_ZOMBIE
            rows.append(ProcInfo(proc.pid, proc.info["ppid"], os.getpgid(proc.pid), "Z" if zombie else "S"))
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return rows


class ProcessTable:
    """One scan of the process table, with lazily built indexes."""

    def __init__(self, rows: list[ProcInfo]) -> None:
        self.rows = rows
        # (key, pid) -> that process's KEY=VALUE entry, read at most once per
        # table however many teardowns share it.
        self._entries: dict[tuple[bytes, int], bytes | None] = {}
        self._unreadable: set[int] = set()

    def carrying(
        self,
        key: bytes,
        token: bytes,
        started_since: int = 0,
        skip: int = -1,
        unreadable: set[int] | None = None,
    ) -> list[ProcInfo]:
        """Live rows whose environment variable `key` (ending with "=")
        holds `token` in its ":"-separated chain of census tokens.

        Only processes started at or after `started_since` (clock ticks
        since boot, as in /proc/PID/stat) are read: a descendant cannot be
        older than its ancestor. Rows in process group `skip` are not read
        either (the caller knows they are inside its domain). Pids whose
        environment we may not read (another user's, a setuid program's)
        are added to `unreadable`: the census cannot see them.
        """
        me = os.getpid()
        found = []
        for info in self.rows:
            if info.zombie or info.pid == me or info.pgrp == skip:
                continue
            if info.start and info.start < started_since:
                continue
            cached = (key, info.pid)
            value = self._entries.get(cached, False)
            if value is False:
                value = self._entries[cached] = environ_entry(info.pid, key, self._unreadable)
            if info.pid in self._unreadable and unreadable is not None:
                unreadable.add(info.pid)
            if isinstance(value, bytes) and token_in(value, key, token):
                found.append(info)
        return found


def token_in(entry: bytes | None, key: bytes, token: bytes) -> bool:
    """Does the KEY=VALUE `entry` hold `token` in its ":"-separated chain?

    Owners nest (a command that itself owns commands): each adds its token
    to the chain it inherited, so every enclosing owner still finds what
    its command started.
    """
    if entry is None or not entry.startswith(key):
        return False
    return token in entry[len(key) :].split(b":")


def read_environ(pid: int, unreadable: set[int] | None = None) -> bytes | None:
    """The environment block of `pid`; None when it cannot be read (and
    `pid` is added to `unreadable` when that is for lack of permission)."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if unreadable is not None and isinstance(exc, PermissionError):
            unreadable.add(pid)
        return None
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            if len(chunk) < 65536:
                break
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


_PF_KTHREAD = 0x00200000


def exec_in_progress(pid: int) -> bool:
    """After an empty read of its environment: may `pid` still have one?

    True while it is in the middle of execve() (env_start, field 50 of
    /proc/PID/stat, still 0) and when env_start..env_end is not empty (the
    environment arrived since our read). False for zombies and kernel
    threads (no memory at all), for a process whose environment really is
    empty (env_start == env_end), and for one that is gone.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b") ")[2].split()
        if fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_KTHREAD:
            return False
        if len(fields) < 49:  # kernels before 3.5 do not show the addresses
            return True
        env_start, env_end = int(fields[47]), int(fields[48])
        return env_start == 0 or env_end > env_start
    except (OSError, ValueError, IndexError):
        return False


def environ_entry(pid: int, key: bytes, unreadable: set[int] | None = None) -> bytes | None:
    """The whole KEY=VALUE entry of `pid`'s environment for `key` (which
    ends with "="), or None. A pid whose environment we may not read is
    added to `unreadable`."""
    if not IS_LINUX:
        import psutil

        name = key[:-1].decode()
        try:
            value = psutil.Process(pid).environ().get(name)
        except psutil.AccessDenied:
            if unreadable is not None:
                unreadable.add(pid)
            return None
        except (psutil.Error, OSError):
            return None
        return None if value is None else key + value.encode()
    env = read_environ(pid, unreadable)
    # A process caught inside execve() shows an empty environment until the
    # new image's is in place: look again, a bounded number of times.
    for _ in range(EXEC_RETRIES):
        if env or not exec_in_progress(pid):
            break
        os.sched_yield()
        env = read_environ(pid)
    if not env:
        return None
    if env.startswith(key):
        start = 0
    else:
        start = env.find(b"\0" + key)
        if start < 0:
            return None
        start += 1
    end = env.find(b"\0", start)
    return env[start:] if end < 0 else env[start:end]


class _Round:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.table: ProcessTable | None = None


class _Coalescer:
    """Shares one full scan among the requests of one scheduling batch."""

    def __init__(self) -> None:
        self._next: _Round | None = None

    async def table(self) -> ProcessTable:
        joined = self._next
        if joined is not None:
            await joined.done.wait()
            assert joined.table is not None
            return joined.table
        this = self._next = _Round()
        try:
            # Let every teardown that asks in this batch join this round.
            await trio.lowlevel.checkpoint()
        finally:
            self._next = None
            this.table = ProcessTable(_snapshot(None))
            this.done.set()
        return this.table


_COALESCER: trio.lowlevel.RunVar[_Coalescer] = trio.lowlevel.RunVar("trio_procown_scans")


async def table_for(mark: PidMark | None) -> ProcessTable:
    """A scan for the command spawned after `mark`: narrow and private when
    that is sound and cheap, otherwise a full scan shared with the other
    teardowns of this scheduling batch."""
    ranges = ranges_since(mark)
    if ranges is not None and width(ranges) <= DIRECT_PROBE_MAX:
        return ProcessTable(_snapshot(ranges))
    try:
        coalescer = _COALESCER.get()
    except LookupError:
        coalescer = _Coalescer()
        _COALESCER.set(coalescer)
    return await coalescer.table()


def has_token(pid: int, key: bytes, token: bytes) -> bool:
    """True if the environment variable `key` of `pid` holds the census
    `token` in its chain (environ_entry reads it through psutil off Linux)."""
    return token_in(environ_entry(pid, key), key, token)
