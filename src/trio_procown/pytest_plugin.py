# pytest plugin: fail (or warn about) tests that leave processes running.
#
# Activation. Registered through the `pytest11` entry point and inactive until
# asked for: `--procown-leaks=fail|warn|off`, the ini option `procown_leaks`,
# or `@pytest.mark.procown_leaks("fail")` on a test, class or module. The
# marker (most specific) wins over the command line, which wins over the ini
# file. With everything off, a test costs one marker lookup.
#
# Watch windows. An active test gets a *window*, open from the start of its
# setup to the end of its teardown. Everything the pytest process starts in
# the window is tracked by three mechanisms at once (each catches something
# the others miss); after the teardown, what is still alive is a leak:
#
# 1. cgroup (Linux, cgroup v2, a writable cgroup: the same condition as the
#    library's cgroup domain). Children spawned by arbitrary code cannot be
#    put into a cgroup one by one: nothing runs between their fork and their
#    first fork of their own, and putting them there afterwards loses the
#    race. They need not be: a process is born in its parent's cgroup. So the
#    window creates a child cgroup of the one the runner is in and moves *the
#    runner itself* into it for the duration of the test, and back afterwards.
#    Every process forked meanwhile (subprocess, trio, os.fork,
#    multiprocessing, C code, any thread) is born in the window's cgroup and
#    stays there through setsid(), double forks and scrubbed environments.
#    Moving is a write of our pid to cgroup.procs; it needs write access to
#    the runner's cgroup and costs ~0.05 ms. What moving the runner changes:
#    the runner's memory stays charged where it was, and the limits of every
#    ancestor still apply. After the runner has left, "populated 0" in
#    cgroup.events proves that nothing forked in the window is alive.
#    Caveats: a process that moves itself to another cgroup (owned commands
#    of this library under the cgroup domain, systemd-run, containers) is no
#    longer seen by it; the library caches "our own cgroup" on first use, so
#    we prime that cache before the first move (else owned commands would be
#    created under a window's cgroup after it is gone).
# 2. cookie: TRIO_PROCOWN_TEST_COOKIE is set in os.environ for the window, so
#    every process exec'd meanwhile inherits it, and so do its descendants
#    unless they scrub their environment. After the window we read
#    /proc/PID/environ (psutil elsewhere) for it, narrowed on Linux to the
#    pids allocated since the window opened when that is provably complete
#    (see _candidate_pids). This is the mechanism where cgroups are
#    unavailable, and catches processes that left the cgroup.
#    The value is a ':'-separated chain of `token.phase` elements: a nested
#    window (a block, an inner pytest run under pytester, an xdist worker)
#    appends to it, so the outer windows keep seeing their descendants.
# 3. fork log: /proc/PID/environ shows the environment a process was *exec'd*
#    with, so a child that the runner forks without exec (os.fork, the fork
#    start method of multiprocessing) shows the runner's original environment,
#    without the cookie. An os.register_at_fork hook makes every such child
#    write "pid start-time cookie-chain" into a pipe that the plugin reads.
#
# Safety. A leaked process is signalled only after its ownership was checked
# again right before signalling, through a pidfd opened first (so the pid
# cannot be recycled in between): it still carries the window's cookie, or it
# is listed in the window's own cgroup, or the fork log recorded it with the
# same start time. A cgroup that we created and that only our process tree
# can enter is as strong a proof as the cookie, and is the only one for a
# process that scrubbed its environment, so it counts as ownership too.
# Nothing else is ever signalled: the ladder is SIGTERM+SIGCONT, a bounded
# grace (ini procown_leaks_grace, 1 s), SIGKILL, a bounded wait; where the
# window has a cgroup, cgroup.kill then catches anything forked meanwhile.
# Leaked processes are not reaped by us (a subprocess.Popen or trio Process
# object may still own them); their zombies are not counted as alive.
#
# Reporting. The check runs after the teardown, so a leak fails the test the
# way pytest reports any check made after a test: as an error of its teardown
# ("ERROR at teardown of ..."), with the report as the failure text. Warn
# mode emits a ProcessLeakWarning instead. The leaks are also attached to the
# report as the user property "procown_leaks" (JSON-ready, for junitxml and
# xdist). `--procown-leaks-keep` (or marker keep=True) reports without
# terminating.
#
# Scopes. Fixtures broader than function scope are set up with the test's
# window suspended: a session-scoped server is not the first test's leak.
# When the plugin is active for the whole run (command line or ini), a
# session window is open from sessionstart to sessionfinish; it catches what
# those fixtures, collection or hooks leave behind, reported at the end of
# the run (and fails it in fail mode). Under pytest-xdist the controller owns
# the session window (workers inherit its cookie and are born in its cgroup),
# the workers watch their tests.
#
# Cost (benchmarks/plugin_overhead.py, 2-core VM, ~100 processes): 0.1 to
# 0.3 ms per test with the cookie alone, 0.5 to 0.8 ms with the cgroup as
# well (a cgroup created, entered, left and removed per test), against a
# target of 5 ms.
#
# Fixtures. `procown_no_leaks` watches a block the same way (sync or async
# `with`). `procown_command` runs owned commands of this library from trio
# tests (any trio run: pytest-trio's trio_mode or a trio.run in the test);
# each command is owned by a trio system task, so it is torn down when the
# test's trio run ends, and its receipt is attached to the report when the
# test fails.

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Protocol, Unpack, cast

import psutil
import pytest
import trio

from . import _cgroup, _pidfd, _procfs
from ._command import Command, OwnedCommand, OwnedOptions, OwnedResult, open_owned_command, run_owned
from ._receipt import Receipt

__all__ = [
    "COOKIE_ENV",
    "LeakedProcess",
    "NoLeaks",
    "NoLeaksFactory",
    "OwnedCommands",
    "ProcessLeakError",
    "ProcessLeakWarning",
    "Tracker",
    "Watch",
    "format_leaks",
    "no_leaks",
]

COOKIE_ENV = "TRIO_PROCOWN_TEST_COOKIE"
_COOKIE_PREFIX = COOKIE_ENV.encode() + b"="

