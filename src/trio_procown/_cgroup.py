# The cgroup v2 domain (Linux).
#
# Each owned command gets a fresh child cgroup under a writable cgroup v2
# directory: TRIO_PROCOWN_CGROUP_ROOT if set, otherwise the caller's own
# cgroup (from /proc/self/cgroup) under the cgroup2 mount (from
# /proc/self/mountinfo; on hybrid hosts it is /sys/fs/cgroup/unified). A
# cgroup holds every descendant, setsid() and double-forked daemons
# included, and no process can leave it without write access to cgroup files.
#
# Entering the cgroup must happen *before* the command can fork: moving the
# pid after spawn loses the race to a command that forks at once. Where the
# probe finds it works, the command is created inside its cgroup by the
# spawner (clone3 with CLONE_INTO_CGROUP, _shim/spawn_into.c through
# ctypes): no process is moved, so no move's RCU wait (~10 ms after idle on
# a mount without favordynmods). Otherwise the spawn goes through a shim
# that writes 0 (itself) to the cgroup's cgroup.procs and then execs the
# command: a freestanding or a glibc C program where a C compiler exists,
# otherwise a /bin/sh one-liner; all are race-free. How they are built,
# what each costs and when a compiled one is trusted: _placement.py.
#
# Teardown: SIGTERM and SIGCONT to every pid in cgroup.procs, through pidfds
# that are kept only for pids still listed after they were opened (so a
# recycled pid is never signalled); force is a write of 1 to cgroup.kill,
# which the kernel applies atomically to the whole subtree. "Empty" is
# "populated 0" in cgroup.events; we wait for it with an inotify watch on that
# file (the kernel signals the change as POLLPRI, which trio cannot wait for).
# The cgroup is removed at the end and never reused: a cgroup that has seen
# cgroup.kill kills children cloned into it later.

from __future__ import annotations

import errno
import itertools
import os
import signal
import subprocess
from collections.abc import Callable, Collection, Sequence
from functools import cache, partial
from typing import Literal

import trio

from . import _inotify, _pidfd, _procfs, _stale
from ._domain import Domain, ProcessGroupDomain, Sent, describe_error, killpg_owned, signal_names, unchanged
from ._errors import DomainUnavailable
from ._leader import Leader
from ._placement import loaded_lister, run_quietly, shim_argv
from ._procfs import ProcessTable, ProcInfo

ROOT_ENV = "TRIO_PROCOWN_CGROUP_ROOT"

_counter = itertools.count()


@cache
def cgroup2_mount() -> str | None:
    """The first cgroup2 mount point, from /proc/self/mountinfo (cached)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split(" ")[4]
    except OSError:
        return None
    return None


def mount_options() -> set[str]:
    """The super-block options of the cgroup2 mount (e.g. favordynmods)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                _, _, right = line.partition(" - ")
                parts = right.split()
                if parts and parts[0] == "cgroup2":
                    return set(parts[2].split(",")) if len(parts) > 2 else set()
    except OSError:
        pass
    return set()


def spawn_cost_note() -> str | None:
    """A note on this machine's cgroup spawn cost, or None.

    Entering a cgroup takes a kernel lock whose write side waits for an RCU
    grace period unless another move happened moments before: measured on
    the project's machines, ~10 ms for a command spawned after 20 ms or more
    of idleness, ~1 ms back to back. The cgroup2 mount option favordynmods
    removes that wait.
    """
    if cgroup2_mount() is None or "favordynmods" in mount_options():
        return None
    root = default_root()
    if root is not None and unavailable_reason(root) is None and spawns_into(os.path.realpath(root)):
        return None  # commands are created inside their cgroup: no move, no wait
    return (
        "cgroup2 is mounted without favordynmods: entering a cgroup may wait for an RCU grace "
        "period (~10 ms for a command spawned after idling); remount with favordynmods to avoid it"
    )


# What `procown doctor` measures (spawn_costs): samples per figure, the
# idle gap before each "after idle" sample, and the bound on each command.
COST_SAMPLES = 5
COST_IDLE = 0.05
_COST_WAIT = 5.0


