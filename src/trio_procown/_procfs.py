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
# command has a pid allocated after its leader's, and the mark sits just
# below the leader (mark_of): they are in (mark.last_pid, now.last_pid],
# or, if the counter wrapped once, in (mark.last_pid, pid_max) plus
# [1, now.last_pid]. last_pid is the newest pid allocated in our namespace
# (/proc/loadavg). Lapping the mark would need more allocations than there
# are free pids; the kernel's clone counter (/proc/stat "processes"), read
# before the spawn, bounds the allocations since the mark, so the
# narrow ranges are used only while 4 x clones + 3 x (tasks + clones) <
# pid_max - 300 (see ranges_since): then they provably hold every
# descendant. Otherwise, or without a mark, the scan
# is full. A narrow range of at most DIRECT_PROBE_MAX pids is probed pid by
# pid; a wider one means a busy machine, and goes to the shared full scan.
# The newest mark read (_NEWEST) decides that without another read when it
# already shows more clones since the command's mark than such a range can
# hold: 2,000 teardowns together would otherwise each read /proc/stat and
# /proc/loadavg (~0.1 ms on a loaded machine) only to learn that.
#
# When no pid at all has been allocated since the command's leader (last_pid
# in /proc/loadavg is still the leader's pid, which the teardown holds
# unreaped, so the counter cannot have come back to it), the command has
# started nothing: the table is empty without a probe (quiet_since; one
# read of /proc/loadavg, 1-3 us through a kept descriptor (_reread),
# against ~25-60 us for a mark and the probes of its range). The same read
# refreshes the newest mark for the next spawn.
#
# A full scan is shared. When many commands are torn down together (2,000
# cancelled by one scope, 10,000 processes), each teardown would otherwise
# read the whole process table several times, and walk every row of it for
# its own questions: quadratic work, all of it on the event loop (issue 16:
# 65-230 s for 2,000 commands, stalls of a minute). So:
#
# - Full scans go through a per-run coalescer. A round runs in a system task
#   of its own (a requester's cancel scope firing never leaves the others
#   without a table); it yields once so that every teardown asking in the
#   same scheduling batch joins, then scans. One round scans at a time:
#   requests made while a scan runs join the next round, which begins when
#   that scan ends. A round always *starts* after each of its requests was
#   made, so a shared table is never older than the question it answers.
# - In a burst (_mass.in_burst) a round waits to start while teardowns are
#   still expected to ask (_gather, at most GATHER_MAX): 2,000 teardowns
#   asking over ~2 s made 4-5 rounds of ~0.2 s of loop each.
# - Where the spawner is loaded (_placement), a round's scan and its
#   environment reads run in a worker thread, in C (procown_scan in
#   _shim/spawn_into.c), holding no interpreter lock: the loop goes on
#   meanwhile, and the thread's Python part only parses the result. Else
#   the scan and the environment reads yield to the event loop every
#   SCAN_SLICE seconds instead of holding it for the whole table. (Never
#   a Python scan in a thread: measured, with 2,000 teardowns over 10,000
#   processes it contended with the loop for the interpreter lock, and
#   every block ran past its bound, against none on the loop.)
# - A table answers each question from an index, not by walking its rows:
#   members by process group (Rows.in_group), census hits by token (each
#   live process's environment read once per table, newest first, only as
#   far back as the oldest command asking; the round reads them before it
#   hands the table out).
# - A teardown past its deadline may not wait for a round: table_since
#   gives it the newest full table begun after its question, or scans once
#   for all those starved in the same batch.
#
# Non-Linux platforms fall back to psutil for everything.

from __future__ import annotations

import errno
import functools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import trio

from . import _clock, _mass

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


# The counters read around every spawn and exit (/proc/loadavg, /proc/stat)
# are read through descriptors kept open: a pread at offset 0 makes the
# kernel write the file anew, and saves the open and close (in the teardown
# of a command that exits at once, the read of /proc/loadavg cost 13 us
# with them, measured; 0.5 us against 1.7 us back to back). A kept
# descriptor that someone else closed (a closerange after a fork) may now be
# another file's: pread moves no file offset, a pipe or socket refuses it,
# and what it returns must pass the caller's parse; on any failure the file
# is opened anew, and the old number, no longer known to be ours, is left
# alone (never closed).
_KEPT: dict[str, int] = {}
_KEPT_LOCK = threading.Lock()