Mode = Literal["fail", "warn", "off"]
MODES: tuple[Mode, ...] = ("fail", "warn", "off")
Mechanism = Literal["auto", "cgroup", "cookie"]
MECHANISMS: tuple[Mechanism, ...] = ("auto", "cgroup", "cookie")
DEFAULT_GRACE = 1.0
KILL_WAIT = 2.0
_IS_LINUX = _procfs.IS_LINUX
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ProcessLeakWarning(UserWarning):
    """A test left processes running (warn mode)."""


class ProcessLeakError(AssertionError):
    """A `procown_no_leaks` block left processes running."""

    def __init__(self, message: str, leaks: list[LeakedProcess]) -> None:
        super().__init__(message)
        self.leaks = leaks


@dataclass(frozen=True, slots=True)
class LeakedProcess:
    """A process that outlived the window (test, block or session) that started it."""

    pid: int
    cmdline: str
    ppid: int
    parent: str  # the parent's command line ("" when unknown)
    lived: float | None  # seconds from its start to when it was found
    started_by: str  # the test node id, block or session that started it
    phase: str  # "setup", "call", "teardown", "block", ... ("" when unknown)
    found_by: tuple[str, ...]  # "cgroup", "cookie", "fork log"
    fate: str = ""  # what the plugin did about it
    start_key: int = field(default=0, repr=False, compare=False)  # identity: start time

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "pid": self.pid,
            "cmdline": self.cmdline,
            "ppid": self.ppid,
            "parent": self.parent,
            "lived": None if self.lived is None else round(self.lived, 3),
            "started_by": self.started_by,
            "phase": self.phase,
            "found_by": list(self.found_by),
            "fate": self.fate,
        }

    def describe(self) -> str:
        """Four lines naming the process, for reports."""
        started = self.started_by + (f" (during {self.phase})" if self.phase else "")
        lived = "unknown" if self.lived is None else f"{self.lived:.2f} s"
        parent = f"pid {self.ppid}" + (f" ({_short(self.parent)})" if self.parent else "")
        return (
            f"pid {self.pid}: {_short(self.cmdline) or '(no command line)'}\n"
            f"    started by: {started}; lived {lived}\n"
            f"    parent: {parent}\n"
            f"    found by: {', '.join(self.found_by)}; {self.fate or 'left running'}"
        )


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_leaks(owner: str, leaks: list[LeakedProcess], mechanism: str) -> str:
    """The human report for `leaks` left by `owner`."""
    lines = [f"{owner} left {len(leaks)} process(es) running:"]
    for leak in leaks:
        lines.extend("  " + line for line in leak.describe().splitlines())
    lines.append(f"(trio_procown leak check; tracked by {mechanism})")
    return "\n".join(lines)


# -- process facts ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Stat:
    ppid: int
    zombie: bool
    start: int  # Linux: clock ticks since boot; elsewhere: microseconds since the epoch


def _read_stat(pid: int) -> _Stat | None:
    """Parent, state and start time of `pid`; None if it is gone."""
    if _IS_LINUX:
        info = _procfs.read_stat(pid)
        return None if info is None else _Stat(info.ppid, info.zombie, info.start)
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return _Stat(
                proc.ppid(), proc.status() == psutil.STATUS_ZOMBIE, int(proc.create_time() * 1_000_000)
            )
    except (psutil.Error, OSError):
        return None


