# Leak tracking: which processes did a stretch of this program start, and
# which of them are still running at its end? Used by the pytest plugin for
# every test (a *window* from the start of its setup to the end of its
# teardown) and by NoLeaks for a block of plain code; nothing here needs
# pytest.
#
# Three mechanisms track a window at once; each catches something the others
# miss, and whatever any of them finds alive after the window is a leak:
#
# 1. cgroup (Linux, cgroup v2, a writable cgroup: the same condition as the
#    library's cgroup domain). Children spawned by arbitrary code cannot be
#    put into a cgroup one by one: nothing runs between their fork and their
#    first fork of their own. They need not be: a process is born in its
#    parent's cgroup. So the window creates a child cgroup of the one this
#    process is in and moves *this process itself* into it for the duration
#    of the window, and back afterwards (a write of our pid to cgroup.procs,
#    ~0.05 ms; our memory stays charged where it was, the limits of every
#    ancestor still apply). Every process forked meanwhile (subprocess, trio,
#    os.fork, multiprocessing, C code, any thread) is born in the window's
#    cgroup and stays there through setsid(), double forks and scrubbed
#    environments; "populated 0" then proves nothing of it is alive. A
#    process that moves itself to another cgroup (owned commands under the
#    cgroup domain, systemd-run, containers) is no longer seen by it. The
#    library takes its own cgroup as the default root on first use, so the
#    probe asks for it before the first move.
# 2. cookie: TRIO_PROCOWN_TEST_COOKIE is set in os.environ for the window, so
#    every process exec'd meanwhile inherits it, and so do its descendants
#    unless they scrub their environment. Afterwards the environments are
#    read (_procfs.environ_entry, with its one retry policy for a process
#    caught inside execve), on Linux only those of the pids allocated since
#    the window opened when _procfs.ranges_since proves that complete. The
#    value is a ":"-separated chain of `token.phase` elements: a nested
#    window (a block in a test, an inner pytest under pytester, an xdist
#    worker) appends to it, so the outer windows keep seeing their
#    descendants.
# 3. fork log: /proc/PID/environ shows the environment a process was exec'd
#    with, so a child forked without exec (os.fork, multiprocessing's fork
#    start method) shows ours from before the window. An os.register_at_fork
#    hook makes each such child write "pid start-time role cookie-chain" into
#    a pipe that we read; the role names the process pool whose code forked
#    it (seen on the forking thread's stack), so a report can say so.
#
# Teardown. A leak is signalled only after its ownership was checked again
# right before, through a pidfd opened first (so the pid cannot be recycled
# in between): it still carries the window's cookie, is listed in the
# window's cgroup (which only our process tree can enter), or the fork log
# recorded it with the same start time. The ladder is the library's: an
# Escalation (_escalation.py) decides, SIGTERM+SIGCONT, grace, SIGKILL,
# kill_wait, with the library's default budgets unless the Tracker says
# otherwise, and each leak's fate is the one a receipt would give it
# (_fates.py: terminated, killed, exited, alive).
# What the leaks started meanwhile is found and stopped too, and a window's
# cgroup that is still populated after that is killed whole. Leaks are not
# reaped by us (a Popen or trio Process may still own them); zombies do not
# count as alive.
#
# Spared processes. A caller may name processes found in a window that are
# not its leaks (`spare`): the workers of a process pool owned by a broader
# scope, which forked them lazily inside the window, and the helpers of this
# process that end with it: multiprocessing's (forkserver, resource
# tracker) and this library's keeper (started by the first owned command,
# in whatever window that was). The pytest plugin retires the keeper before
# its session window's check, so a keeper that does not exit is reported.
# They are neither reported nor signalled; they leave the window's cgroup for
# the enclosing one, so the enclosing window still sees them.

from __future__ import annotations

import contextlib
import gc
import os
import re
import secrets
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import FrameType, TracebackType
from typing import Any, Literal

import psutil
import trio

from . import _cgroup, _keeper, _pidfd, _procfs
from ._budgets import DEFAULT_GRACE, DEFAULT_KILL_WAIT
from ._errors import ProcessLeakError
from ._escalation import Budgets, Do, Escalation, Event
from ._fates import Fates
from ._procfs import PidMark, ProcInfo

COOKIE_ENV = "TRIO_PROCOWN_TEST_COOKIE"
_COOKIE_KEY = COOKIE_ENV.encode() + b"="