def _reread(path: str, check: Callable[[bytes], Any]) -> Any:
    """check(contents of `path`), read through a kept descriptor; read
    again through a fresh one when that fails in any way (OSError,
    ValueError or IndexError from `check` or the read)."""
    fd = _KEPT.get(path)
    if fd is not None:
        try:
            return check(os.pread(fd, 65536, 0))
        except (OSError, ValueError, IndexError):
            pass
    fresh = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        result = check(os.pread(fresh, 65536, 0))
    except BaseException:
        os.close(fresh)
        raise
    with _KEPT_LOCK:
        if _KEPT.get(path) == fd:
            _KEPT[path] = fresh
            return result
    os.close(fresh)  # another thread kept its own meanwhile
    return result


def _loadavg(raw: bytes) -> tuple[int, int]:
    """(last_pid, tasks) from /proc/loadavg: "0.14 0.23 0.10 1/86 3557"."""
    load = raw.split()
    if len(load) != 5:
        raise ValueError("not /proc/loadavg")
    return int(load[4]), int(load[3].split(b"/")[1])


def _forks(raw: bytes) -> int:
    """The clone counter ("processes") from /proc/stat."""
    at = raw.index(b"\nprocesses ") + 11
    return int(raw[at : raw.index(b"\n", at)])


# The newest mark read in this process (see the module comment).
_NEWEST: list[PidMark] = []

# A clone count read from /proc/stat this recently serves a new mark with a
# fresh pid counter (spawn_mark), and when it was read (time.perf_counter()).
FORKS_REUSE = 1.0
_FORKS_AT = [-math.inf]


def pid_mark() -> PidMark | None:
    """A mark to take just before a spawn; None where it cannot be read."""
    if not IS_LINUX:
        return None
    try:
        last_pid, tasks = _reread("/proc/loadavg", _loadavg)
        mark = PidMark(last_pid=last_pid, forks=_reread("/proc/stat", _forks), tasks=tasks)
    except (OSError, ValueError, IndexError):
        return None
    _remember(mark)
    _FORKS_AT[0] = time.perf_counter()
    return mark


def _fresh_pid(forks: int) -> PidMark | None:
    """A mark of the pid counter read now, with the clone count `forks`
    read earlier (see quiet_since); None where /proc/loadavg cannot be
    read."""
    try:
        last_pid, tasks = _reread("/proc/loadavg", _loadavg)
    except (OSError, ValueError, IndexError):
        return None
    return PidMark(last_pid=last_pid, forks=forks, tasks=tasks)


def _remember(mark: PidMark) -> None:
    """Make `mark` the newest mark read in this process."""
    _NEWEST[:] = [mark]


def quiet_since(mark: PidMark | None, pid: int) -> bool:
    """True if no pid has been allocated in our namespace since `pid`, a
    process of ours the caller holds unreaped (so its pid cannot be handed
    out again): then nothing was started after it. One read of
    /proc/loadavg. It also refreshes the newest mark, keeping `mark`'s
    clone count (`mark` was read before `pid` was allocated): a clone count
    read earlier only widens the bound on what was allocated since (see
    ranges_since), so the mark is sound for a later spawn.

    Like the narrow ranges, this trusts the kernel's pid counter: a process
    with CAP_SYS_ADMIN over our pid namespace that rewrote ns_last_pid, or
    chose its own pid (clone3's set_tid; both are for checkpoint/restore),
    could make either of them miss processes."""
    if not IS_LINUX or mark is None or pid <= 0:
        return False
    fresh = _fresh_pid(mark.forks)
    if fresh is None or fresh.last_pid != pid:
        return False
    _remember(fresh)
    return True