def _age(stat: _Stat) -> float | None:
    """Seconds since the process of `stat` started."""
    if _IS_LINUX:
        try:
            with open("/proc/uptime", "rb") as f:
                uptime = float(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return max(0.0, uptime - stat.start / _HZ)
    return max(0.0, time.time() - stat.start / 1_000_000)


_read_environ = _procfs.read_environ
_exec_in_progress = _procfs.exec_in_progress


def _chain_phase(chain: str, token: str) -> str | None:
    """The phase recorded with `token` in a cookie chain, or None if absent."""
    for element in chain.split(":"):
        tok, _, phase = element.partition(".")
        if tok == token:
            return phase
    return None


def _environ_phase(pid: int, token: str) -> str | None:
    """The phase `token` has in the cookie of `pid`'s environment, or None."""
    if _IS_LINUX:
        data = _read_environ(pid)
        if data is None or token.encode() not in data:
            return None
        for entry in data.split(b"\0"):
            if entry.startswith(_COOKIE_PREFIX):
                return _chain_phase(entry[len(_COOKIE_PREFIX) :].decode(errors="replace"), token)
        return None
    try:
        chain = psutil.Process(pid).environ().get(COOKIE_ENV)
    except (psutil.Error, OSError):
        return None
    return None if chain is None else _chain_phase(chain, token)


# Narrowing the cookie scan (Linux). Reading the environment of every process
# costs ~5 us each, a few ms on a busy machine: too much for every test. A
# process that carries a window's token was created after the window opened,
# and Linux hands out pids cyclically upward, so its pid lies in the cyclic
# interval (last pid at open, last pid now] -- unless the allocation cursor
# went all the way round meanwhile. The cursor advances once per allocation
# plus once per pid in use that it skips; allocations are at most the forks
# counted by /proc/stat ("processes", every clone on the machine), and pids
# in use at most three per task (its own, plus the process group and session
# ids a task may keep alive), tasks being at most those at open plus those
# created since. So while 4 * forks + 3 * tasks < pid_max - 300, no lap
# happened and the narrow interval is complete; otherwise we scan everything.
# The library's teardown scans use the same proof: _procfs.ranges_since.


_PidMark = _procfs.PidMark
_pid_mark = _procfs.pid_mark


def _candidate_pids(since: _PidMark | None) -> tuple[list[int], bool]:
    """Pids that may belong to processes created after `since`, and whether
    they may include threads (pids probed directly rather than listed)."""
    ranges = _procfs.ranges_since(since)
    if ranges is not None and _procfs.width(ranges) <= _procfs.DIRECT_PROBE_MAX:
        return [pid for lo, hi in ranges for pid in range(lo, hi + 1)], True
    return list(_procfs.candidate_pids(ranges)), False


_is_thread_group_leader = _procfs.is_process


# A process caught in the middle of execve() shows an empty environment: its
# new memory exists before the kernel has copied the environment into it, and
# the spawner may already have returned (posix_spawn and subprocess both
# resume at that point): three reads in four right after a posix_spawn.
# So an empty environment of a process in that state is read again a few
# times, a few milliseconds apart, before it counts as empty.
EMPTY_ENV_RETRIES = 5
EMPTY_ENV_DELAY = 0.002


def _cookie_scan(token: str, since: _PidMark | None = None) -> dict[int, str]:
    """Every process whose environment carries `token`: pid -> phase.

    With `since` (taken before the token was set), only processes created
    after it are examined, when that is provably complete (see above).
    """
    me = os.getpid()
    found: dict[int, str] = {}
    if _IS_LINUX:
        needle = token.encode()
        pids, may_be_threads = _candidate_pids(since)
        pending = [pid for pid in pids if pid != me]
        for attempt in range(EMPTY_ENV_RETRIES + 1):
            if attempt:
                pending = [pid for pid in pending if _exec_in_progress(pid)]
                if not pending:
                    break
                time.sleep(EMPTY_ENV_DELAY)
            empty = []
            for pid in pending:
                data = _read_environ(pid)
                if not data:
                    if data is not None:
                        empty.append(pid)
                    continue
                if needle not in data:
                    continue
                phase = None
                for entry in data.split(b"\0"):
                    if entry.startswith(_COOKIE_PREFIX):
                        phase = _chain_phase(entry[len(_COOKIE_PREFIX) :].decode(errors="replace"), token)
                        break
                if phase is not None and (not may_be_threads or _is_thread_group_leader(pid)):
                    found[pid] = phase
            pending = empty
        return found
    for pid in psutil.pids():
        if pid != me:
            phase = _environ_phase(pid, token)
            if phase is not None:
                found[pid] = phase
    return found


# -- the fork log -------------------------------------------------------------------


class _ForkLog:
    """Children forked (without exec) by this process, reported by themselves.

    Each child writes "pid start chain" into a pipe from an after-fork hook.
    The forking parent waits (at most FORK_SYNC_WAIT) until its child has
    done so, through a pipe of its own per fork that the child closes after
    writing: a child that forks and exits at once (a double-forking daemon)
    has reported its own child before it can exit, so a scan after the
    test never misses a record still in flight. Only forks made while a
    cookie is set pay for this (two pipes and a wakeup, tens of microseconds
    next to the fork itself).

    One per process: an os.register_at_fork hook cannot be removed, and
    in-process pytester runs share the process with the outer run.
    """

    FORK_SYNC_WAIT = 1.0

    def __init__(self) -> None:
        self._read_fd = -1
        self._write_fd = -1
        self._partial = b""
        self._local = threading.local()
        self.records: dict[int, tuple[int, str]] = {}  # pid -> (start, cookie chain)

    def install(self) -> None:
        if self._write_fd >= 0 or not hasattr(os, "register_at_fork"):
            return
        read_fd, write_fd = os.pipe()  # close-on-exec: exec'd children carry the cookie instead
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self._read_fd, self._write_fd = read_fd, write_fd
        os.register_at_fork(
            before=self._before, after_in_child=self._in_child, after_in_parent=self._in_parent
        )

    def _before(self) -> None:
        self._local.sync = None
        try:
            if os.environ.get(COOKIE_ENV):
                self._local.sync = os.pipe()
        except BaseException:  # never disturb the fork
            pass

    def _in_child(self) -> None:
        sync: tuple[int, int] | None = getattr(self._local, "sync", None)
        self._local.sync = None
        try:
            chain = os.environ.get(COOKIE_ENV)
            if chain:
                pid = os.getpid()
                stat = _read_stat(pid)
                if stat is not None:
                    os.write(self._write_fd, f"{pid} {stat.start} {chain}\n".encode())
        except BaseException:  # never disturb the child; a full pipe drops the record
            pass
        finally:
            if sync is not None:
                for fd in sync:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _in_parent(self) -> None:
        sync: tuple[int, int] | None = getattr(self._local, "sync", None)
        self._local.sync = None
        if sync is None:
            return
        read_fd, write_fd = sync
        try:
            os.close(write_fd)
            poller = select.poll()
            poller.register(read_fd, select.POLLIN | select.POLLHUP)
            poller.poll(int(self.FORK_SYNC_WAIT * 1000))  # EOF: the child wrote (or died)
        except BaseException:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(read_fd)

    def drain(self) -> None:
        if self._read_fd < 0:
            return
        data = self._partial
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            parts = line.decode(errors="replace").split(" ", 2)
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                self.records[int(parts[0])] = (int(parts[1]), parts[2])
        for pid, (start, _) in list(self.records.items()):
            stat = _read_stat(pid)
            if stat is None or stat.zombie or stat.start != start:
                del self.records[pid]

    def matches(self, token: str) -> dict[int, str]:
        """Live recorded children whose cookie chain holds `token`: pid -> phase."""
        self.drain()
        found = {}
        for pid, (_, chain) in self.records.items():
            phase = _chain_phase(chain, token)
            if phase is not None:
                found[pid] = phase
        return found

    def owns(self, pid: int, token: str, start: int) -> bool:
        record = self.records.get(pid)
        return record is not None and record[0] == start and _chain_phase(record[1], token) is not None


_FORK_LOG = _ForkLog()


# -- cgroups ------------------------------------------------------------------------


class _Cgroups:
    """The cgroup v2 operations of the windows (Linux)."""

    def __init__(self, mount: str, base: str) -> None:
        self.mount = mount
        self.base = base  # where this process was when it started to use windows

    def current(self) -> str:
        """The cgroup directory this process is in now."""
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    rel = line[3:].strip().lstrip("/")
                    return os.path.join(self.mount, rel) if rel else self.mount
        msg = "this process is in no cgroup v2"
        raise OSError(errno.ENOENT, msg)

    @staticmethod
    def enter(path: str) -> None:
        """Move this whole process (every thread) into the cgroup `path`."""
        fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    @staticmethod
    def populated(path: str) -> bool:
        try:
            with open(os.path.join(path, "cgroup.events"), "rb") as f:
                for line in f:
                    if line.startswith(b"populated "):
                        return line.split()[1] != b"0"
        except FileNotFoundError:
            return False
        return False

    @staticmethod
    def members(path: str) -> list[int]:
        """Every pid in the cgroup `path` and its descendant cgroups."""
        pids: list[int] = []
        stack = [path]
        while stack:
            here = stack.pop()
            try:
                with open(os.path.join(here, "cgroup.procs"), "rb") as f:
                    pids.extend(int(x) for x in f.read().split())
                with os.scandir(here) as entries:
                    stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
            except OSError:
                continue
        return pids

    def evict(self, path: str, to: str) -> None:
        """Move every process of the cgroup tree `path` into the cgroup `to`."""
        procs = os.path.join(to, "cgroup.procs")
        for pid in self.members(path):
            try:
                fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, str(pid).encode())
                finally:
                    os.close(fd)
            except OSError:
                continue

    def kill(self, path: str) -> None:
        """SIGKILL everything in the cgroup tree `path` (atomically where the
        kernel has cgroup.kill)."""
        try:
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
            return
        except FileNotFoundError:
            pass
        for pid in self.members(path):
            fd = _pidfd.open_pidfd(pid)
            if fd is not None:
                try:
                    if pid in self.members(path):
                        _pidfd.send(fd, signal.SIGKILL)
                finally:
                    os.close(fd)

    def remove(self, path: str) -> bool:
        """Remove the cgroup tree `path`, deepest first; False if it is still
        populated (or otherwise cannot go)."""
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                return False
        try:
            with os.scandir(path) as entries:
                children = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            return False
        for child in children:
            self.remove(child)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def _probe_cgroups() -> tuple[_Cgroups | None, str]:
    """Cgroup operations if this process can move itself into a child of its
    cgroup and back, with what they will use (or why not)."""
    if not _IS_LINUX:
        return None, "cgroups exist only on Linux"
    mount = _cgroup.cgroup2_mount()
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    try:
        here = _Cgroups(mount, mount).current()
    except OSError:
        return None, "this process is in no cgroup v2"
    cg = _Cgroups(mount, here)
    # The library caches its own cgroup on first use: fill that cache while we
    # are still where we started (see the module comment).
    _cgroup._own_cgroup_dir_cached()
    probe = os.path.join(here, f"procown-pytest-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return None, f"cannot create a child cgroup of {here}: {exc.strerror}"
    try:
        cg.enter(probe)
        cg.enter(here)
    except OSError as exc:
        with contextlib.suppress(OSError):
            cg.enter(here)
        return None, f"cannot move this process between cgroups under {here}: {exc.strerror}"
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)
    return cg, f"a cgroup v2 per window under {here}"