Mechanism = Literal["auto", "cgroup", "cookie"]
MECHANISMS: tuple[Mechanism, ...] = ("auto", "cgroup", "cookie")
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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
    fate: str = ""  # as in receipts: "terminated", "killed", "exited", "alive" ("" until settled)
    note: str = ""  # why it was not signalled, when it was not
    role: str = ""  # what it is, when known: "a worker of a concurrent.futures.ProcessPoolExecutor"
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
            "note": self.note,
            "role": self.role,
        }

    def credited(self, earlier: LeakedProcess | None) -> LeakedProcess:
        """This finding, credited as an `earlier` one of the same process
        (by a window that spared it) says: who started it, and as what."""
        if earlier is None:
            return self
        return replace(self, started_by=earlier.started_by, phase=earlier.phase, role=earlier.role)

    def describe(self) -> str:
        """A few lines naming the process, for reports."""
        started = self.started_by + (f" (during {self.phase})" if self.phase else "")
        lived = "unknown" if self.lived is None else f"{self.lived:.2f} s"
        parent = f"pid {self.ppid}" + (f" ({_short(self.parent)})" if self.parent else "")
        fate = (self.fate or "not settled") + (f" ({self.note})" if self.note else "")
        lines = [f"pid {self.pid}: {_short(self.cmdline) or '(no command line)'}"]
        if self.role:
            lines.append(f"    what: {self.role}")
        lines += [
            f"    started by: {started}; lived {lived}",
            f"    parent: {parent}",
            f"    found by: {', '.join(self.found_by)}; fate: {fate}",
        ]
        return "\n".join(lines)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_leaks(owner: str, leaks: list[LeakedProcess], mechanism: str) -> str:
    """The human report for `leaks` left by `owner`."""
    lines = [f"{owner} left {len(leaks)} process(es) running:"]
    for leak in leaks:
        lines.extend("  " + line for line in leak.describe().splitlines())
    lines.append(f"(trio_procown leak check; tracked by {mechanism})")
    return "\n".join(lines)


def _age(info: ProcInfo) -> float | None:
    """Seconds since the process of `info` started (see _procfs.process_info)."""
    if not _procfs.IS_LINUX:
        return max(0.0, time.time() - info.start / 1_000_000)
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - info.start / _HZ)


# -- the cookie ---------------------------------------------------------------------


def _chain_phase(chain: str, token: str) -> str | None:
    """The phase recorded with `token` in a cookie chain, or None if absent."""
    for element in chain.split(":"):
        tok, _, phase = element.partition(".")
        if tok == token:
            return phase
    return None


def _environ_phase(pid: int, token: str) -> str | None:
    """The phase `token` has in the cookie of `pid`'s environment, or None."""
    entry = _procfs.environ_entry(pid, _COOKIE_KEY)
    return None if entry is None else _chain_phase(entry[len(_COOKIE_KEY) :].decode(errors="replace"), token)


def cookie_scan(token: str, since: PidMark | None = None) -> dict[int, str]:
    """Every process whose environment carries the window token `token`:
    pid -> phase. With `since` (a mark taken before the token was set), only
    the pids allocated after it are read, when that is provably complete.
    """
    me = os.getpid()
    pids: Iterable[int]
    pids = _procfs.candidate_pids(_procfs.ranges_since(since)) if _procfs.IS_LINUX else psutil.pids()
    found: dict[int, str] = {}
    for pid in pids:
        if pid != me:
            phase = _environ_phase(pid, token)
            if phase is not None:
                found[pid] = phase
    return found


# -- the fork log -------------------------------------------------------------------