def spawn_mark() -> PidMark | None:
    """The basis of the mark of a spawn about to happen (see mark_of): the
    newest mark read in this process while its clone count is at most
    FORKS_REUSE old, without reading anything; else a fresh mark.

    The pid counter need not be read before the spawn: the leader's own pid,
    known once it is cloned, marks where the command's pids begin (every
    descendant's pid is allocated after it), so mark_of puts the mark just
    below it. Only the clone count, which bounds the allocations since the
    mark, must come from before the spawn: a count read earlier counts some
    clones more and only widens that bound, as does the number of tasks read
    with it (every task now existed then or was cloned since). The clone
    count's file costs the most to read (/proc/stat: 68 us in place for a
    spawn after 50 ms idle, measured, against ~10 us for /proc/loadavg), so
    a count at most FORKS_REUSE old is kept; older, both are read afresh.
    Reading /proc/loadavg before the spawn cost a spawn-and-wait of
    /bin/true 20-30 us in a mix of other work, where its caches were cold.
    """
    newest = _NEWEST[0] if _NEWEST else None
    if newest is None or time.perf_counter() - _FORKS_AT[0] > FORKS_REUSE:
        return pid_mark()
    return newest


def mark_of(basis: PidMark | None, leader: int) -> PidMark | None:
    """The mark of a spawn whose leader got pid `leader`, from the `basis`
    spawn_mark gave before it: the pid counter just below the leader, the
    basis's clone and task counts (see spawn_mark)."""
    if basis is None:
        return None
    return PidMark(last_pid=leader - 1, forks=basis.forks, tasks=basis.tasks)


def surely_wide(mark: PidMark | None) -> bool:
    """Without reading anything: has the machine made more clones since
    `mark` than a narrow range (DIRECT_PROBE_MAX pids) would hold? Clones
    only grow. A clone in a pid namespace outside ours allocates no pid
    here, so the answer may be yes where the range is narrow: the caller
    then takes a full scan, which holds whatever a narrow one would."""
    newest = _NEWEST[0] if _NEWEST else None
    return mark is not None and newest is not None and newest.forks - mark.forks > DIRECT_PROBE_MAX


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


class ProcInfo(NamedTuple):
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
    pidfd_open() tells them apart (it refuses a thread that leads no group)
    in ~2-7 µs, where /proc/PID/status, which the kernel writes out whole,
    costs ~15-40 µs: a census probes each pid started since its command's
    spawn, ten or more a command while others run. Where no pidfd can be
    had (EMFILE, a seccomp filter, no pidfd_open), the status is read.
    """
    try:
        os.close(os.pidfd_open(pid))
        return True
    except ProcessLookupError:
        return False  # no such process (nor thread)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL):
            return False  # a thread, not its group's leader
    except AttributeError:  # no os.pidfd_open
        pass
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError):
        return False
    return False


# The leaders of this process's owned commands, held unreaped by their
# teardowns through their pidfds (pid -> pidfd). Many commands at once (an
# agent's tools, a build: 20 at a time) allocate pids mostly to one
# another's leaders, and a census probed each of them (a pidfd_open and a
# read of its stat, ~15-25 us; in the cgroup domain, of its environment
# too) only to learn it is another command's: not in this command's
# process group (it leads a session of its own), not in its cgroup, and
# without its census cookie (the owner spawned it, with that command's
# own token). The command's own leader is no better: no census, member
# list or emptiness check asks for its row. So a census's table leaves out
# a pid held here, after one waitid() on its pidfd (~1-2 us) that shows the
# process still ours to reap: running, or exited and not yet reaped, so the
# pid is still its own. Reaped by someone else (SIGCHLD ignored, a wait
# for any child), its pid may be another process's already: probed as any
# other. Entries leave before the reap and before their pidfd is closed,
# under the lock the check holds (another thread may run a trio loop of
# its own, and close a pidfd while this one checks).
_HELD: dict[int, int] = {}
_HELD_LOCK = threading.Lock()


def hold(pid: int, pidfd: int) -> None:
    """`pid` is a leader of ours, held unreaped through `pidfd` (see _HELD)."""
    with _HELD_LOCK:
        _HELD[pid] = pidfd


def release_held(pid: int) -> None:
    """`pid` is about to be reaped, or its pidfd closed: no longer held."""
    with _HELD_LOCK:
        _HELD.pop(pid, None)


def held(pid: int) -> bool:
    """Is `pid` an owned command's leader, still ours to reap?"""
    if pid not in _HELD:
        return False
    with _HELD_LOCK:
        fd = _HELD.get(pid)
        if fd is None:
            return False
        try:
            os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except OSError:  # ECHILD: reaped by someone else; EBADF, EINVAL: cannot tell
            return False
        return True