# -- signalling ---------------------------------------------------------------------


class _Handle:
    """A process to signal: a pidfd where available, else a psutil.Process
    (which checks the start time before signalling, so a recycled pid is
    not hit)."""

    def __init__(self, pid: int, fd: int | None, proc: psutil.Process | None) -> None:
        self.pid = pid
        self.fd = fd
        self.proc = proc

    @classmethod
    def open(cls, pid: int) -> _Handle | None:
        if _pidfd.HAVE_PIDFD:
            try:
                fd = _pidfd.open_pidfd(pid)
            except OSError:
                return None
            return None if fd is None else cls(pid, fd, None)
        try:
            return cls(pid, None, psutil.Process(pid))
        except psutil.Error:
            return None

    def send(self, sig: int) -> bool:
        if self.fd is not None:
            return _pidfd.send(self.fd, sig)
        assert self.proc is not None
        try:
            self.proc.send_signal(sig)
        except psutil.Error:
            return False
        return True

    def exited(self) -> bool:
        if self.fd is not None:
            return _pidfd.exited(self.fd)
        assert self.proc is not None
        try:
            return self.proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # not _pidfd.close: that one needs a trio run
            self.fd = None


def _wait_exited(handles: Iterable[_Handle], timeout: float) -> None:
    """Wait until every handle's process has exited, at most `timeout` s."""
    deadline = time.monotonic() + timeout
    pending = [h for h in handles if not h.exited()]
    delay = 0.001
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        fds = [h.fd for h in pending if h.fd is not None]
        if len(fds) == len(pending):
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            poller.poll(max(1, int(left * 1000)))
        else:
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.02)
        pending = [h for h in pending if not h.exited()]


# -- windows ------------------------------------------------------------------------


class Tracker:
    """How windows track processes: the mechanisms this run uses and their
    settings (one per pytest config; a default one outside pytest)."""

    def __init__(self, mechanism: Mechanism = "auto", grace: float = DEFAULT_GRACE) -> None:
        self.mechanism = mechanism
        self.grace = grace
        self._cgroups: _Cgroups | None = None
        self._probed = False
        self.cgroup_note = ""
        self.leftover_cgroups: list[str] = []

    def cgroups(self) -> _Cgroups | None:
        """The cgroup operations, when this run tracks with cgroups."""
        if not self._probed:
            self._probed = True
            if self.mechanism == "cookie":
                self.cgroup_note = "cgroups not used (mechanism=cookie)"
            else:
                self._cgroups, self.cgroup_note = _probe_cgroups()
        return self._cgroups

    def describe(self) -> str:
        cg = self.cgroups()
        cookie = f"the environment cookie {COOKIE_ENV} and the fork log"
        if cg is not None:
            return f"{self.cgroup_note}, {cookie}"
        return f"{cookie} (no cgroup: {self.cgroup_note})"

    def cgroups_lost(self, why: str) -> None:
        self._cgroups = None
        self.cgroup_note = why