class _ForkLog:
    """Children forked (without exec) by this process, reported by themselves.

    Each child writes "pid start role chain" into a pipe from an after-fork
    hook; the role says whose code forked it (a process pool's, found on the
    forking thread's stack, or "-").
    The forking parent waits (at most FORK_SYNC_WAIT) until its child has
    done so, through a pipe of its own per fork that the child closes after
    writing: a child that forks and exits at once (a double-forking daemon)
    has reported its own child before it can exit, so a scan after the
    window never misses a record still in flight. Only forks made while a
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
        self._lock = threading.Lock()
        self._in_flight: set[int] = set()  # every fork's sync pipe fds, until its parent closes them
        self.records: dict[int, tuple[int, str, str]] = {}  # pid -> (start, role, cookie chain)

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
        self._local.locked = False
        try:
            if os.environ.get(COOKIE_ENV):
                self._local.role = _forking_role()
                # One sync pipe in the making at a time, held until the fork
                # is done: a fork from another thread then sees every sync
                # pipe of ours in _in_flight, and its child closes them (else
                # it would hold our write end, and we would wait for it).
                self._local.locked = self._lock.acquire(timeout=self.FORK_SYNC_WAIT)
                sync = os.pipe()
                self._in_flight.update(sync)
                self._local.sync = sync
        except BaseException:  # never disturb the fork
            pass

    def _unlock(self) -> None:
        if getattr(self._local, "locked", False):
            self._local.locked = False
            with contextlib.suppress(RuntimeError):
                self._lock.release()

    def _in_child(self) -> None:
        sync: tuple[int, int] | None = getattr(self._local, "sync", None)
        self._local.sync = None
        self._unlock()
        for fd in list(self._in_flight):  # other threads' forks' sync pipes, not ours to hold
            if sync is None or fd not in sync:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._in_flight.clear()
        try:
            chain = os.environ.get(COOKIE_ENV)
            if chain:
                pid = os.getpid()
                info = _procfs.process_info(pid)
                if info is not None:
                    role = getattr(self._local, "role", "-")
                    os.write(self._write_fd, f"{pid} {info.start} {role} {chain}\n".encode())
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
            self._unlock()
            return
        read_fd, write_fd = sync
        try:
            self._in_flight.discard(write_fd)
            os.close(write_fd)
            self._unlock()
            poller = select.poll()
            poller.register(read_fd, select.POLLIN | select.POLLHUP)
            poller.poll(int(self.FORK_SYNC_WAIT * 1000))  # EOF: the child wrote (or died)
        except BaseException:
            pass
        finally:
            self._unlock()
            self._in_flight.discard(read_fd)
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
            parts = line.decode(errors="replace").split(" ", 3)
            if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
                self.records[int(parts[0])] = (int(parts[1]), parts[2], parts[3])
        for pid, (start, _, _) in list(self.records.items()):
            if not is_running(pid, start):
                del self.records[pid]

    def matches(self, token: str) -> dict[int, str]:
        """Live recorded children whose cookie chain holds `token`: pid -> phase."""
        self.drain()
        found = {}
        for pid, (_, _, chain) in self.records.items():
            phase = _chain_phase(chain, token)
            if phase is not None:
                found[pid] = phase
        return found

    def owns(self, pid: int, token: str, start: int) -> bool:
        record = self.records.get(pid)
        return record is not None and record[0] == start and _chain_phase(record[2], token) is not None

    def role(self, pid: int) -> str:
        """What forked `pid`, when it was a process pool ("" otherwise)."""
        record = self.records.get(pid)
        return _ROLES.get(record[1], "") if record is not None else ""


_FORK_LOG = _ForkLog()


def is_running(pid: int, start: int) -> bool:
    """Is `pid` still the process that started at `start`, and not a zombie?"""
    info = _procfs.process_info(pid)
    return info is not None and not info.zombie and info.start == start


# -- process pools and multiprocessing's helpers ------------------------------------
# The stdlib keeps a pool's workers, and its helpers' pids, in private
# attributes; they are read defensively (an unknown layout finds nothing, so
# the worst outcome is the behaviour without this: the window blames them).

_HELD_SEARCH_LIMIT = 1000  # objects looked at per value, so a huge fixture value costs little


def _popen(obj: Any) -> tuple[str, list[int]] | None:
    return ("a subprocess.Popen", [obj.pid]) if obj.returncode is None else None


def _mp_process(obj: Any) -> tuple[str, list[int]] | None:
    return ("a multiprocessing.Process", [obj.pid]) if isinstance(obj.pid, int) else None


def _executor(obj: Any) -> tuple[str, list[int]]:
    pids = [pid for pid in dict(getattr(obj, "_processes", None) or {}) if isinstance(pid, int)]
    return "a worker of a concurrent.futures.ProcessPoolExecutor", pids


def _mp_pool(obj: Any) -> tuple[str, list[int]]:
    pids = [p.pid for p in list(getattr(obj, "_pool", None) or []) if p.pid]
    return "a worker of a multiprocessing.pool.Pool", pids


# The process pools and handles recognised, first match first: (module,
# class, what its processes are and their pids). A module not imported
# has none.
_HANDLES: tuple[tuple[str, str, Callable[[Any], tuple[str, list[int]] | None]], ...] = (
    ("subprocess", "Popen", _popen),
    ("multiprocessing.process", "BaseProcess", _mp_process),
    ("asyncio.subprocess", "Process", lambda obj: ("an asyncio.subprocess.Process", [obj.pid])),
    ("trio", "Process", lambda obj: ("a trio.Process", [obj.pid])),
    ("concurrent.futures.process", "ProcessPoolExecutor", _executor),
    ("multiprocessing.pool", "Pool", _mp_pool),
)


def _handle_kinds() -> list[tuple[type, Callable[[Any], tuple[str, list[int]] | None]]]:
    """_HANDLES's classes of the modules imported so far, with their readers."""
    kinds = ((getattr(sys.modules.get(module), name, None), read) for module, name, read in _HANDLES)
    return [(kind, read) for kind, read in kinds if isinstance(kind, type)]


def _held_by(obj: object) -> tuple[str, list[int]] | None:
    """If `obj` is a process pool or a handle on one process: what its
    processes are (as a report names them) and their pids."""
    for kind, read in _handle_kinds():
        if isinstance(obj, kind):
            return read(obj)
    return None