def _forget_held_after_fork() -> None:
    # A forked child reaps none of them (they are not its children), and a
    # lock held by another thread at the fork would never be released. (The
    # kept descriptors of _reread stay: a pread through them is the child's
    # as much as ours.)
    global _HELD_LOCK, _KEPT_LOCK
    _HELD_LOCK = threading.Lock()
    _KEPT_LOCK = threading.Lock()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_held_after_fork)


def candidate_pids(ranges: list[tuple[int, int]] | None, *, census: bool = False) -> Iterator[int]:
    """Pids in `ranges` (see ranges_since), or every pid when None. A narrow
    range is probed pid by pid instead of listing /proc. For a census's
    table (`census`), the leaders held unreaped by this process's commands
    are left out (see _HELD): that command's own, whose row no census,
    member list or emptiness check asks for, and the others', which can be
    neither its members nor its escapees. Any other caller (the pytest
    plugin's cookie scan, which must see a leaked command's leader) gets
    every process."""
    if ranges is None:
        return _all_pids()
    if width(ranges) <= DIRECT_PROBE_MAX:
        if census:
            return (p for lo, hi in ranges for p in range(lo, hi + 1) if not held(p) and is_process(p))
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


def snapshot(mark: PidMark | None) -> Rows:
    """The processes that may descend from a command spawned after `mark`,
    zombies included (narrowed as the module comment explains)."""
    return _snapshot(ranges_since(mark))


def _snapshot(ranges: list[tuple[int, int]] | None, *, census: bool = False) -> Rows:
    if ranges is None:
        native = native_table(None, 0)
        if native is not None:
            return native.rows
    if IS_LINUX:
        rows = Rows()
        for pid in candidate_pids(ranges, census=census):
            info = read_stat(pid)
            if info is not None:
                rows.append(info)
        return rows
    return Rows(_psutil_rows())


async def _snapshot_in_slices(urgent: Callable[[], bool] = lambda: False) -> Rows:
    """A full scan (as _snapshot(None)) that yields to the event loop every
    SCAN_SLICE seconds (longer slices when it is starved: see SCAN_SHARE;
    SCAN_SLICE_URGENT while `urgent()` says most of the loop waits for it)."""
    if not IS_LINUX:
        return _snapshot(None)
    rows = Rows()
    span = SCAN_SLICE
    # The listing itself is read as it goes (getdents fills a buffer at a
    # time): listing 10,000 processes at once held the loop for ~50 ms.
    with os.scandir("/proc") as entries:
        listing = iter(entries)
        more = True
        while more:
            until = time.perf_counter() + span
            while time.perf_counter() < until:
                entry = next(listing, None)
                if entry is None:
                    more = False
                    break
                if entry.name.isdigit():
                    info = read_stat(int(entry.name))
                    if info is not None:
                        rows.append(info)
            if more:
                paused = time.perf_counter()
                await trio.lowlevel.checkpoint()
                waited = time.perf_counter() - paused
                span = min(SCAN_SLICE_MAX, max(SCAN_SLICE, waited * SCAN_SHARE))
                if urgent():
                    span = SCAN_SLICE_URGENT
    return rows


# Full scans go through the spawner's C scanner where one is loaded (tests
# that inject faults into the Python readers turn it off).
NATIVE_SCAN = True
# The native scan's output buffer: grown (and kept) when a scan did not fit.
_NATIVE_CAP = [1 << 18]
_NATIVE_CAP_MAX = 1 << 30


