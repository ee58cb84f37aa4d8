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
# pid after spawn loses the race to a command that forks at once. The spawn
# goes through a shim that writes 0 (itself) to the cgroup's cgroup.procs and
# then execs the command. Preferred is a tiny freestanding C program
# (_shim/cgroup_shim_tiny.c: raw system calls, no libc, ~0.07 ms per spawn)
# compiled once per machine into the user's cache directory where a C
# compiler exists, then a static glibc build of _shim/cgroup_shim.c
# (~0.35 ms: glibc start-up), and without a compiler a /bin/sh one-liner
# (~0.6 ms; for a str command it evals the command in the same shell). Both are race-free. preexec_fn
# would force fork instead of vfork and is unsafe with threads, and
# clone3(CLONE_INTO_CGROUP) from ctypes skips Python's fork hooks.
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
import hashlib
import itertools
import os
import platform
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from functools import cache
from importlib import resources

from . import _inotify, _pidfd, _procfs
from ._domain import Domain, DomainUnavailable
from ._procfs import ProcInfo

ROOT_ENV = "TRIO_PROCOWN_CGROUP_ROOT"

# $1: the cgroup.procs file; $2: the command (str commands only).
_SHIM_EXEC = (
    'echo 0 >"$0" 2>/dev/null || { echo "trio_procown: cannot enter cgroup $0" >&2; exit 125; }; exec "$@"'
)
_SHIM_EVAL = (
    'echo 0 >"$1" 2>/dev/null || { echo "trio_procown: cannot enter cgroup $1" >&2; exit 125; }; '
    '__procown_c=$2; set --; eval "unset __procown_c; $__procown_c"'
)

_counter = itertools.count()


@cache
def cgroup2_mount() -> str | None:
    """The first cgroup2 mount point, from /proc/self/mountinfo (cached)."""
    try:
        with open("/proc/self/mountinfo") as f:
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
        with open("/proc/self/mountinfo") as f:
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
    return (
        "cgroup2 is mounted without favordynmods: entering a cgroup may wait for an RCU grace "
        "period (~10 ms for a command spawned after idling); remount with favordynmods to avoid it"
    )