def held_processes(value: object, depth: int = 4) -> dict[int, str]:
    """Pids held by the process pools and process handles (subprocess.Popen,
    multiprocessing, asyncio and trio processes) in `value`, and what each
    is: the value itself, or reachable from it through attributes and
    containers, `depth` levels deep (execnet's Group -> its gateways -> each
    one's io -> its Popen is four), at most _HELD_SEARCH_LIMIT objects
    looked at."""
    found: dict[int, str] = {}
    seen: set[int] = set()
    level: list[object] = [value]
    for _ in range(depth + 1):
        below: list[object] = []
        for obj in level[: _HELD_SEARCH_LIMIT - len(seen)]:
            if id(obj) in seen or isinstance(obj, str | bytes | int | float | type(None)):
                continue
            seen.add(id(obj))
            try:
                held = _held_by(obj)
                if held is not None:
                    what, pids = held
                    found.update(dict.fromkeys(pids, what))
                elif isinstance(obj, dict):
                    below.extend(obj.values())
                elif isinstance(obj, list | tuple | set | frozenset):
                    below.extend(obj)
                elif not isinstance(obj, type) and isinstance(getattr(obj, "__dict__", None), dict):
                    below.extend(vars(obj).values())
            except Exception:  # a proxy that refuses to be looked at holds no pool we can see
                continue
        level = below
    return found


# A library's process-wide helper. jedi starts one inference subprocess per
# interpreter and keeps it (in a cache of one of its module's functions)
# for every later call: killed as the first test's leak, it breaks every
# later test that uses jedi. So a leaked process whose handle is still
# alive after the sweep's garbage collection, and held by something other than the
# run's tests, is spared: found by walking up from the handle through what
# refers to it. A frame holding it is a test's (a failed test's frames are
# kept by its traceback), and so is a namespace or class of a test module
# or conftest; the standard library's modules are registries of what is
# alive, not holders (subprocess._active keeps a Popen dropped while its
# process runs, threading._active every thread, weakref.finalize its
# callbacks), nor are pytest's or this library's; an object of pytest's
# (a fixture's record, a test item) holding it makes it the tests'. Reaching another
# module's namespace or class names the library; a walk that runs out of
# referrer calls first (jedi's: its cache is many objects away) spares it
# as held by an object in this process; one where every path up ends in a
# registry does not (a handle the test dropped).
_RUNNER_MODULES = frozenset({"_pytest", "pytest", "pluggy", "xdist", "execnet"})
_REGISTRY_MODULES = frozenset(sys.stdlib_module_names) | _RUNNER_MODULES | {str(__package__)}
_REFERRER_CALLS = 16  # gc.get_referrers() calls per handle, ~5-30 ms each
NOT_THE_TESTS = ", not by the tests"  # ends the role of a process library_held spares


def library_held(pids: Iterable[int], test_module: Callable[[str, str], bool]) -> dict[int, str]:
    """Which of `pids` a live process handle held by other than the run's
    tests stands for (see above): pid -> what holds it.
    `test_module(name, file)` says whether a module is one of the run's
    tests."""
    wanted = set(pids)
    kinds = tuple(kind for kind, _ in _handle_kinds())
    if not wanted or not kinds:
        return {}
    # (The sweep collected garbage before it settled: a handle dropped in a
    # reference cycle, a finished trio.run's, is gone by now.)
    handles: list[tuple[object, str, list[int]]] = []
    for obj in gc.get_objects():
        if isinstance(obj, kinds):
            held = _held_by(obj)
            if held is not None and wanted.intersection(held[1]):
                handles.append((obj, held[0], [pid for pid in held[1] if pid in wanted]))
    namespaces = {id(vars(mod)): name for name, mod in list(sys.modules.items()) if hasattr(mod, "__dict__")}
    found: dict[int, str] = {}
    for obj, what, held_pids in handles:
        holder = _holder(obj, namespaces, test_module, ignore=handles)
        if holder:
            found.update(dict.fromkeys(held_pids, f"{what} held by {holder}{NOT_THE_TESTS}"))
    return found


def _runners(obj: object) -> bool:
    """Is `obj` an object of pytest's (a fixture's record, a test item)?"""
    return str(getattr(type(obj), "__module__", "")).split(".")[0] in _RUNNER_MODULES


def _holder(
    handle: object, namespaces: dict[int, str], test_module: Callable[[str, str], bool], ignore: object
) -> str:
    """What holds `handle`, if not the run's tests (see above): "module
    NAME"; "an object in this process" when the walk runs out of referrer
    calls first; "" when it reaches the tests or every path up ends in a
    registry (a dropped handle). `namespaces`: id of each module's
    namespace -> its name."""

    def kind(name: str) -> str:
        module = sys.modules.get(name)
        if test_module(name, str(getattr(module, "__file__", None) or "")):
            return "test"
        return "registry" if name.split(".")[0] in _REGISTRY_MODULES else "library"

    frontier = [handle]
    seen = {id(handle), id(ignore), id(frontier)}
    for _ in range(_REFERRER_CALLS):
        if not frontier:
            return ""
        referrers = gc.get_referrers(frontier.pop(0))
        seen.add(id(referrers))
        for referrer in referrers:
            if id(referrer) in seen:
                continue
            seen.add(id(referrer))
            if isinstance(referrer, FrameType) or _runners(referrer):
                return ""  # a test's frame (or a running thread's), pytest's record of a fixture
            name = namespaces.get(id(referrer))
            if name is None and isinstance(referrer, type):
                name = str(getattr(referrer, "__module__", "") or "")  # a class attribute: its module's
            if name is None:
                frontier.append(referrer)
                continue
            found = kind(name)
            if found == "test":
                return ""
            if found == "library":
                return f"module {name}"
    return "an object in this process" if frontier else ""