def native_table(key: bytes | None, started_since: int, started: float = -math.inf) -> ProcessTable | None:
    """A full scan by the spawner's C scanner (procown_scan), with `key`'s
    entries read for rows started at or after `started_since` (as
    read_environs would); None where no spawner is loaded or the scan
    failed (the caller scans in Python). Holds no interpreter lock while it
    reads: for a worker thread."""
    scan = _placement_scanner()
    if scan is None:
        return None
    import ctypes

    error, need = ctypes.c_int(0), ctypes.c_long(0)
    for _ in range(3):  # the table may grow between two scans
        cap = _NATIVE_CAP[0]
        out = ctypes.create_string_buffer(cap)
        args = (key, len(key or b""), started_since, os.getpid(), EXEC_RETRIES)
        n = scan(out, cap, *args, ctypes.byref(error), ctypes.byref(need))
        if n != -2:
            break
        _NATIVE_CAP[0] = min(_NATIVE_CAP_MAX, max(2 * cap, need.value + need.value // 4))
    if n < 0:
        return None
    return _parse_native(ctypes.string_at(out, n), key, started_since, started)


def _parse_native(raw: bytes, key: bytes | None, started_since: int, started: float) -> ProcessTable:
    parts = raw.split(b"\0")
    rows = Rows()
    entries: dict[int, bytes] = {}
    unreadable: set[int] = set()
    i, end = 0, len(parts) - 1  # the last part is what follows the final NUL
    while i < end:
        pid_s, ppid, pgrp, state, start, flag = parts[i].split(b" ")
        pid = int(pid_s)
        rows.append(ProcInfo(pid, int(ppid), int(pgrp), state.decode(), int(start)))
        i += 1
        if flag == b"e":
            entries[pid] = parts[i]
            i += 1
        elif flag == b"u":
            unreadable.add(pid)
    table = ProcessTable(rows, started)
    if key is not None:
        table._index(key).read_ahead(started_since, entries, unreadable)
    return table


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


class Rows(list[ProcInfo]):
    """The rows of one scan, with a lazily built index by process group (a
    domain asking for its group's members then costs its members, not the
    whole table: 2,000 teardowns sharing one scan of 10,000 rows would
    otherwise walk all of them each)."""

    _by_pgrp: dict[int, list[ProcInfo]] | None = None

    def in_group(self, pgrp: int) -> list[ProcInfo]:
        """The rows whose process group is `pgrp`, in table order."""
        if self._by_pgrp is None:
            index: dict[int, list[ProcInfo]] = {}
            for info in self:
                index.setdefault(info.pgrp, []).append(info)
            self._by_pgrp = index
        return list(self._by_pgrp.get(pgrp, ()))


class _CookieIndex:
    """Census tokens -> the live rows whose environment carries them, for
    one environment variable: each row's environment is read at most once,
    however many teardowns ask. Built newest process first, only as far back
    as the oldest start time asked about (a descendant cannot be older than
    its command's leader), so a lone teardown reads only recent processes."""

    def __init__(self, key: bytes, rows: list[ProcInfo]) -> None:
        self.key = key
        me = os.getpid()
        # Start 0 (unknown) sorts first: such rows are always read.
        self._todo = sorted(
            (r for r in rows if not r.zombie and r.pid != me),
            key=lambda r: -r.start if r.start else -(1 << 62),
        )
        self._next = 0
        self.tokens: dict[bytes, list[ProcInfo]] = {}
        self.unreadable: list[ProcInfo] = []

    def covered(self, started_since: int) -> bool:
        """Has every row started at or after `started_since` been read?"""
        if self._next >= len(self._todo):
            return True
        start = self._todo[self._next].start
        return bool(start) and start < started_since

    def read_one(self) -> None:
        info = self._todo[self._next]
        self._next += 1
        unreadable: set[int] = set()
        entry = environ_entry(info.pid, self.key, unreadable)
        self._record(info, entry, bool(unreadable))

    def read_ahead(self, started_since: int, entries: dict[int, bytes], unreadable: set[int]) -> None:
        """Take the reads a native scan made (procown_scan: every row started
        at or after `started_since`, in this index's order) as this
        index's own."""
        while not self.covered(started_since):
            info = self._todo[self._next]
            self._next += 1
            self._record(info, entries.get(info.pid), info.pid in unreadable)

    def _record(self, info: ProcInfo, entry: bytes | None, unreadable: bool) -> None:
        if unreadable:
            self.unreadable.append(info)
        if entry is not None and entry.startswith(self.key):
            for token in set(entry[len(self.key) :].split(b":")):
                self.tokens.setdefault(token, []).append(info)


# A long synchronous stretch of scanning yields to the event loop after this
# long, so that other tasks (and the loop's I/O) are never held up much
# longer than that by a scan.
SCAN_SLICE = 0.004
# ... unless the scan is starved: a full scan gets one slice per turn of the
# loop, and when 2,000 teardowns are busy a turn lasts 50-400 ms, so at 4 ms
# a turn a scan of 10,000 processes took 1.5-2.5 s and the teardowns waiting
# for it ran past their deadlines. A scan that waited W for its turn scans
# for SCAN_SHARE * W (at least SCAN_SLICE, at most SCAN_SLICE_MAX): as long
# as the rest of the batch, so a scan gets half of a busy loop. With a
# quarter, capped at 15 ms (under the 20 ms stall the project aims for), a
# round of 10,000 rows took 0.7-1.3 s while the burst's teardowns queued
# behind it, and 2,000 blocks ran past their bound; the price of 50 ms is
# a longer stall (measured: docs/chaos.md, Scaling).
SCAN_SHARE = 1.0
SCAN_SLICE_MAX = 0.05
# ... and while at least half the teardowns under way wait for this scan or
# the next (a burst whose every teardown needs a table: small slices then
# only made them all wait longer; measured, a round of 10,000 rows took
# 1.0-1.2 s on a busy loop while ~1,990 teardowns queued for the next one).
SCAN_SLICE_URGENT = 0.05
# A shared table is handed to at most this many waiting teardowns per turn
# of the loop (see _Coalescer._scan).
WAKE_CHUNK = 32


class ProcessTable:
    """One scan of the process table, with lazily built indexes."""

    def __init__(self, rows: list[ProcInfo], started: float = -math.inf) -> None:
        self.rows = rows if isinstance(rows, Rows) else Rows(rows)
        self.started = started  # teardown time (_clock.py) when the scan began (-inf: unknown)
        self._cookies: dict[bytes, _CookieIndex] = {}

    def _index(self, key: bytes) -> _CookieIndex:
        index = self._cookies.get(key)
        if index is None:
            index = self._cookies[key] = _CookieIndex(key, self.rows)
        return index

    async def read_environs(self, key: bytes, started_since: int = 0) -> None:
        """Read the environments `carrying` will need, yielding to the event
        loop every SCAN_SLICE seconds (a table of 10,000 rows takes
        hundreds of milliseconds to read)."""
        index = self._index(key)
        while not index.covered(started_since):
            await trio.lowlevel.checkpoint()
            until = time.perf_counter() + SCAN_SLICE
            while not index.covered(started_since) and time.perf_counter() < until:
                index.read_one()

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
        since boot, as in /proc/PID/stat) count: a descendant cannot be
        older than its ancestor. Rows in process group `skip` are left out
        (the caller knows they are inside its domain). Pids whose
        environment we may not read (another user's, a setuid program's)
        are added to `unreadable`: the census cannot see them.
        """
        if not self.rows:
            return []  # (a quiet table, see quiet_since: nothing to index)
        index = self._index(key)
        while not index.covered(started_since):
            index.read_one()

        def counts(info: ProcInfo) -> bool:
            return info.pgrp != skip and not (info.start and info.start < started_since)

        if unreadable is not None:
            unreadable.update(info.pid for info in index.unreadable if counts(info))
        return [info for info in index.tokens.get(token, ()) if counts(info)]


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
        self.done = trio.Event()  # the round is over (its requesters were all handed the table)
        self.waiting = trio.lowlevel.ParkingLot()  # its requesters
        self.table: ProcessTable | None = None
        self.error: BaseException | None = None
        # Environments to read before the table is handed out: key -> the
        # oldest start time a requester will ask about.
        self.environs: dict[bytes, int] = {}


# In a burst (_mass.in_burst), a round waits to start until every teardown
# expected (under way, or asked for and about to begin) is waiting for it,
# or GATHER_MAX has passed. Each round reads the whole table (~0.25 s of
# the loop for 10,000 processes); 2,000 teardowns asking over ~2 s made 4-5
# rounds.
GATHER_MAX = 0.25
# ... and, while signals of the burst are still queued for the signaller
# thread, at most this long: the processes they reach die meanwhile (10,000
# exits keep both vCPUs busy for most of a second), and a scan made in that
# storm took 0.9-1.5 s against 0.12-0.17 s right after it, every other
# request of the burst queued behind it.
GATHER_SIGNALS_MAX = 1.5
# Once no signal is queued, a round starts as soon as no teardown has joined
# it for this long: late in a burst most teardowns under way are past their
# census (draining, writing receipts) and never ask, and the last few that
# do waited out the whole GATHER_MAX (measured: 244 stragglers of 2,000
# cgroup commands held 0.25 s, and 500 blocks went past their bound).
GATHER_QUIET = 0.03


async def _gather(this: _Round) -> None:
    from . import _signaller

    began = joined_at = _clock.now()
    joined = len(this.waiting)
    while _mass.in_burst():
        if len(this.waiting) >= _mass.expected():
            return
        now = _clock.now()
        if len(this.waiting) != joined:
            joined, joined_at = len(this.waiting), now
        waited = now - began
        if waited >= GATHER_SIGNALS_MAX:
            return
        if not _signaller.pending() and (waited >= GATHER_MAX or now - joined_at >= GATHER_QUIET):
            return
        await trio.lowlevel.checkpoint()


class _Coalescer:
    """Shares one full scan among every request made before it starts.

    The scan runs in a system task of its own, so a requester's cancel scope
    firing never leaves the others without a table. One round scans at a
    time: requests made while a scan is running join the next round, which
    starts when that scan ends (a table must be younger than every question
    it answers; two scans side by side would each cost the whole table)."""

    def __init__(self) -> None:
        self._next: _Round | None = None  # accepting requests
        self._running: _Round | None = None  # scanning
        self.latest: ProcessTable | None = None  # the newest full table

    async def table(self, cookie_key: bytes | None, started_since: int) -> ProcessTable:
        this = self._next
        if this is None:
            this = self._next = _Round()
            trio.lowlevel.spawn_system_task(self._scan, this, name="trio_procown process table scan")
        if cookie_key is not None:
            known = this.environs.get(cookie_key)
            this.environs[cookie_key] = started_since if known is None else min(known, started_since)
        await this.waiting.park()  # joined before the scan began: unparked once it is over
        if this.table is None:
            msg = f"the shared process table scan failed: {this.error!r}"
            raise RuntimeError(msg)
        return this.table

    async def _native(self, this: _Round, began: float) -> ProcessTable | None:
        """The round's table from the native scanner in the scanner's worker
        thread (_signaller.submit_scan; the loop goes on meanwhile), with
        the first cookie key's entries read; None where there is no
        scanner, no thread can be started, or the scan failed (the caller
        scans on the loop)."""
        if _placement_scanner() is None:
            return None
        from . import _signaller

        key, since = next(iter(this.environs.items()), (None, 0))
        try:
            job = _signaller.submit_scan(functools.partial(native_table, key, since, began))
        except RuntimeError:
            return None
        await job.done.wait()  # a system task's: cancelled only when the run ends
        if job.error is not None:  # not expected (a bug, or out of memory): scan in Python instead
            return None
        return job.result

    def _urgent(self) -> bool:
        """In a burst, do at least half the teardowns expected wait for a table?"""
        waiting = sum(len(r.waiting) for r in (self._running, self._next) if r is not None)
        return _mass.in_burst() and 2 * waiting >= _mass.expected()

    async def _scan(self, this: _Round) -> None:
        try:
            running = self._running
            if running is not None:
                await running.done.wait()
            # Let every teardown that asks in this batch join this round.
            await trio.lowlevel.checkpoint()
            await _gather(this)
            self._next = None
            self._running = this
            began = _clock.now()
            table = await self._native(this, began)
            if table is None:
                table = ProcessTable(await _snapshot_in_slices(self._urgent), began)
            for key, since in this.environs.items():
                await table.read_environs(key, since)
            this.table = self.latest = table
        except Exception as exc:
            this.error = exc
        finally:
            if self._next is this:
                self._next = None
            try:
                # Hand the table out WAKE_CHUNK requesters per turn of the
                # loop: each goes on with a teardown step (~0.3 ms), and
                # 2,000 woken together held the loop for 0.2-0.6 s.
                while len(this.waiting) > WAKE_CHUNK:
                    this.waiting.unpark(count=WAKE_CHUNK)
                    await trio.lowlevel.checkpoint()
            finally:
                this.waiting.unpark_all()
                if self._running is this:
                    self._running = None
                this.done.set()


def _placement_scanner() -> Any | None:
    """The spawner's scanner where one is loaded (and NATIVE_SCAN), else None."""
    placement = sys.modules.get(f"{__package__}._placement")
    if placement is None or not IS_LINUX or not NATIVE_SCAN:
        return None
    return placement.loaded_scanner()


_COALESCER: trio.lowlevel.RunVar[_Coalescer] = trio.lowlevel.RunVar("trio_procown_scans")


async def table_for(
    mark: PidMark | None, cookie_key: bytes | None = None, started_since: int = 0, known: int = 0
) -> ProcessTable:
    """A scan for the command spawned after `mark`: narrow and private when
    that is sound and cheap, otherwise a full scan shared with every
    teardown that asks before it starts. With `cookie_key`, the census
    will ask the table about that variable for processes started at or
    after `started_since`: a shared table reads those environments (once,
    for every requester) before it is handed out. `known` is the command's
    leader, unreaped (0: none): when no pid was allocated since it, the
    table is empty (quiet_since; the leader's own row is never asked for,
    by members, the census or is_empty). A narrow table leaves out every
    leader held unreaped by this process's commands (candidate_pids)."""
    if known and quiet_since(mark, known):
        return ProcessTable(Rows())  # the leader's own row is never asked for
    ranges = None if surely_wide(mark) else ranges_since(mark)
    if ranges is not None and width(ranges) <= DIRECT_PROBE_MAX:
        return ProcessTable(_snapshot(ranges, census=True))
    return await _coalescer().table(cookie_key, started_since)


def _coalescer() -> _Coalescer:
    try:
        return _COALESCER.get()
    except LookupError:
        coalescer = _Coalescer()
        _COALESCER.set(coalescer)
        return coalescer


def table_since(mark: PidMark | None, not_before: float) -> ProcessTable:
    """A table for the command spawned after `mark`, without waiting: the
    newest shared full table if its scan began at or after `not_before`
    (teardown time: when the question was asked), else a scan made now. For
    teardowns past their deadline: many of them at once then share one
    scan instead of each reading the whole process table."""
    coalescer = _coalescer()
    latest = coalescer.latest
    if latest is not None and latest.started >= not_before:
        return latest  # a full table holds whatever a narrow one would
    ranges = None if surely_wide(mark) else ranges_since(mark)
    if ranges is not None and width(ranges) <= DIRECT_PROBE_MAX:
        return ProcessTable(_snapshot(ranges, census=True))
    began = _clock.now()
    table = coalescer.latest = ProcessTable(_snapshot(None), began)
    return table


def has_token(pid: int, key: bytes, token: bytes) -> bool:
    """True if the environment variable `key` of `pid` holds the census
    `token` in its chain (environ_entry reads it through psutil off Linux)."""
    return token_in(environ_entry(pid, key), key, token)