class Watch:
    """One window: everything the process starts between open() and close()."""

    def __init__(self, tracker: Tracker, owner: str, kind: str = "block") -> None:
        self.tracker = tracker
        self.owner = owner
        self.kind = kind
        self.token = secrets.token_hex(8)
        self.phase = ""
        self.cgroup: str | None = None
        self.active = False
        self._outer_env: str | None = None
        self._outer_cgroup: str | None = None
        self._cg: _Cgroups | None = None
        self._mark: _PidMark | None = None

    # -- lifecycle --------------------------------------------------------
    def open(self, phase: str) -> None:
        _FORK_LOG.install()
        self._mark = _pid_mark()
        self._outer_env = os.environ.get(COOKIE_ENV)
        self.phase = phase
        self._set_env()
        self.active = True
        cg = self.tracker.cgroups()
        if cg is None:
            return
        path = ""
        try:
            outer = cg.current()
            path = os.path.join(outer, f"procown-{self.kind}-{os.getpid()}-{self.token}")
            os.mkdir(path)
            cg.enter(path)
        except OSError as exc:
            if path:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            self.tracker.cgroups_lost(f"cgroups stopped working: {exc}")
            return
        self._cg, self.cgroup, self._outer_cgroup = cg, path, outer

    def _set_env(self) -> None:
        element = f"{self.token}.{self.phase}"
        os.environ[COOKIE_ENV] = f"{self._outer_env}:{element}" if self._outer_env else element

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        if self.active:
            self._set_env()

    def suspend(self) -> None:
        """Step out: the process is no longer in the window (env and cgroup)."""
        if not self.active:
            return
        self.active = False
        if self._outer_env is None:
            os.environ.pop(COOKIE_ENV, None)
        else:
            os.environ[COOKIE_ENV] = self._outer_env
        if self._cg is not None and self._outer_cgroup is not None:
            try:
                self._cg.enter(self._outer_cgroup)
            except OSError:  # the outer window's cgroup is gone: go home
                self._cg.enter(self._cg.base)

    def resume(self) -> None:
        if self.active:
            return
        self._set_env()
        self.active = True
        if self._cg is not None and self.cgroup is not None:
            self._cg.enter(self.cgroup)

    def close(self) -> None:
        self.suspend()

    # -- findings ---------------------------------------------------------
    def mechanism(self) -> str:
        parts = []
        if self.cgroup:
            parts.append(f"cgroup {self.cgroup}")
        parts.append(f"cookie {COOKIE_ENV}")
        parts.append("fork log")
        text = ", ".join(parts)
        if not self.cgroup and self.tracker.cgroup_note:
            text += f"; {self.tracker.cgroup_note}"
        return text

    def find(self, exclude: Callable[[int, int], bool] | None = None) -> list[LeakedProcess]:
        """Live processes started in this window (call after close())."""
        found: dict[int, set[str]] = {}
        phases: dict[int, str] = {}
        if self._cg is not None and self.cgroup is not None and self._cg.populated(self.cgroup):
            for pid in self._cg.members(self.cgroup):
                found.setdefault(pid, set()).add("cgroup")
        cookie, forked = _cookie_scan(self.token, self._mark), _FORK_LOG.matches(self.token)
        for source, hits in (("cookie", cookie), ("fork log", forked)):
            for pid, phase in hits.items():
                found.setdefault(pid, set()).add(source)
                phases.setdefault(pid, phase)
        me = os.getpid()
        leaks = []
        order = ("cgroup", "cookie", "fork log")
        for pid in sorted(found):
            stat = _read_stat(pid)
            if pid == me or stat is None or stat.zombie:
                continue
            if exclude is not None and exclude(pid, stat.start):
                continue
            parent = _procfs.cmdline(stat.ppid) if stat.ppid > 0 else ""
            leaks.append(
                LeakedProcess(
                    pid=pid,
                    cmdline=_procfs.cmdline(pid),
                    ppid=stat.ppid,
                    parent=parent,
                    lived=_age(stat),
                    started_by=self.owner,
                    phase=phases.get(pid, ""),
                    found_by=tuple(s for s in order if s in found[pid]),
                    start_key=stat.start,
                )
            )
        return leaks

    def owns(self, pid: int, start: int) -> bool:
        """Is `pid` (with start time `start`) still provably ours? Checked
        right before signalling."""
        stat = _read_stat(pid)
        if stat is None or stat.zombie or stat.start != start:
            return False
        if self._cg is not None and self.cgroup is not None and pid in self._cg.members(self.cgroup):
            return True
        return _environ_phase(pid, self.token) is not None or _FORK_LOG.owns(pid, self.token, start)

    def terminate(self, leaks: list[LeakedProcess]) -> list[LeakedProcess]:
        """SIGTERM+SIGCONT, grace, SIGKILL, bounded wait; each leak with its fate."""
        fates: dict[int, str] = {}
        handles: dict[int, _Handle] = {}
        try:
            for leak in leaks:
                handle = _Handle.open(leak.pid)
                if handle is None:
                    fates[leak.pid] = "exited before it was signalled"
                    continue
                if not self.owns(leak.pid, leak.start_key):
                    handle.close()
                    fates[leak.pid] = "not signalled: its ownership could no longer be verified"
                    continue
                if handle.send(signal.SIGTERM):
                    handle.send(signal.SIGCONT)
                    handles[leak.pid] = handle
                else:
                    handle.close()
                    fates[leak.pid] = "exited before it was signalled"
            _wait_exited(handles.values(), self.tracker.grace)
            killed = []
            for pid, handle in handles.items():
                if handle.exited():
                    fates[pid] = "terminated (SIGTERM)"
                else:
                    handle.send(signal.SIGKILL)
                    killed.append(handle)
            _wait_exited(killed, KILL_WAIT)
            for handle in killed:
                fates[handle.pid] = "killed (SIGKILL)" if handle.exited() else "STILL ALIVE after SIGKILL"
        finally:
            for handle in handles.values():
                handle.close()
        return [replace(leak, fate=fates.get(leak.pid, "")) for leak in leaks]

    def sweep(self, keep: bool, exclude: Callable[[int, int], bool] | None = None) -> list[LeakedProcess]:
        """Find the leaks of this closed window and (unless `keep`)
        terminate them, plus anything they started meanwhile."""
        leaks = self.find(exclude)
        if keep or not leaks:
            return [replace(leak, fate="left running (keep)") for leak in leaks]
        done = self.terminate(leaks)
        seen = {leak.pid for leak in done}
        for _ in range(2):  # what they started while we were signalling them
            more = [leak for leak in self.find(exclude) if leak.pid not in seen]
            if not more:
                break
            done.extend(self.terminate(more))
            seen.update(leak.pid for leak in more)
        if self._cg is not None and self.cgroup is not None and self._cg.populated(self.cgroup):
            # Still forking: the cgroup holds only our tree, kill it at once.
            self._cg.kill(self.cgroup)
            deadline = time.monotonic() + KILL_WAIT
            while self._cg.populated(self.cgroup) and time.monotonic() < deadline:
                time.sleep(0.005)
        return done

    def release(self) -> bool:
        """Remove the window's cgroup (False if it must stay: still populated)."""
        if self._cg is None or self.cgroup is None:
            return True
        if self._cg.remove(self.cgroup):
            return True
        # Kept leaks: put them back where they would be without us (the
        # cgroup the run started in), so the window's cgroup can go.
        self._cg.evict(self.cgroup, self._cg.base)
        if self._cg.remove(self.cgroup):
            return True
        self.tracker.leftover_cgroups.append(self.cgroup)
        return False