# Helper processes a library starts once for the whole process and knows
# only by pid (no handle that library_held could find): the module, the
# attribute chain to the pid, and what the helper is. loky's resource
# tracker (also joblib's, whose default backend is loky) ignores SIGINT and
# SIGTERM and is restarted on the next use: killed as a test's leak, each
# test after the first paid the 2 s grace and saw loky's "relaunching"
# warning (measured on loky 3.7.0's own suite: 92 reports, one test failing).
_PROCESS_HELPERS = (
    ("multiprocessing.forkserver", ("_forkserver", "_forkserver_pid"), "multiprocessing's forkserver"),
    ("multiprocessing.resource_tracker", ("_resource_tracker", "_pid"), "multiprocessing's resource tracker"),
    ("loky.backend.resource_tracker", ("_resource_tracker", "_pid"), "loky's resource tracker"),
    (
        "joblib.externals.loky.backend.resource_tracker",
        ("_resource_tracker", "_pid"),
        "joblib's (loky's) resource tracker",
    ),
)


def runner_helpers() -> dict[int, str]:
    """The helper processes libraries keep for this whole process (see
    _PROCESS_HELPERS), and this library's keeper (_keeper.py): they end
    with it."""
    found = {}
    keeper = _keeper.current_pid()
    if keeper:
        found[keeper] = "trio_procown's keeper of this process"
    for module, chain, what in _PROCESS_HELPERS:
        value: object = sys.modules.get(module)
        for name in chain:
            value = getattr(value, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found[value] = f"{what} of this process"
    return found


_ROLES = {
    "concurrent.futures.process": "a worker of a concurrent.futures.ProcessPoolExecutor",
    "multiprocessing.pool": "a worker of a multiprocessing.pool.Pool",
}


def _forking_role() -> str:
    """The pool module whose code is forking now (on this thread's stack), or "-"."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_globals.get("__name__") in _ROLES:
            return str(frame.f_globals["__name__"])
        frame = frame.f_back
    return "-"


# -- cgroups ------------------------------------------------------------------------


def _probe_cgroup() -> tuple[str | None, str]:
    """The cgroup this process is in, if it can move itself into a child of
    it and back; with what windows will use (or why not)."""
    if not _procfs.IS_LINUX:
        return None, "cgroups exist only on Linux"
    if _cgroup.cgroup2_mount() is None:
        return None, "no cgroup v2 hierarchy is mounted"
    here = _cgroup.cgroup_of("self")
    if here is None:
        return None, "this process is in no cgroup v2"
    _cgroup.default_root()  # fix the library's default root before we move (module comment)
    probe = os.path.join(here, f"procown-pytest-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return None, f"cannot create a child cgroup of {here}: {exc.strerror}"
    try:
        _cgroup.move(os.getpid(), probe)
        _cgroup.move(os.getpid(), here)
    except OSError as exc:
        with contextlib.suppress(OSError):
            _cgroup.move(os.getpid(), here)
        return None, f"cannot move this process between cgroups under {here}: {exc.strerror}"
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)
    _sweep_stale_windows(here)
    return here, f"a cgroup v2 per window under {here}"


# A window's cgroup: procown-<kind>-<pid>-<token> (Watch.open), or the probe's.
_WINDOW_NAME = re.compile(r"procown-(?:[a-z]+|pytest-probe)-(\d+)-[0-9a-f]+")


def _sweep_stale_windows(here: str) -> None:
    """Remove the window cgroups that a run killed before its end (SIGTERM,
    SIGKILL: no teardown hook ran) left under `here`, where the next run
    starts: those of a process no longer running, and only while empty
    (rmdir refuses a populated one: what a killed run leaked is left as it
    is, with its cgroup). Never raises."""
    try:
        names = os.listdir(here)
    except OSError:
        return
    for name in names:
        match = _WINDOW_NAME.fullmatch(name)
        if match is None or _running(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            _cgroup.remove_tree(os.path.join(here, name))


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's, but running
    return True


def _populated(path: str) -> bool:
    try:
        return _cgroup.populated(path)
    except OSError:
        return True  # unreadable proves nothing: look at its members


# -- stopping leaks -----------------------------------------------------------------


class _Target:
    """A leak to signal: a pidfd where available, else a psutil.Process
    (which checks the start time before signalling, so a recycled pid is
    not hit)."""

    def __init__(self, pid: int, fd: int | None, proc: psutil.Process | None) -> None:
        self.pid = pid
        self.fd = fd
        self.proc = proc

    @classmethod
    def open(cls, pid: int) -> _Target | None:
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
            _pidfd.close(self.fd)
            self.fd = None


def _wait_exited(targets: list[_Target], timeout: float) -> bool:
    fds = [t.fd for t in targets if t.fd is not None]
    if len(fds) == len(targets):
        return _pidfd.wait_all_exited(fds, timeout)
    return _pidfd.block_until(lambda: all(t.exited() for t in targets), timeout)


# A process found running when a window closes gets this long to end by
# itself before it is a leak: one the test sent SIGKILL may still be on its
# way out (the signal pending, the process not yet a zombie: seen in 45 % of
# tries right after kill()), and one it asked to shut down may be finishing
# (pytest-xdist's own tests leave execnet gateways exiting 20-260 ms later).
SETTLE = 0.3


def _settled(leaks: list[LeakedProcess]) -> list[LeakedProcess]:
    """The `leaks` still running after up to SETTLE seconds (a pidfd wait:
    it returns as soon as all have ended). Garbage is collected first: a
    handle the test dropped in a reference cycle (a pexpect.spawn held by
    an exception's traceback) ends its process in its finalizer, at the
    next collection; that one is not a leak either."""
    if not leaks:
        return leaks
    targets = {leak.pid: _Target.open(leak.pid) for leak in leaks}
    opened = [t for t in targets.values() if t is not None]
    try:
        gc.collect()
        _wait_exited(opened, SETTLE)
        return [leak for leak in leaks if _still_running(leak, targets[leak.pid])]
    finally:
        for target in opened:
            target.close()


def _still_running(leak: LeakedProcess, target: _Target | None) -> bool:
    if target is None:  # no pidfd: gone, or none to be had (EMFILE): read it again
        return is_running(leak.pid, leak.start_key)
    return not target.exited()


def escalate(targets: list[_Target], fates: Fates, budgets: Budgets) -> None:
    """Stop `targets` as an owned command's domain is stopped: the
    Escalation decides (SIGTERM+SIGCONT, grace, SIGKILL, kill_wait); `fates`
    records who was alive at each signal."""
    machine = Escalation(budgets)
    action = machine.handle(Event.STOP, cause="stopped")
    while action in (Do.SIGNAL_GRACEFUL, Do.SIGNAL_FORCE):
        force = action is Do.SIGNAL_FORCE
        live = [t for t in targets if not t.exited()]
        fates.before_signal({t.pid for t in live}, kill=force)
        for target in live:
            if force:
                target.send(signal.SIGKILL)
            elif target.send(signal.SIGTERM):
                target.send(signal.SIGCONT)
        gone = _wait_exited(live, machine.budget())
        action = machine.handle(Event.EMPTY if gone else Event.EXPIRED)


# -- windows ------------------------------------------------------------------------


class Tracker:
    """How windows track and stop processes: the mechanisms of this run and
    the budgets of its teardown (one per pytest config; a default one for
    NoLeaks outside pytest)."""

    def __init__(
        self,
        mechanism: Mechanism = "auto",
        grace: float = DEFAULT_GRACE,
        kill_wait: float = DEFAULT_KILL_WAIT,
    ) -> None:
        self.mechanism = mechanism
        self.budgets = Budgets(grace=grace, kill_wait=kill_wait, drain_wait=0.0)
        self._base: str | None = None  # the cgroup this process was in when windows began
        self._probed = False
        self.cgroup_note = ""
        self.leftover_cgroups: list[str] = []

    def cgroup_base(self) -> str | None:
        """Where this process was before its first window, when this run
        tracks with cgroups."""
        if not self._probed:
            self._probed = True
            if self.mechanism == "cookie":
                self.cgroup_note = "cgroups not used (mechanism=cookie)"
            else:
                self._base, self.cgroup_note = _probe_cgroup()
        return self._base

    def describe(self) -> str:
        cookie = f"the environment cookie {COOKIE_ENV} and the fork log"
        if self.cgroup_base() is not None:
            return f"{self.cgroup_note}, {cookie}"
        return f"{cookie} (no cgroup: {self.cgroup_note})"

    def cgroups_lost(self, why: str) -> None:
        self._base = None
        self.cgroup_note = why

    def remove_leftovers(self) -> None:
        """Try again to remove the cgroups that had to stay (kept leaks may have ended)."""
        self.leftover_cgroups = [p for p in self.leftover_cgroups if _cgroup.remove_tree(p)[1]]


Exclude = Callable[[int, int], bool]  # (pid, start) -> not this window's business


class Watch:
    """One window: everything this process starts between open() and close()."""

    def __init__(self, tracker: Tracker, owner: str, kind: str = "block") -> None:
        self.tracker = tracker
        self.owner = owner
        self.kind = kind
        self.token = secrets.token_hex(8)
        self.phase = ""
        self.cgroup: str | None = None
        self.active = False
        self.spared: list[LeakedProcess] = []  # found, but named by `spare` as not ours
        self._outer_env: str | None = None
        self._outer_cgroup: str | None = None
        self._mark: PidMark | None = None

    # -- lifecycle --------------------------------------------------------
    def open(self, phase: str) -> None:
        _FORK_LOG.install()
        self._mark = _procfs.pid_mark()
        self._outer_env = os.environ.get(COOKIE_ENV)
        self.phase = phase
        self._set_env()
        self.active = True
        if self.tracker.cgroup_base() is None:
            return
        path = ""
        try:
            outer = _cgroup.cgroup_of("self")
            if outer is None:
                raise OSError("this process is in no cgroup v2 any more")
            path = os.path.join(outer, f"procown-{self.kind}-{os.getpid()}-{self.token}")
            os.mkdir(path)
            _cgroup.move(os.getpid(), path)
        except OSError as exc:
            if path:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            self.tracker.cgroups_lost(f"cgroups stopped working: {exc}")
            return
        self.cgroup, self._outer_cgroup = path, outer

    def _set_env(self) -> None:
        element = f"{self.token}.{self.phase}"
        os.environ[COOKIE_ENV] = f"{self._outer_env}:{element}" if self._outer_env else element

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        if self.active:
            self._set_env()

    def suspend(self) -> None:
        """Step out: this process is no longer in the window (env and cgroup)."""
        if not self.active:
            return
        self.active = False
        if self._outer_env is None:
            os.environ.pop(COOKIE_ENV, None)
        else:
            os.environ[COOKIE_ENV] = self._outer_env
        if self.cgroup is not None:
            self._move_out(os.getpid())

    def _move_out(self, pid: int) -> None:
        """Into the enclosing window's cgroup; if that is gone, where we began."""
        for where in (self._outer_cgroup, self.tracker.cgroup_base()):
            if where is not None:
                with contextlib.suppress(OSError):
                    _cgroup.move(pid, where)
                    return

    def resume(self) -> None:
        if self.active:
            return
        self._set_env()
        self.active = True
        if self.cgroup is not None:
            _cgroup.move(os.getpid(), self.cgroup)

    def close(self) -> None:
        self.suspend()

    # -- findings ---------------------------------------------------------
    def mechanism(self) -> str:
        parts = [f"cgroup {self.cgroup}"] if self.cgroup else []
        text = ", ".join([*parts, f"cookie {COOKIE_ENV}", "fork log"])
        if not self.cgroup and self.tracker.cgroup_note:
            text += f"; {self.tracker.cgroup_note}"
        return text

    def find(self, exclude: Exclude | None = None) -> list[LeakedProcess]:
        """Live processes started in this window (call after close())."""
        found: dict[int, set[str]] = {}
        phases: dict[int, str] = {}
        if self.cgroup is not None and _populated(self.cgroup):
            for pid in _cgroup.tree_pids(self.cgroup):
                found.setdefault(pid, set()).add("cgroup")
        cookie, forked = cookie_scan(self.token, self._mark), _FORK_LOG.matches(self.token)
        for source, hits in (("cookie", cookie), ("fork log", forked)):
            for pid, phase in hits.items():
                found.setdefault(pid, set()).add(source)
                phases.setdefault(pid, phase)
        me = os.getpid()
        leaks = []
        order = ("cgroup", "cookie", "fork log")
        for pid in sorted(found):
            info = _procfs.process_info(pid)
            if pid == me or info is None or info.zombie:
                continue
            if exclude is not None and exclude(pid, info.start):
                continue
            leaks.append(
                LeakedProcess(
                    pid=pid,
                    cmdline=_procfs.cmdline(pid),
                    ppid=info.ppid,
                    parent=_procfs.cmdline(info.ppid) if info.ppid > 0 else "",
                    lived=_age(info),
                    started_by=self.owner,
                    phase=phases.get(pid, ""),
                    found_by=tuple(s for s in order if s in found[pid]),
                    role=_FORK_LOG.role(pid),
                    start_key=info.start,
                )
            )
        return leaks

    def owns(self, pid: int, start: int) -> bool:
        """Is `pid` (with start time `start`) still provably ours? Checked
        right before signalling."""
        if not is_running(pid, start):
            return False
        if self.cgroup is not None and pid in _cgroup.tree_pids(self.cgroup):
            return True
        return _environ_phase(pid, self.token) is not None or _FORK_LOG.owns(pid, self.token, start)

    def terminate(self, leaks: list[LeakedProcess]) -> list[LeakedProcess]:
        """Stop `leaks` with the library's ladder; each with its fate."""
        fates = Fates()
        targets: list[_Target] = []
        notes: dict[int, str] = {}
        try:
            for leak in leaks:
                fates.watch(ProcInfo(leak.pid, leak.ppid, 0, "S", leak.start_key), leak.cmdline)
                target = _Target.open(leak.pid)
                if target is None:
                    continue
                if self.owns(leak.pid, leak.start_key):
                    targets.append(target)
                else:
                    target.close()
                    notes[leak.pid] = "not signalled: its ownership could no longer be verified"
            escalate(targets, fates, self.tracker.budgets)
        finally:
            for target in targets:
                target.close()
        return [replace(leak, fate=fates.fate(leak.pid), note=notes.get(leak.pid, "")) for leak in leaks]

    def sweep(
        self,
        keep: bool,
        exclude: Exclude | None = None,
        spare: Callable[[list[int]], Mapping[int, str]] | None = None,
    ) -> list[LeakedProcess]:
        """Find the leaks of this closed window and (unless `keep`) stop
        them, and anything they started meanwhile. Processes that
        `spare(pids of the leaks)` names (pid -> what they are) are not
        leaks: they go to `spared` and leave the window's cgroup for the
        enclosing one."""
        leaks = _settled(self.find(exclude))
        if spare is not None and leaks:
            owners = dict(spare([leak.pid for leak in leaks]))
            # What a spared process started is the holder's too (execnet's
            # proxy gateway: a child of a gateway a session fixture holds).
            grown = True
            while grown:
                grown = False
                for leak in leaks:
                    if leak.pid not in owners and leak.ppid in owners:
                        owners[leak.pid] = f"started by pid {leak.ppid}, {owners[leak.ppid]}"
                        grown = True
            self.spared = [replace(leak, role=owners[leak.pid]) for leak in leaks if leak.pid in owners]
            for leak in self.spared if self.cgroup is not None else ():
                self._move_out(leak.pid)
            leaks = [leak for leak in leaks if leak.pid not in owners]
            exclude = _excluding({(leak.pid, leak.start_key) for leak in self.spared}, exclude)
        if keep:
            return [replace(leak, fate="alive", note="kept running, as asked") for leak in leaks]
        if not leaks:
            return []
        done = self.terminate(leaks)
        seen = {leak.pid for leak in done}
        for _ in range(2):  # what they started while we were stopping them
            more = [leak for leak in self.find(exclude) if leak.pid not in seen]
            if not more:
                break
            done.extend(self.terminate(more))
            seen.update(leak.pid for leak in more)
        if self.cgroup is not None and _populated(self.cgroup):
            self._kill_cgroup(self.cgroup)
        return done

    def _kill_cgroup(self, path: str) -> None:
        # Still forking: the cgroup holds only our tree (spared ones left it), kill it whole.
        try:
            _cgroup.kill(path)
        except OSError:  # no cgroup.kill (Linux < 5.14): member by member
            pids = _cgroup.tree_pids(path)
            _cgroup.signal_each(pids, (signal.SIGKILL,), lambda: _cgroup.tree_pids(path), [])
        _pidfd.block_until(lambda: not _populated(path), self.tracker.budgets.kill_wait)

    def release(self) -> bool:
        """Remove the window's cgroup (False if it must stay: still populated)."""
        if self.cgroup is None:
            return True
        if not _cgroup.remove_tree(self.cgroup)[1]:
            return True
        # Kept leaks: move them to the enclosing window's cgroup, so this one can go.
        for pid in _cgroup.tree_pids(self.cgroup):
            self._move_out(pid)
        if not _cgroup.remove_tree(self.cgroup)[1]:
            return True
        self.tracker.leftover_cgroups.append(self.cgroup)
        return False


def _excluding(pairs: set[tuple[int, int]], also: Exclude | None) -> Exclude:
    return lambda pid, start: (pid, start) in pairs or (also is not None and also(pid, start))


# -- a watched block ----------------------------------------------------------------

_default_tracker: Tracker | None = None


def _tracker_outside_pytest() -> Tracker:
    global _default_tracker
    if _default_tracker is None:
        _default_tracker = Tracker()
    return _default_tracker


class NoLeaks:
    """Context manager (sync or async): raise ProcessLeakError if the block
    leaves a process running; the leaks are stopped first unless `keep`.

    It tracks like a test's window of the pytest plugin: where cgroups are
    writable this process itself sits in a child cgroup for the duration of
    the block. Everything the process starts meanwhile counts, from any
    thread or task; multiprocessing's own helpers (forkserver, resource
    tracker) do not. If the block raises, its exception propagates with the
    report as a note.

    Synopsis::

        with trio_procown.NoLeaks():
            subprocess.run(["sh", "-c", "sleep 0.1 & wait"], check=True)  # waits for its child
    """

    def __init__(
        self, *, keep: bool = False, owner: str = "a no_leaks block", tracker: Tracker | None = None
    ) -> None:
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

    def _settle(self) -> list[LeakedProcess]:
        watch = self._watch
        assert watch is not None
        leaks = watch.sweep(self.keep, spare=lambda found: runner_helpers())
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
        assert self._watch is not None
        self._watch.close()
        self.leaks = self._settle()
        self._raise(exc)

    async def __aenter__(self) -> NoLeaks:
        return self.__enter__()

    async def __aexit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._watch is not None
        self._watch.close()
        if self._watch.find():  # stopping them waits: keep the event loop running meanwhile
            self.leaks = await trio.to_thread.run_sync(self._settle)
        else:
            self._watch.release()
        self._raise(exc)


def no_leaks(*, keep: bool = False) -> NoLeaks:
    """A block that must not leave processes running (see NoLeaks).

    Synopsis::

        with no_leaks():
            subprocess.run(["true"], check=True)
    """
    return NoLeaks(keep=keep)