def spawn_costs() -> dict[str, float] | None:
    """Measure, now, what starting /bin/true through the spawner costs here
    (median seconds from the call to its return): into a fresh child cgroup
    back to back ("into a cgroup") and after COST_IDLE of idleness ("into a
    cgroup after idle"), and into our own cgroup after the same idleness
    ("own cgroup after idle": the kernel's baseline). None where commands
    are not created inside their cgroup here (no spawner, no usable root).

    Measured on the project's machines (Linux 6.18, 2 vCPUs): ~0.2 ms back
    to back; after 50 ms idle ~0.6-1.3 ms, depending on what ran before
    (against ~0.4 ms in our own cgroup): no process is moved, yet the first
    fork into another cgroup after an idle spell pays extra, and remounting
    with favordynmods did not change that (tried once). Each command is waited
    for at most _COST_WAIT; the cgroups are named as command cgroups are, so
    a stale one is swept like theirs."""
    import statistics
    import time

    from ._placement import spawn_into

    root = default_root()
    if root is None or unavailable_reason(root) is not None or not spawns_into(os.path.realpath(root)):
        return None
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    env = [b"PATH=" + os.fsencode(os.defpath)]

    def one(cgroup_fd: int) -> float:
        start = time.perf_counter()
        _pid, pidfd, _ = spawn_into("/bin/true", ["/bin/true"], env, "/", (null, null, null), cgroup_fd)
        took = time.perf_counter() - start
        try:
            if not _pidfd.wait_all_exited([pidfd], _COST_WAIT):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            _pidfd.reap_exited(pidfd)
        finally:
            os.close(pidfd)
        return took

    def in_fresh(idle: float) -> float:
        path = os.path.join(root, _stale.cgroup_name(next(_counter)))
        os.mkdir(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                time.sleep(idle)
                return one(fd)
            finally:
                os.close(fd)
        finally:
            remove_tree(path)

    def in_own() -> float:
        fd = os.open(own_cgroup_dir() or root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            time.sleep(COST_IDLE)
            return one(fd)
        finally:
            os.close(fd)

    try:
        in_fresh(0)  # warm: the first spawn of a process loads the spawner
        figures = {"into a cgroup": [in_fresh(0) for _ in range(COST_SAMPLES)]}
        figures["into a cgroup after idle"] = [in_fresh(COST_IDLE) for _ in range(COST_SAMPLES)]
        figures["own cgroup after idle"] = [in_own() for _ in range(COST_SAMPLES)]
    except OSError:
        return None
    finally:
        os.close(null)
    return {name: statistics.median(taken) for name, taken in figures.items()}


def placement_method() -> str:
    """How a command gets into its cgroup here (for `procown doctor`)."""
    root = default_root()
    if root is None or unavailable_reason(root) is not None:
        return "none (no usable cgroup root)"
    if spawns_into(os.path.realpath(root)):
        return "created inside its cgroup (clone3 CLONE_INTO_CGROUP): no process is moved"
    from ._placement import compiled_shim

    shim = "a compiled shim" if compiled_shim() is not None else "a /bin/sh shim"
    return f"moved in by {shim} before it execs the command"


def own_cgroup_dir() -> str | None:
    """Our own cgroup v2 directory, or None without cgroup v2."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    return cgroup_of("self") or mount


def default_root() -> str | None:
    return os.environ.get(ROOT_ENV) or _own_cgroup_dir_cached()


@cache
def _own_cgroup_dir_cached() -> str | None:
    return own_cgroup_dir()


# Roots whose commands are created inside their cgroup by the spawner
# (clone3 CLONE_INTO_CGROUP, _placement.spawn_into) rather than moved there
# by a shim: decided by the probe, which tries the spawner first.
_SPAWNS_INTO: set[str] = set()


def spawns_into(root: str) -> bool:
    """Commands under `root` start inside their cgroup (no shim, no move)."""
    return root in _SPAWNS_INTO


def _spawner_enters(probe: str) -> bool:
    """The spawner starts a process inside the cgroup `probe` (and it ran)."""
    from ._placement import STATUS_LOST, compiled_spawner, spawner_trial

    if compiled_spawner() is None:
        return False
    try:
        cgroup_fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return spawner_trial("/bin/true", ["true"], cgroup_fd, 5) in (0, STATUS_LOST)
        finally:
            os.close(cgroup_fd)
    except OSError:  # CloneRefused included: the shim is tried instead
        return False


@cache
def _probe(root: str) -> str | None:
    """Why `root` cannot hold our cgroups, or None when it can (cached)."""
    if not os.path.isdir(root):
        return f"{root} does not exist"
    if not os.path.exists(os.path.join(root, "cgroup.procs")):
        return f"{root} is not a cgroup v2 directory (no cgroup.procs)"
    if not os.access(root, os.W_OK):
        return f"no write permission on {root}"
    probe = os.path.join(root, f"procown-probe-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"cannot create a child cgroup in {root}: {exc.strerror}"
    try:
        if not os.path.exists(os.path.join(probe, "cgroup.events")):
            return f"{root} has no cgroup.events (not cgroup v2)"
        if _spawner_enters(probe):
            _SPAWNS_INTO.add(root)
            return None
        # Prove that a process can enter it: run the real shim once.
        try:
            returncode = run_quietly(shim_argv(os.path.join(probe, "cgroup.procs"), ["/bin/true"]), 5)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot run the cgroup shim: {exc}"
        if returncode != 0:
            return f"a process cannot be moved into a child cgroup of {root}"
        return None
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def unavailable_reason(root: str | None = None) -> str | None:
    """Why the cgroup domain cannot be used here, or None if it can."""
    if not _procfs.IS_LINUX:
        return "cgroups exist only on Linux"
    root = root or default_root()
    if root is None:
        return "no cgroup v2 hierarchy is mounted"
    return _probe(os.path.realpath(root))


@cache
def _usable_root_cached(root: str) -> str:
    reason = unavailable_reason(root)
    if reason is not None:
        msg = f"the cgroup domain is unavailable: {reason}"
        raise DomainUnavailable(msg)
    return os.path.realpath(root)


def _usable_root(root: str | None) -> str:
    if root is None:
        msg = "the cgroup domain is unavailable: no cgroup v2 hierarchy is mounted"
        raise DomainUnavailable(msg)
    return _usable_root_cached(root)


# -- cgroup files ------------------------------------------------------------
# Synchronous operations on any cgroup v2 directory, shared by the domain
# below and the pytest plugin's leak windows (_leaks.py).


def cgroup_of(pid: int | Literal["self"] = "self") -> str | None:
    """The cgroup v2 directory `pid` is in (zombies included), or None."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    mount = cgroup2_mount()
    if mount is None:
        return None
    for line in lines:
        if line.startswith(b"0::"):
            return os.path.normpath(os.path.join(mount, os.fsdecode(line[3:]).lstrip("/")))
    return None


def move(pid: int, path: str) -> None:
    """Move the process `pid` (every thread of it) into the cgroup `path`."""
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def populated(path: str) -> bool:
    """Does cgroup.events of `path` say "populated 1"? False once the cgroup
    is gone. A file that cannot be read raises OSError: it proves nothing."""
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.isdir(path):
            raise
        return False
    try:
        text = os.read(fd, 4096)  # one read: a few short lines, generated whole
    finally:
        os.close(fd)
    return _says_populated(text)


def populated_at(fd: int, path: str) -> bool:
    """populated(path), read through `fd`, a descriptor kept open on its
    cgroup.events (a read from offset 0 generates the file afresh: ~1 us,
    against ~11 us for open, read and close, and much more while thousands
    of teardowns' processes exit and their cgroups are removed)."""
    try:
        text = os.pread(fd, 4096, 0)
    except OSError as exc:
        if exc.errno == errno.ENODEV and not os.path.isdir(path):
            return False  # the cgroup was removed: its files read ENODEV
        raise
    return _says_populated(text)


def _says_populated(text: bytes) -> bool:
    for line in text.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key == b"populated":
            return value.strip() != b"0"
    return True  # no "populated" line: nothing proves it empty


def subtree(path: str) -> list[str]:
    """The cgroup `path` and its descendants, deepest first."""
    try:
        # cgroupfs (kernfs) counts a directory's links as 2 + its child
        # directories: 2 means no child cgroup, and no listing to read.
        if os.stat(path).st_nlink == 2:
            return [path]
    except OSError:
        return [path]
    found: list[str] = []
    _walk_dirs(path, found)
    return found or [path]


def _walk_dirs(where: str, found: list[str]) -> None:
    # os.walk(topdown=False) without its generators: this runs for every
    # member listing of every teardown. A directory that cannot be read is
    # left out, as os.walk does.
    try:
        with os.scandir(where) as entries:
            dirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for child in dirs:
        _walk_dirs(child, found)
    found.append(where)


def tree_pids(path: str, failures: list[str] | None = None) -> list[int]:
    """Every pid listed in the cgroup `path` and its descendants; a listing
    that cannot be read is described in `failures`."""
    pids: list[int] = []
    for where in subtree(path):
        try:
            pids.extend(int(x) for x in _read_all(os.path.join(where, "cgroup.procs")).split())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            if failures is not None:
                failures.append(f"reading {where}/cgroup.procs: {exc}")
    return pids


def _read_all(path: str) -> bytes:
    """The whole file at `path`, read without Python's buffered text layer
    (this runs for every member listing of every teardown)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# Where the spawner is loaded, the graceful stage's second half lists the
# cgroup tree in C (procown_members; tests turn it off). On the loop: in the
# signaller thread the listing doubled each job's time there (0.34-0.45 ms
# to 0.83-0.94 ms, 500 commands), and the SIGTERM of the last of 2,000
# commands went out 1.7-2.3 s after the stop instead of 1.1-1.5 s.
NATIVE_LISTING = True


def native_members(path: str, failures: list[str]) -> list[tuple[int, int, int]] | None:
    """(pid, process group, start time) of every process listed in the
    cgroup `path` and its descendants, read by the spawner's C lister (in a
    burst, 110-150 us a command on the loop against 150-290 us for
    tree_pids and a read_stat each); pids gone before their stat was read
    are left out, listings that could not be read are described in
    `failures`. None where no spawner is loaded (the caller lists in
    Python)."""
    lister = loaded_lister() if NATIVE_LISTING else None
    if lister is None:
        return None
    import ctypes

    need = ctypes.c_long(0)
    cap = 4096
    for _ in range(3):  # the tree may grow between two listings
        out = ctypes.create_string_buffer(cap)
        n = lister(os.fsencode(path), out, cap, ctypes.byref(need))
        if n != -2:
            break
        cap = need.value + need.value // 4 + 256
    if n < 0:
        return None
    found = []
    for line in ctypes.string_at(out, n).decode("utf-8", "surrogateescape").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "P":
            pid, pgrp, start = rest.split(" ")
            found.append((int(pid), int(pgrp), int(start)))
        elif kind == "E":
            code, _, where = rest.partition(" ")
            failures.append(f"reading {where}/cgroup.procs: {os.strerror(int(code))}")
    return found


def kill(path: str) -> None:
    """SIGKILL the whole cgroup tree `path` atomically (cgroup.kill, Linux
    5.14+). FileNotFoundError: no cgroup.kill, or no cgroup."""
    fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)


def signal_each(
    pids: list[int], sigs: tuple[int, ...], listed: Callable[[], Collection[int]], failed: list[str]
) -> int:
    """Send `sigs` to each pid through a pidfd kept only if the pid is still
    in `listed()` after opening it (never a recycled pid); count reached.
    Every refusal is described in `failed` and the next pid is still tried."""
    fds: dict[int, int | None] = {}
    for pid in pids:
        try:
            fds[pid] = _pidfd.open_pidfd(pid)
        except OSError as exc:
            failed.append(f"pid {pid}: {describe_error(exc)}")
    if not any(fd is not None for fd in fds.values()):
        return 0  # nobody to check against a fresh listing
    still = set(listed())
    sent = 0
    for pid, fd in fds.items():
        if fd is None:
            continue
        try:
            if pid in still and _pidfd.send(fd, sigs[0]):
                for sig in sigs[1:]:
                    _pidfd.send(fd, sig)
                sent += 1
        except OSError as exc:
            failed.append(f"pid {pid}: {describe_error(exc)}")
        finally:
            _pidfd.close(fd)
    return sent


# Cgroups a teardown could not remove because they were still populated when
# its bound ran out (members a SIGKILL had not yet ended, a member in
# uninterruptible sleep): removed, once empty, at this process's next cgroup
# spawn or at its exit. Only rmdir: nothing is signalled again.
_unremoved: set[str] = set()


def remove_later(path: str) -> None:
    """Retry removing `path` (and what it holds) at the next spawn and at exit."""
    if not _unremoved:
        import atexit

        atexit.register(retry_removals)
    _unremoved.add(path)


def retry_removals() -> None:
    """Remove the cgroups of `remove_later` that are empty now; keep those
    still populated for the next try, give up on any other refusal."""
    for path in list(_unremoved):
        if not _populated_refusal(remove_tree(path)[1]):
            _unremoved.discard(path)


def _populated_refusal(refused: list[tuple[str, OSError]]) -> bool:
    """Was a removal refused because a cgroup was still populated (EBUSY)?"""
    return any(exc.errno == errno.EBUSY for _, exc in refused)


def remove_tree(path: str) -> tuple[list[str], list[tuple[str, OSError]]]:
    """Remove the cgroup `path` and its descendants, deepest first: the
    cgroups removed, and those that could not be, with why."""
    removed: list[str] = []
    kept: list[tuple[str, OSError]] = []
    for where in subtree(path):
        try:
            os.rmdir(where)
        except FileNotFoundError:
            continue
        except OSError as exc:
            kept.append((where, exc))
            continue
        removed.append(where)
    return removed, kept


class CgroupDomain(Domain):
    """A fresh cgroup v2 child per command (Linux).

    Members are every process of the cgroup's *subtree*: a command may
    create child cgroups under its own and move members there (container
    runtimes, systemd-run, a nested owner), and those stay ours. The leader
    is verified to have entered the cgroup (placement); when it did not, the
    domain says so and falls back to the leader's process group for its
    evidence.
    """

    kind = "cgroup"

    def __init__(self, root: str | None = None) -> None:
        super().__init__()
        self.root = _usable_root(root or default_root())
        self.path = ""
        self._released = False
        self._group = ProcessGroupDomain()
        # "pending" until the leader is seen inside the cgroup ("verified"),
        # seen running the command outside it ("failed"), or seen ended
        # outside it ("unverified").
        self.placement = "pending"
        self._read_failures: list[str] = []
        self._dir_fd: int | None = None  # the cgroup, open while the spawner starts the command in it
        self._events_fd: int | None = None  # its cgroup.events, opened at the first check, closed at release
        self._grouped = False  # the graceful signal reached the leader's process group

    @property
    def ident(self) -> str:
        return self._group.ident if self.placement == "failed" else self.path

    def _file(self, name: str, where: str | None = None) -> str:
        return os.path.join(where or self.path, name)

    def prepare(self, argv: Sequence[str]) -> list[str]:
        return self.command_line(argv, argv[0])[1]

    def command_line(self, argv: Sequence[str], name: str) -> tuple[str, list[str]]:
        _stale.sweep_once(self.root)  # the first use of a root: stale domains of dead owners
        if _unremoved:
            retry_removals()
        self.path = os.path.join(self.root, _stale.cgroup_name(next(_counter)))
        os.mkdir(self.path)
        self._procs_file = self._file("cgroup.procs")
        if spawns_into(self.root):
            # Created inside the cgroup by the spawner: the command itself, no shim.
            self._dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._argv = [name, *argv[1:]]
            return argv[0], self._argv
        self._argv = shim_argv(self._procs_file, argv, name)
        return self._argv[0], self._argv

    def spawn_cgroup_fd(self) -> int | None:
        return self._dir_fd

    def _close_dir(self) -> None:
        fd, self._dir_fd = self._dir_fd, None
        if fd is not None:
            os.close(fd)

    def attach(self, leader: Leader, started: float) -> None:
        if self._dir_fd is not None:
            # clone3 placed it: the kernel created the leader inside the
            # cgroup open on _dir_fd, or the spawn failed.
            self.placement = "verified"
        self._close_dir()
        super().attach(leader, started)
        self._group.attach(leader, started)

    # -- placement ---------------------------------------------------------
    def _inside(self, where: str | None) -> bool:
        if where is None or not self.path:
            return False
        own = os.path.normpath(self.path)
        return where == own or where.startswith(own + os.sep)

    def _still_shim(self, pid: int) -> bool:
        """Is `pid` still the placement shim (it has not exec'd the command)?"""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            return False
        return os.fsencode(self._procs_file) in args

    def read_failures(self) -> list[str]:
        return list(dict.fromkeys(self._read_failures))  # each failure once, in order

    def placement_pending(self) -> bool:
        return self.placement == "pending"

    def verify(self) -> str:
        """Check that the leader entered the cgroup; describe a failure."""
        if self.placement != "pending" or self.leader is None:
            return ""
        where = cgroup_of(self.leader.pid)
        if self._inside(where):
            self.placement = "verified"
            return ""
        alive = self.leader.alive
        if alive and self._still_shim(self.leader.pid):
            return ""  # not there yet: a teardown that started very early
        if not alive:
            # It ended outside (or where we cannot read): before entering,
            # as the shim, or after a placement that failed. Members, if any,
            # are in its process group: emptiness is judged by that as well.
            self.placement = "unverified"
            return (
                f"placement NOT verified: the leader (pid {self.leader.pid}) ended outside "
                f"cgroup {self.path} (in {where or 'an unreadable cgroup'}); "
                "its process group is checked as well"
            )
        self.placement = "failed"
        self.kind = "process-group"
        return (
            f"placement FAILED: the leader (pid {self.leader.pid}) runs outside cgroup {self.path} "
            f"(in {where}); falling back to the evidence of process group {self._group.pgid}"
        )

    def left(self) -> str:
        # A verified leader can still move itself out, by a write to a
        # cgroup.procs file: that takes write access to the cgroup tree (the
        # owner's own, over its root, which its commands share; or root's).
        # What it starts after that is outside the cgroup, known only by the
        # census. Read where it is now (a zombie's file still names it).
        if self.placement != "verified" or self.leader is None:
            return ""
        where = cgroup_of(self.leader.pid)
        if where is None or self._inside(where):
            return ""
        self.placement = "left"
        return (
            f"the leader (pid {self.leader.pid}) left cgroup {self.path} for {where}: what it started "
            "after that is outside the cgroup, known only by the census"
        )

    # -- members -----------------------------------------------------------
    def _pids(self) -> list[int]:
        return tree_pids(self.path, self._read_failures)

    def members(self, snap: list[ProcInfo] | None = None) -> list[ProcInfo]:
        if self.placement == "failed":
            return self._group.members(snap)
        if self._unpopulated():
            return []
        leader_pid = self.leader.pid if self.leader else None
        found = []
        for pid in self._pids():
            if pid == leader_pid:
                continue
            info = _procfs.read_stat(pid)
            if info is not None:
                found.append(info)
                self.seen[pid] = info.start
        return found

    def pgid_inside(self) -> int:
        return self._group.pgid if self.placement == "failed" else -1

    def empties_without_scan(self) -> bool:
        # cgroup.events, watched by inotify; not while placement is unproven
        # (the process group is judged too then, by a scan).
        return self.placement == "verified"

    @property
    def escape_evidence(self) -> str:
        # Only a leader seen inside the cgroup proves its descendants are there.
        return "kernel" if self.placement == "verified" else "census"

    def contains(self, pid: int) -> bool:
        # /proc/PID/cgroup names the process's own cgroup: exact for that
        # process, unlike a cgroup.procs listing read at another moment.
        if self.placement == "failed":
            return self._group.contains(pid)
        return self._inside(cgroup_of(pid))

    # -- signals -----------------------------------------------------------
    # The leader is signalled through its own pidfd as well, and first: until
    # the shim has written itself into cgroup.procs (a teardown can start that
    # early, e.g. timeout=0) it is not listed, and it forks only after it is.

    def signal_graceful(self, sigs: tuple[int, ...] = (signal.SIGTERM, signal.SIGCONT)) -> Sent:
        first, then = self.graceful_stages(sigs)
        return then(first())

    def graceful_stages(self, sigs: tuple[int, ...]) -> tuple[Callable[[], Sent], Callable[[Sent], Sent]]:
        # Most members share the leader's process group: signal it as one
        # (atomic against a member forking meanwhile; safe because the leader
        # is unreaped, so its pid, the pgid, cannot be recycled): the first
        # stage. Members that left the group, or sit in a descendant cgroup,
        # get the signal one by one, each exactly once: the second. Every
        # refusal is recorded and the next target is still tried.
        assert self.leader is not None
        if self.placement == "failed":
            return self._group.graceful_stages(sigs)
        if not sigs:
            return partial(Sent, f"no signal to cgroup {self.path}"), unchanged
        return partial(self._signal_group, sigs), partial(self._signal_listed, sigs)

    def _signal_group(self, sigs: tuple[int, ...]) -> Sent:
        assert self.leader is not None
        pgid = self.leader.pid
        failed: list[str] = []
        self._grouped = False
        try:
            self._grouped = killpg_owned(pgid, sigs[0])
            for sig in sigs[1:] if self._grouped else ():
                killpg_owned(pgid, sig)
        except OSError as exc:
            failed.append(f"process group {pgid}: {describe_error(exc)}")
        if not self._grouped:  # the leader may not have reached its group yet
            try:
                if self.leader.signal(sigs[0]):
                    for sig in sigs[1:]:
                        self.leader.signal(sig)
            except OSError as exc:
                failed.append(f"leader {pgid}: {describe_error(exc)}")
        return Sent(f"{signal_names(sigs)} to process group {pgid}", "; ".join(failed))

    def _signal_listed(self, sigs: tuple[int, ...], first: Sent) -> Sent:
        assert self.leader is not None
        pgid = self.leader.pid
        failed = [first.failed] if first.failed else []
        listing = native_members(self.path, self._read_failures)
        if listing is None:
            listing = []
            for pid in self._pids():
                info = _procfs.read_stat(pid) if pid != pgid else None
                if info is not None:
                    listing.append((pid, info.pgrp, info.start))
        outside = []
        for pid, pgrp, start in listing:
            if pid == pgid:
                continue
            self.seen[pid] = start
            if not (self._grouped and pgrp == pgid):
                outside.append(pid)
        sent = self._send_each(outside, sigs, failed)
        return Sent(
            f"{first.detail} and to {sent} other member(s) of cgroup {self.path}",
            "; ".join(failed),
        )

    def _send_each(self, pids: list[int], sigs: tuple[int, ...], failed: list[str]) -> int:
        return signal_each(pids, sigs, self._pids, failed)

    def force(self) -> Sent:
        assert self.leader is not None
        if self.placement == "failed":
            return self._group.force()
        failed: list[str] = []
        try:
            self.leader.signal(signal.SIGKILL)
        except OSError as exc:
            failed.append(f"leader {self.leader.pid}: {describe_error(exc)}")
        try:
            kill(self.path)
        except FileNotFoundError:
            if os.path.isdir(self.path):
                # Kernels before 5.14 have no cgroup.kill: kill member by member.
                sent = self._send_each(self._pids(), (signal.SIGKILL,), failed)
                return Sent(
                    f"SIGKILL to {sent} member(s) of cgroup {self.path} (no cgroup.kill)", "; ".join(failed)
                )
            failed.append(f"cgroup {self.path} is gone")
        except OSError as exc:
            failed.append(f"cgroup.kill: {describe_error(exc)}")
            # The write was refused: still try every member one by one.
            sent = self._send_each(self._pids(), (signal.SIGKILL,), failed)
            return Sent(
                f"SIGKILL to {sent} member(s) of cgroup {self.path} (cgroup.kill refused)",
                "; ".join(failed),
            )
        return Sent(f"SIGKILL to cgroup {self.path} via cgroup.kill", "; ".join(failed))

    # -- emptiness ---------------------------------------------------------
    def is_empty(self, snap: list[ProcInfo] | None = None) -> bool:
        if self.placement == "failed":
            return self._group.is_empty(snap)
        if self.leader is not None and self.leader.alive:
            return False
        if self.placement != "verified" and not self._group.is_empty(snap):
            return False  # placement unproven: the process group must be empty too
        return self._unpopulated()

    def _unpopulated(self) -> bool:
        """True only when cgroup.events says "populated 0" (or the cgroup is
        gone); a file we cannot read proves nothing."""
        try:
            if self._events_fd is None and not self._released:
                try:
                    self._events_fd = os.open(self._file("cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    pass  # gone, or never made: populated() tells which
            if self._events_fd is None:
                return not populated(self.path)
            return not populated_at(self._events_fd, self.path)
        except OSError as exc:
            self._read_failures.append(f"reading cgroup.events: {exc}")
            return False

    def _close_events(self) -> None:
        fd, self._events_fd = self._events_fd, None
        if fd is not None:
            os.close(fd)

    async def wait_empty(self, hint: list[ProcInfo] | None = None) -> ProcessTable | None:
        assert self.leader is not None
        if self.placement == "failed":
            return await self._group.wait_empty(hint)
        await self.leader.wait()
        await trio.lowlevel.checkpoint()  # the bound (the caller's scope) can always fire
        if self._unpopulated():
            return None
        try:
            inotify = _inotify.shared()
            wd = inotify.add(self._file("cgroup.events"))
        except OSError:
            # No inotify (ENOSPC: the watch limit, EMFILE): poll instead;
            # the caller's cancel scope bounds it.
            await _pidfd.poll_until(self._unpopulated)
            return None
        try:
            while True:
                changed = inotify.event(wd)
                if self._unpopulated():
                    return None
                await changed.wait()
        finally:
            inotify.remove(wd)

    def release(self) -> str:
        """Remove the cgroup and any child cgroups the command made, deepest
        first; say exactly what was and was not removed, and why."""
        if self._released or not self.path:
            return ""
        self._close_events()  # (opened again by a later check, while the cgroup stays)
        removed, refused = remove_tree(self.path)
        kept = [
            f"{where} ({'still populated' if exc.errno == errno.EBUSY else describe_error(exc)})"
            for where, exc in refused
        ]
        self._released = not kept
        nested = len(removed) - (0 if kept or not removed else 1)
        if not kept:
            extra = f" and {nested} child cgroup(s) the command created" if nested > 0 else ""
            return f"removed cgroup {self.path}{extra}"
        text = f"cgroup NOT removed: {', '.join(kept)}"
        if removed:
            text += f"; removed {', '.join(removed)}"
        if _populated_refusal(refused):
            remove_later(self.path)
            text += "; it is removed once empty, at this process's next cgroup command or its exit"
        return text

    def abort_spawn(self) -> None:
        self._close_dir()
        self._close_events()
        if self.path:
            try:
                os.rmdir(self.path)
            except OSError:
                pass
            self._released = True