# -- a watched block ----------------------------------------------------------------

_default_tracker: Tracker | None = None


def _tracker_outside_pytest() -> Tracker:
    global _default_tracker
    if _default_tracker is None:
        _default_tracker = Tracker()
    return _default_tracker


class NoLeaks:
    """Context manager (sync or async): raise ProcessLeakError if the block
    leaves a process running; the leaks are terminated first unless `keep`.

    It tracks like a test's window: where cgroups are writable the process
    itself sits in a child cgroup for the duration of the block. Everything
    the process starts meanwhile counts, from any thread or task. If the
    block raises, its exception propagates with the report as a note.

    Synopsis::

        with no_leaks():
            subprocess.run(["sh", "-c", "sleep 0.1 & wait"], check=True)  # waits for its child
    """

    def __init__(
        self, *, keep: bool = False, owner: str = "a no_leaks block", tracker: Tracker | None = None
    ):
        self.keep = keep
        self.owner = owner
        self.tracker = tracker or _tracker_outside_pytest()
        self.leaks: list[LeakedProcess] = []
        self._watch: Watch | None = None

    def __enter__(self) -> NoLeaks:
        if self._watch is not None:
            msg = "a NoLeaks block cannot be entered twice"
            raise RuntimeError(msg)
        self._watch = Watch(self.tracker, self.owner, "block")
        self._watch.open("block")
        return self

    def _close(self) -> tuple[Watch, list[LeakedProcess]]:
        watch = self._watch
        assert watch is not None
        watch.close()
        return watch, watch.find()

    def _settle(self, watch: Watch, found: list[LeakedProcess]) -> list[LeakedProcess]:
        leaks = watch.sweep(self.keep) if found else []
        watch.release()
        return leaks

    def _raise(self, exc: BaseException | None) -> None:
        if not self.leaks:
            return
        text = format_leaks(self.owner, self.leaks, self._watch.mechanism() if self._watch else "")
        if exc is not None:
            exc.add_note(text)
            return
        raise ProcessLeakError(text, self.leaks)

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        watch, found = self._close()
        self.leaks = self._settle(watch, found)
        self._raise(exc)

    async def __aenter__(self) -> NoLeaks:
        return self.__enter__()

    async def __aexit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        watch, found = self._close()
        if found:  # terminating waits: keep the event loop running meanwhile
            self.leaks = await trio.to_thread.run_sync(self._settle, watch, found)
        else:
            watch.release()
        self._raise(exc)


class NoLeaksFactory(Protocol):
    """The type of the `procown_no_leaks` fixture."""

    def __call__(self, *, keep: bool = False) -> NoLeaks: ...


def no_leaks(*, keep: bool = False) -> NoLeaks:
    """A block that must not leave processes running (see NoLeaks)."""
    return NoLeaks(keep=keep)


# -- owned commands for trio tests --------------------------------------------------


@dataclass(eq=False)
class _Entry:
    command: Command
    options: OwnedOptions
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    run: OwnedCommand | None = None
    error: BaseException | None = None