def own_cgroup_dir() -> str | None:
    """Our own cgroup v2 directory, or None without cgroup v2."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    rel = line[3:].strip().lstrip("/")
                    return os.path.join(mount, rel) if rel else mount
    except OSError:
        return None
    return mount


def default_root() -> str | None:
    return os.environ.get(ROOT_ENV) or _own_cgroup_dir_cached()


@cache
def _own_cgroup_dir_cached() -> str | None:
    return own_cgroup_dir()


@cache
def _probe(root: str) -> str | None:
    """Why `root` cannot hold our cgroups, or None when it can (cached)."""
    if not os.path.isdir(root):
        return f"{root} does not exist"
    if not os.path.exists(os.path.join(root, "cgroup.procs")):
        return f"{root} is not a cgroup v2 directory (no cgroup.procs)"
    if not os.access(root, os.W_OK):
        return f"no write permission on {root}"
    probe = os.path.join(root, f"procown-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"cannot create a child cgroup in {root}: {exc.strerror}"
    try:
        if not os.path.exists(os.path.join(probe, "cgroup.events")):
            return f"{root} has no cgroup.events (not cgroup v2)"
        # Prove that a process can enter it: run the real shim once.
        try:
            done = subprocess.run(
                shim_argv(os.path.join(probe, "cgroup.procs"), ["/bin/true"]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot run the cgroup shim: {exc}"
        if done.returncode != 0:
            return f"a process cannot be moved into a child cgroup of {root}"
        return None
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "trio_procown")


def _trusted(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022 and os.access(path, os.X_OK)


# (source file, compiler flags), best first.
_SHIM_BUILDS = (
    ("cgroup_shim_tiny.c", ["-O2", "-static", "-nostdlib", "-fno-stack-protector"]),
    ("cgroup_shim.c", ["-O2", "-static"]),
    ("cgroup_shim.c", ["-O2"]),
)


@cache
def compiled_shim() -> str | None:
    """Path of the compiled C shim, building it on first use; None when no
    C compiler is available (or TRIO_PROCOWN_SH_SHIM is set)."""
    if os.environ.get("TRIO_PROCOWN_SH_SHIM"):
        return None
    package = resources.files("trio_procown") / "_shim"
    sources = {name: (package / name).read_bytes() for name, _ in _SHIM_BUILDS}
    digest = hashlib.sha256(b"".join(sources[n] for n in sorted(sources))).hexdigest()[:16]
    target = os.path.join(_cache_dir(), f"cgroup_shim-{digest}-{platform.machine()}")
    if _trusted(target):
        return target
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    try:
        os.makedirs(_cache_dir(), mode=0o755, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=_cache_dir()) as tmp:
            out = os.path.join(tmp, "cgroup_shim")
            for name, flags in _SHIM_BUILDS:
                src = os.path.join(tmp, name)
                with open(src, "wb") as f:
                    f.write(sources[name])
                built = subprocess.run(
                    [cc, *flags, "-o", out, src],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=60,
                    check=False,
                )
                if built.returncode == 0 and _shim_works(out):
                    os.chmod(out, 0o755)
                    os.replace(out, target)
                    return target
    except (OSError, subprocess.SubprocessError):
        return None
    return None


def _shim_works(path: str) -> bool:
    """Run a freshly built shim once: it must exec a program (it is not
    asked to move anywhere: /dev/null stands in for cgroup.procs)."""
    try:
        done = subprocess.run(
            [path, os.devnull, "/bin/sh", "-c", "exit 7"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 7


def shim_argv(procs: str, argv: Sequence[str]) -> list[str]:
    """The argv that enters the cgroup of `procs` and then runs `argv`."""
    shim = compiled_shim()
    if shim is not None:
        return [shim, procs, *argv]
    if len(argv) == 3 and argv[0] == "/bin/sh" and argv[1] == "-c":
        return ["/bin/sh", "-c", _SHIM_EVAL, "sh", procs, argv[2]]
    return ["/bin/sh", "-c", _SHIM_EXEC, procs, *argv]


def unavailable_reason(root: str | None = None) -> str | None:
    """Why the cgroup domain cannot be used here, or None if it can."""
    if not _procfs.IS_LINUX:
        return "cgroups exist only on Linux"
    root = root or default_root()
    if root is None:
        return "no cgroup v2 hierarchy is mounted"
    return _probe(os.path.realpath(root))


def _killpg_own(pgid: int, sig: int) -> bool:
    """killpg() for a group we own (never our own group); False if empty."""
    if pgid <= 1 or pgid == os.getpgrp():
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


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


class CgroupDomain(Domain):
    """A fresh cgroup v2 child per command (Linux)."""

    kind = "cgroup"

    def __init__(self, root: str | None = None) -> None:
        super().__init__()
        self.root = _usable_root(root or default_root())
        self.path = ""
        self._released = False

    @property
    def ident(self) -> str:
        return self.path

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def prepare(self, argv: Sequence[str]) -> list[str]:
        name = f"procown-{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
        self.path = os.path.join(self.root, name)
        os.mkdir(self.path)
        return shim_argv(self._file("cgroup.procs"), argv)

    def _pids(self) -> list[int]:
        try:
            with open(self._file("cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            return []
        return pids

    def members(self, snap: list[ProcInfo] | None = None) -> list[ProcInfo]:
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

    def contains(self, pid: int) -> bool:
        # /proc/PID/cgroup names the process's own cgroup: exact for that
        # process, unlike a cgroup.procs listing read at another moment.
        try:
            with open(f"/proc/{pid}/cgroup", "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return False
        mount = cgroup2_mount()
        if mount is None:
            return False
        for line in lines:
            if line.startswith(b"0::"):
                where = os.path.join(mount, os.fsdecode(line[3:]).lstrip("/"))
                return os.path.normpath(where) == os.path.normpath(self.path)
        return False

    # The leader is signalled through its own pidfd as well, and first: until
    # the shim has written itself into cgroup.procs (a teardown can start that
    # early, e.g. timeout=0) it is not listed, and it forks only after it is.

    def signal_graceful(self) -> str:
        # Most members share the leader's process group: signal it as one
        # (atomic against a member forking meanwhile; safe because the leader
        # is unreaped, so its pid, the pgid, cannot be recycled). Members
        # that left the group get the signal one by one, each exactly once.
        assert self.leader is not None
        pgid = self.leader.pid
        grouped = _killpg_own(pgid, signal.SIGTERM)
        if grouped:
            _killpg_own(pgid, signal.SIGCONT)
        else:  # the leader may not have reached its group yet
            self.leader.signal(signal.SIGTERM)
            self.leader.signal(signal.SIGCONT)
        listed = [p for p in self._pids() if p != pgid]
        outside = []
        for pid in listed:
            info = _procfs.read_stat(pid)
            if info is None:
                continue
            self.seen[pid] = info.start
            if not (grouped and info.pgrp == pgid):
                outside.append(pid)
        fds = {pid: _pidfd.open_pidfd(pid) for pid in outside}
        still = set(self._pids())
        sent = 0
        for pid, fd in fds.items():
            if fd is None:
                continue
            try:
                if pid in still and _pidfd.send(fd, signal.SIGTERM):
                    _pidfd.send(fd, signal.SIGCONT)
                    sent += 1
            finally:
                _pidfd.close(fd)
        return f"SIGTERM+SIGCONT to process group {pgid} and to {sent} other member(s) of cgroup {self.path}"

    def force(self) -> str:
        assert self.leader is not None
        self.leader.signal(signal.SIGKILL)
        try:
            with open(self._file("cgroup.kill"), "w") as f:
                f.write("1")
        except FileNotFoundError:
            # Kernels before 5.14 have no cgroup.kill: kill member by member.
            for pid in self._pids():
                fd = _pidfd.open_pidfd(pid)
                if fd is not None:
                    if pid in self._pids():
                        _pidfd.send(fd, signal.SIGKILL)
                    _pidfd.close(fd)
            return f"SIGKILL to each member of cgroup {self.path} (no cgroup.kill)"
        return f"SIGKILL to cgroup {self.path} via cgroup.kill"

    def is_empty(self, snap: list[ProcInfo] | None = None) -> bool:
        if self.leader is not None and self.leader.alive:
            return False
        return self._unpopulated()

    def _unpopulated(self) -> bool:
        try:
            with open(self._file("cgroup.events")) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "populated":
                        return value.strip() == "0"
        except FileNotFoundError:
            return True
        return False

    async def wait_empty(self, hint: list[ProcInfo] | None = None) -> None:
        assert self.leader is not None
        await self.leader.wait()
        if self._unpopulated():
            return None
        inotify = _inotify.shared()
        wd = inotify.add(self._file("cgroup.events"))
        try:
            while True:
                changed = inotify.event(wd)
                if self._unpopulated():
                    return None
                await changed.wait()
        finally:
            inotify.remove(wd)

    def release(self) -> str:
        if self._released or not self.path:
            return ""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return f"cgroup {self.path} NOT removed: still populated"
            return f"cgroup {self.path} NOT removed: {exc.strerror}"
        self._released = True
        return f"removed cgroup {self.path}"

    def abort_spawn(self) -> None:
        if self.path:
            try:
                os.rmdir(self.path)
            except OSError:
                pass
            self._released = True