class OwnedCommands:
    """The `procown_command` fixture: owned commands started by one test.

    ``await procown_command(cmd, **options)`` starts `cmd` with
    `open_owned_command` in the background and returns the running
    OwnedCommand; it is torn down (bounded, with a receipt) when the test's
    trio run ends, or earlier with ``await procown_command.stop(run)``.
    ``await procown_command.run(cmd, **options)`` runs one to completion
    (`run_owned`). Receipts are kept in `.receipts` and attached to the test
    report when the test fails.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.receipts: list[tuple[Command, Receipt]] = []
        self._entries: list[_Entry] = []

    async def __call__(self, command: Command, **options: Unpack[OwnedOptions]) -> OwnedCommand:
        entry = _Entry(command, options)
        self._entries.append(entry)
        trio.lowlevel.spawn_system_task(self._own, entry, name=f"procown_command {command!r}")
        await entry.started.wait()
        if entry.run is None:
            assert entry.error is not None
            raise entry.error
        return entry.run

    async def run(self, command: Command, **options: Unpack[OwnedOptions]) -> OwnedResult:
        """Run `command` to completion (run_owned), recording its receipt."""
        result = await run_owned(command, **options)
        self.receipts.append((command, result.receipt))
        return result

    async def stop(self, run: OwnedCommand) -> Receipt:
        """Tear down a command started by this fixture now; its receipt."""
        for entry in self._entries:
            if entry.run is run:
                entry.scope.cancel()
                await entry.done.wait()
                assert run.receipt is not None
                return run.receipt
        msg = "this command was not started by this procown_command fixture"
        raise ValueError(msg)

    async def _own(self, entry: _Entry) -> None:
        # A system task: it must end with nothing but Cancelled.
        try:
            with entry.scope:
                async with open_owned_command(entry.command, **entry.options) as run:
                    entry.run = run
                    entry.started.set()
                    await run.wait()
        except trio.Cancelled:
            raise
        except BaseException as exc:
            entry.error = exc
        finally:
            if entry.run is not None and entry.run.receipt is not None:
                self.receipts.append((entry.command, entry.run.receipt))
            entry.started.set()
            entry.done.set()

    def unfinished(self) -> list[Command]:
        return [e.command for e in self._entries if not e.done.is_set()]

    def errors(self) -> list[BaseException]:
        return [e.error for e in self._entries if e.error is not None and e.run is not None]

    def report(self) -> str:
        parts = []
        for command, receipt in self.receipts:
            shown = command if isinstance(command, str) else " ".join(os.fspath(a) for a in command)
            parts.append(f"$ {shown}\n{receipt.summary()}")
        return "\n\n".join(parts)


# -- pytest integration -------------------------------------------------------------


@dataclass
class _TestWatch:
    watch: Watch
    mode: Mode
    keep: bool


class _State:
    """The plugin's state for one pytest config."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.tracker = Tracker(_mechanism(config), _grace(config))
        self.session: Watch | None = None
        self.current: _TestWatch | None = None
        self.reported: dict[int, int] = {}  # pid -> start: leaks already reported (kept)
        self._settings: tuple[Mode, bool] | None = None

    def settings(self) -> tuple[Mode, bool]:
        """The run-wide mode and keep flag (command line, else ini); read
        late so a conftest's pytest_configure may set config.option."""
        if self._settings is None:
            cli = self.config.getoption("procown_leaks", None)
            mode = _check_mode(
                cli if cli is not None else _ini(self.config, "procown_leaks"), "procown_leaks"
            )
            keep = bool(self.config.getoption("procown_leaks_keep", None)) or bool(
                self.config.getini("procown_leaks_keep")
            )
            self._settings = (mode, keep)
        return self._settings

    def for_item(self, item: pytest.Item) -> tuple[Mode, bool]:
        mode, keep = self.settings()
        marker = item.get_closest_marker("procown_leaks")
        if marker is not None:
            mode = _check_mode(marker.args[0] if marker.args else marker.kwargs.get("mode", "fail"), "marker")
            keep = bool(marker.kwargs.get("keep", keep))
        return mode, keep

    def already_reported(self, pid: int, start: int) -> bool:
        return self.reported.get(pid) == start


_STATE = pytest.StashKey[_State]()
_WATCH = pytest.StashKey[_TestWatch]()
_COMMANDS = pytest.StashKey[OwnedCommands]()
_RECEIPTS_SHOWN = pytest.StashKey[bool]()


def _ini(config: pytest.Config, name: str) -> str:
    return str(config.getini(name) or "").strip()


def _check_mode(value: object, where: str) -> Mode:
    text = str(value).strip().lower()
    if text not in MODES:
        msg = f"{where}: procown leak mode must be one of fail, warn, off; not {value!r}"
        raise pytest.UsageError(msg)
    return text


def _mechanism(config: pytest.Config) -> Mechanism:
    value = (
        config.getoption("procown_leaks_mechanism", None) or _ini(config, "procown_leaks_mechanism") or "auto"
    )
    if value not in MECHANISMS:
        msg = f"procown_leaks_mechanism must be one of auto, cgroup, cookie; not {value!r}"
        raise pytest.UsageError(msg)
    return cast(Mechanism, value)


def _grace(config: pytest.Config) -> float:
    raw = _ini(config, "procown_leaks_grace") or str(DEFAULT_GRACE)
    try:
        grace = float(raw)
    except ValueError:
        grace = -1.0
    if not grace >= 0:
        msg = f"procown_leaks_grace must be a non-negative number of seconds, not {raw!r}"
        raise pytest.UsageError(msg)
    return grace


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("procown", "process leaks (trio_procown)")
    group.addoption(
        "--procown-leaks",
        dest="procown_leaks",
        choices=MODES,
        default=None,
        help="fail or warn when a test leaves a process running (default: ini procown_leaks, else off)",
    )
    group.addoption(
        "--procown-leaks-keep",
        dest="procown_leaks_keep",
        action="store_true",
        default=None,
        help="report leaked processes but do not terminate them",
    )
    group.addoption(
        "--procown-leaks-mechanism",
        dest="procown_leaks_mechanism",
        choices=MECHANISMS,
        default=None,
        help="auto: a cgroup per test where possible, plus the cookie; cgroup: require it; cookie: never",
    )
    parser.addini("procown_leaks", "process leak check: fail, warn or off (default off)", default="off")
    parser.addini("procown_leaks_keep", "do not terminate leaked processes", type="bool", default=False)
    parser.addini("procown_leaks_mechanism", "auto, cgroup or cookie (default auto)", default="auto")
    parser.addini(
        "procown_leaks_grace", "seconds between SIGTERM and SIGKILL for leaked processes", default="1.0"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "procown_leaks(mode='fail', *, keep=False): fail ('fail') or warn ('warn') when this test "
        "leaves a process running, or do not check ('off'); overrides --procown-leaks",
    )
    state = _State(config)
    config.stash[_STATE] = state
    if state.tracker.mechanism == "cgroup" and state.tracker.cgroups() is None:
        msg = f"--procown-leaks-mechanism=cgroup, but {state.tracker.cgroup_note}"
        raise pytest.UsageError(msg)


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    mode, _ = state.settings()
    if mode != "off" and not _is_xdist_worker(session.config):
        state.session = Watch(state.tracker, "the test session (outside any test)", "session")
        state.session.open("session")


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(_STATE, None)
    if state is None:
        return []
    mode, keep = state.settings()
    if mode == "off":
        return []
    action = "kept running" if keep else "terminated"
    return [f"procown: leaks {mode} the test and are {action}; tracked by {state.tracker.describe()}"]


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, object, object]:
    # trylast wrapper: after every plain implementation (xdist's controller
    # stops its workers there), before the terminal summary.
    result = yield
    state = session.config.stash.get(_STATE, None)
    if state is None or state.session is None:
        return result
    watch, state.session = state.session, None
    mode, keep = state.settings()
    watch.close()
    kept = [pid for pid, start in state.reported.items() if _still(pid, start)]
    leaks = watch.sweep(keep, exclude=state.already_reported)
    watch.release()
    cg = state.tracker.cgroups()
    if cg is not None:  # kept leaks may have ended by now
        state.tracker.leftover_cgroups = [p for p in state.tracker.leftover_cgroups if not cg.remove(p)]
    lines = []
    if leaks:
        lines.append(format_leaks(watch.owner, leaks, watch.mechanism()))
    if kept:
        lines.append(f"still running, as asked (keep): pid {', '.join(map(str, kept))}")
    if state.tracker.leftover_cgroups:
        lines.append("cgroups left behind (still populated): " + ", ".join(state.tracker.leftover_cgroups))
    if lines:
        _write_section(session.config, "procown: processes left behind", "\n".join(lines), red=bool(leaks))
    if leaks and mode == "fail" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


def _still(pid: int, start: int) -> bool:
    stat = _read_stat(pid)
    return stat is not None and not stat.zombie and stat.start == start


def _write_section(config: pytest.Config, title: str, text: str, *, red: bool) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", title, red=red, yellow=not red)
        for line in text.splitlines():
            reporter.write_line(line)
    else:
        sys.stderr.write(f"{title}\n{text}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    # Interrupted runs may skip teardowns: never leave the process in a
    # window's cgroup or the cookie in the environment.
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    for watch in (state.current.watch if state.current else None, state.session):
        if watch is not None:
            with contextlib.suppress(OSError):
                watch.close()
                watch.release()
    state.current = None
    state.session = None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    state = item.config.stash.get(_STATE, None)
    error: pytest.UsageError | None = None
    if state is not None:
        try:
            mode, keep = state.for_item(item)
        except pytest.UsageError as exc:
            mode, keep, error = "off", False, exc
        if mode != "off":
            test = _TestWatch(Watch(state.tracker, item.nodeid, "test"), mode, keep)
            item.stash[_WATCH] = test
            state.current = test
            test.watch.open("setup")
    result = yield
    if error is not None:  # raised after the setup proper, so its teardown stays consistent
        raise error
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    test = item.stash.get(_WATCH, None)
    if test is not None:
        test.watch.set_phase("call")
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    test = item.stash.get(_WATCH, None)
    if test is None:
        return (yield)
    test.watch.set_phase("teardown")
    failure: BaseException | None = None
    result: object = None
    try:
        result = yield
    except BaseException as exc:
        failure = exc
    state = item.config.stash[_STATE]
    del item.stash[_WATCH]
    state.current = None
    watch = test.watch
    watch.close()
    leaks = watch.sweep(test.keep)
    watch.release()
    if leaks:
        if test.keep:
            state.reported.update((leak.pid, leak.start_key) for leak in leaks)
        item.user_properties.append(("procown_leaks", json.dumps([leak.to_dict() for leak in leaks])))
        text = format_leaks(item.nodeid, leaks, watch.mechanism())
        if failure is not None:
            item.add_report_section("teardown", "procown leaks", text)
        elif test.mode == "fail":
            pytest.fail(text, pytrace=False)
        else:
            item.warn(ProcessLeakWarning(text))
    if failure is not None:
        raise failure
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    # Broader fixtures outlive the test that first needs them: set them up
    # outside its window (their processes belong to the session window).
    state = request.config.stash.get(_STATE, None)
    current = state.current if state is not None else None
    if current is None or fixturedef.scope == "function" or not current.watch.active:
        return (yield)
    assert state is not None
    current.watch.suspend()
    if state.session is not None:
        state.session.set_phase(f"{fixturedef.scope}-scoped fixture {fixturedef.argname}")
    try:
        return (yield)
    finally:
        if state.session is not None:
            state.session.set_phase("session")
        current.watch.resume()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    commands = item.stash.get(_COMMANDS, None)
    shown = item.stash.get(_RECEIPTS_SHOWN, False)
    if commands is not None and report.failed and commands.receipts and not shown:
        item.stash[_RECEIPTS_SHOWN] = True
        report.sections.append(("procown receipts", commands.report()))
    return report


# -- fixtures -----------------------------------------------------------------------


@pytest.fixture
def procown_no_leaks(request: pytest.FixtureRequest) -> NoLeaksFactory:
    """A factory of blocks that must not leave processes running.

    Synopsis::

        def test_build(procown_no_leaks):
            with procown_no_leaks():
                subprocess.run(["sh", "-c", "sleep 0.1 & wait"], check=True)
    """
    state = request.config.stash.get(_STATE, None)
    tracker = state.tracker if state is not None else _tracker_outside_pytest()
    owner = f"a procown_no_leaks block in {request.node.nodeid}"

    def block(*, keep: bool = False) -> NoLeaks:
        return NoLeaks(keep=keep, owner=owner, tracker=tracker)

    return block


@pytest.fixture
def procown_command(request: pytest.FixtureRequest) -> Iterator[OwnedCommands]:
    """Owned commands for trio tests, torn down when the test's trio run ends.

    Synopsis::

        async def test_server(procown_command):
            server = await procown_command([sys.executable, "-m", "http.server", "8123"])
            ...  # talk to it; it is torn down at the end of the test
    """
    commands = OwnedCommands(request.node.nodeid)
    request.node.stash[_COMMANDS] = commands
    yield commands
    unfinished = commands.unfinished()
    if unfinished:
        msg = (
            f"procown_command: {len(unfinished)} command(s) still running at teardown "
            f"(their trio run outlived the test?): {unfinished!r}"
        )
        raise RuntimeError(msg)
    errors = commands.errors()
    if errors:
        raise errors[0]
