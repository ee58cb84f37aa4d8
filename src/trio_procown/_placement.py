# Placing a command into its cgroup before it can fork.
#
# The cgroup domain (_cgroup.py) must have the command inside its cgroup
# *before* the command runs a single instruction: moving the pid after the
# spawn loses the race against a command that forks at once, and the child
# it forked stays outside. Python's spawn offers no hook that is both safe
# and cheap: preexec_fn forces fork instead of vfork and is unsafe with
# threads, and clone3(CLONE_INTO_CGROUP) from ctypes skips Python's fork
# hooks and subprocess's own fd and session handling. So the spawn runs a
# *shim* instead of the command: the shim writes "0" (itself) to the
# cgroup's cgroup.procs and then execs the command, which keeps the shim's
# pid (the leader's pid is the command's own) and starts inside the cgroup,
# as does everything it forks.
#
# Three shims, cheapest first:
# - _shim/cgroup_shim_tiny.c, a freestanding program (raw system calls, no
#   libc; x86_64 and aarch64): ~0.07 ms per spawn;
# - _shim/cgroup_shim.c against glibc, static where a static libc exists:
#   ~0.35 ms (glibc's start-up);
# - without a C compiler, a /bin/sh one-liner: ~0.6 ms; for a str command
#   (`/bin/sh -c CMD`) it evals CMD in the same shell, so it costs no exec.
# All three are race-free: the move precedes the exec of the command.
# TRIO_PROCOWN_SH_SHIM=1 forces the shell shim.
#
# Preferred over every shim where it works: the spawner, _shim/spawn_into.c
# built as a shared object and called through ctypes, which creates the
# command inside its cgroup with clone3(CLONE_INTO_CGROUP) (spawn_into
# below; _cgroup's probe decides per root). It moves no process, so it
# never waits for the RCU grace period a move may cost. It is built,
# cached and trusted exactly as the compiled shim is (an _Artefact each),
# and loaded through the verified descriptor's /proc path.
#
# Trust. The compiled shim runs with the caller's privileges (often root)
# for every command, so whoever can swap the file can run code as the
# caller. It is built once per machine into $XDG_CACHE_HOME/trio_procown
# (or ~/.cache/trio_procown, created 0700), named by a hash of its sources,
# and a cached build is used only when, as OpenSSH's StrictModes asks,
# every directory from / down to the cache directory and the file itself
# are owned by our euid or root and writable by neither group nor others
# (a sticky directory such as /tmp counts as writable). Symlinks above the
# cache directory (a symlinked ~/.cache) are resolved first and the real
# directories checked; the cache directory and the file must not be
# symlinks. Only we and root can then change them.
#
# Even so the shim is never exec'd by a path that could change after the
# check: the file is opened once (O_NOFOLLOW, O_CLOEXEC), the descriptor is
# checked with fstat (a regular file, the inode that was checked, same
# owner and mode rules), kept for the life of the process, and the spawn
# execs /proc/<our pid>/fd/<n>. The spawned child resolves that link
# through our descriptor table while we wait for its exec (vfork and
# posix_spawn alike), so it runs exactly the inode we verified; the
# descriptor is close-on-exec, so the command does not inherit it. One run
# through the descriptor per process proves that the route works (a
# non-dumpable process, for one, closes its /proc/PID/fd to its children).
# The descriptor belongs to a process: a forked child forgets it (an at-fork
# hook, and a cache keyed by pid for forks that skip the hook) and opens its
# own. Each use checks with fstat (~1 us) that the descriptor still holds
# that inode: code that closes descriptors it does not own could have handed
# the number to another file, and the shim is then opened again.
#
# Fallbacks. When the cache cannot be trusted or created, the shim is built
# in a private directory (mkdtemp, mode 0700, pinned by a directory
# descriptor through which the result is opened; the directory is removed
# once the file is open): a compile per process instead of per machine.
# Without a compiler, or when no build works, the /bin/sh shim is used
# (/bin/sh belongs to root).

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import math
import os
import select
import shutil
import signal
import stat
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

SH_SHIM_ENV = "TRIO_PROCOWN_SH_SHIM"
NO_SPAWNER_ENV = "TRIO_PROCOWN_NO_SPAWNER"  # place by a shim even where the spawner works

# sh -c _SHIM_EXEC PROCS ARGV...: $0 is the cgroup.procs file, "$@" the command.
_SHIM_EXEC = (
    'echo 0 >"$0" 2>/dev/null || { echo "trio_procown: cannot enter cgroup $0" >&2; exit 125; }; exec "$@"'
)
# sh -c _SHIM_EVAL sh PROCS CMD: $1 is the cgroup.procs file, $2 the str command.
_SHIM_EVAL = (
    'echo 0 >"$1" 2>/dev/null || { echo "trio_procown: cannot enter cgroup $1" >&2; exit 125; }; '
    '__procown_c=$2; set --; eval "unset __procown_c; $__procown_c"'
)

# (source file, compiler flags), best first.
_SHIM_BUILDS = (
    ("cgroup_shim_tiny.c", ["-O2", "-static", "-nostdlib", "-fno-stack-protector"]),
    ("cgroup_shim.c", ["-O2", "-static"]),
    ("cgroup_shim.c", ["-O2"]),
)

_BUILT = "cgroup_shim"

# The spawner (_shim/spawn_into.c), a shared object called through ctypes:
# clone3(CLONE_INTO_CGROUP) starts the command inside its cgroup, so no
# shim runs and no process is moved (see the file's comment for why a
# move can cost ~10 ms). Built, cached and trusted as the shim is.
_SPAWNER_BUILDS = (("spawn_into.c", ["-O2", "-shared", "-fPIC"]),)
_SPAWNER_BUILT = "spawn_into.so"


class _Artefact(NamedTuple):
    """A program we compile and trust: its builds (best first), the name of
    the build's output, and how a build open on a descriptor is proven to work."""

    builds: tuple[tuple[str, list[str]], ...]
    built: str
    stem: str  # of the cache file's name
    works: Callable[[int], bool]


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "trio_procown")


def _real(path: str) -> str:
    """`path` with every symlink above its last component resolved (the
    last component itself is kept, so that a symlink there is seen)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _safe_owner_and_mode(st: os.stat_result) -> bool:
    """Owned by our euid or root, and writable by neither group nor others."""
    return st.st_uid in (os.geteuid(), 0) and not st.st_mode & 0o022


def _usable_file(st: os.stat_result) -> bool:
    """A regular, executable file that only we and root can change."""
    return stat.S_ISREG(st.st_mode) and _safe_owner_and_mode(st) and bool(st.st_mode & stat.S_IXUSR)


def _untrusted_reason(directory: str) -> str | None:
    """Why someone other than us or root could change what is in
    `directory` (an absolute path, see _real), or None when nobody can.

    Every directory from / down to `directory` must be owned by our euid
    or root and writable by neither group nor others (sticky or not), and
    none may be a symlink (lstat: a symlink planted at `directory` itself,
    or one that appeared after _real resolved the path, is refused)."""
    here = "/"
    for part in ["", *directory.split("/")[1:]]:
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except OSError as exc:
            return f"cannot inspect {here}: {exc.strerror}"
        if stat.S_ISLNK(st.st_mode):
            return f"{here} is a symbolic link"
        if not stat.S_ISDIR(st.st_mode):
            return f"{here} is not a directory"
        if st.st_uid not in (os.geteuid(), 0):
            return f"{here} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022:
            return f"{here} is writable by group or others"
    return None


def _open_checked(path: str, same_as: os.stat_result) -> int | None:
    """A close-on-exec descriptor on the file at `path`, provided it is the
    very inode `same_as` describes and a usable file; None otherwise."""
    try:
        # O_NONBLOCK: a FIFO planted at `path` must not block the open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if _usable_file(st) and (st.st_dev, st.st_ino) == (same_as.st_dev, same_as.st_ino):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _fd_path(fd: int) -> str:
    """The path by which our children exec the file open on `fd`."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def run_quietly(argv: Sequence[str], timeout: float, *, new_session: bool = False) -> int:
    """Run `argv` with no stdio and return its exit status; after `timeout`
    kill it and raise subprocess.TimeoutExpired (as subprocess.run does).

    The wait is on a pidfd where there is one: subprocess.run(timeout=...)
    polls with sleeps (0.5 ms, doubling), which made each start-up probe
    cost several ms more than the process it ran.
    """
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=new_session,
    ) as proc:
        try:
            fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            fd = None
        if fd is None:
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
        try:
            ready = _readable_within(fd, timeout)
        finally:
            os.close(fd)
        if not ready:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(list(argv), timeout)
        return proc.wait()


def _shim_works(path: str) -> bool:
    """Run a shim once: it must exec a program (it is not asked to move
    anywhere: /dev/null stands in for cgroup.procs)."""
    try:
        return run_quietly([path, os.devnull, "/bin/sh", "sh", "-c", "exit 7"], 10, new_session=True) == 7
    except (OSError, subprocess.SubprocessError):
        return False


def _fd_works(fd: int) -> bool:
    """Our children can exec the shim open on `fd` through /proc."""
    path = _fd_path(fd)
    try:
        st, via = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (via.st_dev, via.st_ino) and _shim_works(path)


def _sources(builds: tuple[tuple[str, list[str]], ...] = _SHIM_BUILDS) -> dict[str, bytes]:
    # Read beside this file (no importlib.resources import on every run's
    # path); a package that is not plain files falls back to resources.
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")
    try:
        sources = {}
        for name, _ in builds:
            with open(os.path.join(here, name), "rb") as f:
                sources[name] = f.read()
        return sources
    except OSError:
        from importlib import resources

        package = resources.files("trio_procown") / "_shim"
        return {name: (package / name).read_bytes() for name, _ in builds}


def _cache_name(sources: dict[str, bytes], stem: str = "cgroup_shim") -> str:
    digest = hashlib.sha256(b"".join(sources[n] for n in sorted(sources))).hexdigest()[:16]
    return f"{stem}-{digest}-{os.uname().machine}"  # = platform.machine() on POSIX


def _build_in(
    tmp: str, tmp_fd: int, cc: str, sources: dict[str, bytes], artefact: _Artefact | None = None
) -> int | None:
    """Compile the shim in our private directory `tmp`, pinned by `tmp_fd`
    (the result is opened through it, whatever becomes of the path), and
    return a descriptor on the first build that works."""
    artefact = artefact or _SHIM
    written: set[str] = set()
    for name, flags in artefact.builds:
        if name not in written:
            src = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=tmp_fd,
            )
            with open(src, "wb") as f:
                f.write(sources[name])
            written.add(name)
        built = subprocess.run(
            [cc, *flags, "-o", os.path.join(tmp, artefact.built), os.path.join(tmp, name)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        if built.returncode != 0:
            continue
        try:
            fd = os.open(
                artefact.built, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=tmp_fd
            )
        except OSError:
            continue
        try:
            os.fchmod(fd, 0o755)
            if _usable_file(os.fstat(fd)) and artefact.works(fd):
                return fd
        except OSError:
            pass
        os.close(fd)
        os.unlink(artefact.built, dir_fd=tmp_fd)
    return None


def _build_pinned(tmp: str, cc: str, sources: dict[str, bytes], artefact: _Artefact) -> int | None:
    """Build in `tmp`, a directory just made by mkdtemp, provided it is
    still ours and private once pinned by a descriptor; a descriptor on a
    working build, or None."""
    tmp_fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(tmp_fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        return _build_in(tmp, tmp_fd, cc, sources, artefact)
    finally:
        os.close(tmp_fd)


def _from_cache(
    cache: str, name: str, cc: str | None, sources: dict[str, bytes], artefact: _Artefact
) -> int | None:
    """A descriptor on the cached build `name` in `cache`, building it there
    first if needed; None when the cache cannot be trusted."""
    os.makedirs(os.path.dirname(os.path.abspath(cache)), mode=0o700, exist_ok=True)
    cache = _real(cache)
    try:
        os.mkdir(cache, 0o700)  # a symlink already there is not followed
    except FileExistsError:
        pass
    if _untrusted_reason(cache) is not None:
        return None
    target = os.path.join(cache, name)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        pass
    else:
        fd = _open_checked(target, st)
        if fd is not None:
            if artefact.works(fd):
                return fd
            os.close(fd)
    if cc is None:
        return None
    import tempfile  # the compile path only

    tmp = tempfile.mkdtemp(prefix="build-", dir=cache)
    try:
        fd = _build_pinned(tmp, cc, sources, artefact)
        if fd is not None:
            # The build is ours whether or not it reaches the cache.
            with contextlib.suppress(OSError):
                os.replace(os.path.join(tmp, artefact.built), target)
        return fd
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open_built(artefact: _Artefact) -> int | None:
    """A descriptor on a verified, working build of `artefact`, or None (the
    shim: use the /bin/sh shim; the spawner: use a shim)."""
    if os.environ.get(SH_SHIM_ENV) or (artefact is _SPAWNER and os.environ.get(NO_SPAWNER_ENV)):
        return None
    sources = _sources(artefact.builds)
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    try:
        fd = _from_cache(_cache_dir(), _cache_name(sources, artefact.stem), cc, sources, artefact)
    except (OSError, subprocess.SubprocessError):
        fd = None
    if fd is not None or cc is None:
        return fd
    # The cache cannot be trusted: a private build, once per process.
    import tempfile

    try:
        tmp = tempfile.mkdtemp(prefix="trio_procown-")
    except OSError:
        return None
    try:
        return _build_pinned(tmp, cc, sources, artefact)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Opened(NamedTuple):
    pid: int
    fd: int | None
    path: str | None  # /proc/<pid>/fd/<fd>
    inode: tuple[int, int] | None  # (st_dev, st_ino) of the verified file


def _opened_now(artefact: _Artefact) -> _Opened:
    fd = _open_built(artefact)
    if fd is None:
        return _Opened(os.getpid(), None, None, None)
    st = os.fstat(fd)
    return _Opened(os.getpid(), fd, _fd_path(fd), (st.st_dev, st.st_ino))


def _still_ours(opened: _Opened) -> bool:
    """Our descriptor is still open on the verified file (code that closes
    every descriptor it does not know, then opens another, would otherwise
    have us exec whatever file took its number)."""
    if opened.pid != os.getpid():
        return False
    if opened.fd is None:
        return True
    try:
        st = os.fstat(opened.fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == opened.inode


class _Compiled:
    """compiled_shim(): the path to exec the compiled C shim by (as
    /proc/<our pid>/fd/<n>), building it on first use; None when no
    trustworthy build is possible (no C compiler, or TRIO_PROCOWN_SH_SHIM
    is set): use the /bin/sh shim. Cached per process. compiled_spawner():
    the same for the spawner (a path to load it by)."""

    def __init__(self, artefact: _Artefact) -> None:
        self._artefact = artefact
        self._lock = threading.Lock()
        self._opened: _Opened | None = None

    def __call__(self) -> str | None:
        opened = self._opened
        if opened is None or not _still_ours(opened):
            with self._lock:
                opened = self._opened
                if opened is None or not _still_ours(opened):
                    # A stale descriptor number is not closed: it is not ours.
                    opened = self._opened = _opened_now(self._artefact)
        return opened.path

    def cache_clear(self) -> None:
        """Forget the shim and close its descriptor (for tests: the next
        call looks again). Not while a spawn through it may be under way."""
        with self._lock:
            opened, self._opened = self._opened, None
        if opened is not None and opened.fd is not None and _still_ours(opened):
            os.close(opened.fd)

    def _forget_after_fork(self) -> None:
        # In the child of os.fork(): the inherited descriptor is not ours to
        # exec by (our pid differs); close it and open our own when needed.
        self._lock = threading.Lock()
        opened, self._opened = self._opened, None
        if opened is not None and opened.fd is not None and _still_ours(opened._replace(pid=os.getpid())):
            os.close(opened.fd)


_SHIM = _Artefact(_SHIM_BUILDS, _BUILT, "cgroup_shim", _fd_works)
_SPAWNER = _Artefact(_SPAWNER_BUILDS, _SPAWNER_BUILT, "spawn_into", lambda fd: _spawner_works(fd))
compiled_shim = _Compiled(_SHIM)
compiled_spawner = _Compiled(_SPAWNER)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=compiled_shim._forget_after_fork)
    os.register_at_fork(after_in_child=compiled_spawner._forget_after_fork)


# -- the spawner ---------------------------------------------------------------

# /proc/<pid>/fd/<n> -> the function loaded through it. A path is only ever
# asked for after compiled_spawner() checked that its descriptor still holds
# the verified inode; a library loaded earlier through the same path stays
# mapped and was verified when loaded.
_LOADED: dict[str, Any] = {}


def _function(path: str) -> Any:
    """procown_spawn from the library at `path` (loaded once per path)."""
    import ctypes

    fn = _LOADED.get(path)
    if fn is None:
        lib = ctypes.CDLL(path)
        c_int, c_long, c_str = ctypes.c_int, ctypes.c_long, ctypes.c_char_p
        strs, int_out = ctypes.POINTER(c_str), ctypes.POINTER(c_int)
        # (path, argv, envp, cwd, in, out, err, keep[], nkeep, cgroup_fd, *pidfd, *errno, born[2])
        born = ctypes.POINTER(ctypes.c_longlong)
        fd_list = ctypes.POINTER(c_int)
        spawn_args = (
            c_str,
            strs,
            strs,
            c_str,
            c_int,
            c_int,
            c_int,
            fd_list,
            c_int,
            c_int,
            int_out,
            int_out,
            born,
        )
        fn = _LOADED[path] = _bind(lib.procown_spawn, *spawn_args)
        if not _SCANNER:
            # (out, cap, key, key_len, since, self_pid, retries, *errno, *need)
            scan_args = (c_str, c_long, c_str, c_long, ctypes.c_ulonglong, c_int, c_int, int_out)
            scan = _bind(lib.procown_scan, *scan_args, ctypes.POINTER(c_long))
            members = _bind(lib.procown_members, c_str, c_str, c_long, ctypes.POINTER(c_long))
            _SCANNER[:] = [scan, members]  # both at once: other threads read them
    return fn


def _bind(fn: Any, *argtypes: Any) -> Any:
    """A C function of the spawner, returning long, with its argument types."""
    import ctypes

    fn.restype = ctypes.c_long
    fn.argtypes = list(argtypes)
    return fn


# procown_scan and procown_members of the first spawner loaded
# (_procfs.native_table, _cgroup.native_members): the library stays mapped
# once loaded, and was verified when it was.
_SCANNER: list[Any] = []


def loaded_scanner() -> Any | None:
    """The spawner's process-table scanner if a spawner is loaded in this
    process, else None (never builds nor loads one: callers are on a
    teardown's path)."""
    return _SCANNER[0] if _SCANNER else None


def loaded_lister() -> Any | None:
    """The spawner's cgroup-tree lister (procown_members), as loaded_scanner."""
    return _SCANNER[1] if _SCANNER else None


class CloneRefused(OSError):
    """clone3 itself was refused (an old kernel, a seccomp filter, a cgroup
    that takes no process): nothing was started; use the shim instead."""


_NUL = "embedded null byte"

# ctypes keeps its array types (c_char_p * n) only weakly, and a type is a
# reference cycle: each collection that frees one makes the next spawn build
# it again: the argv and start-time arrays, 2 types a spawn (~9 us each when
# warm; measured with a full collection before each run of `true`: 780-830 us
# of this thread's CPU a run without this table, 580-590 us with it). The
# ones a spawn needs are kept here, for small lengths (a command with
# thousands of arguments builds its own).
_ARRAY_TYPES: dict[tuple[Any, int], Any] = {}
_ARRAY_TYPES_MAX_LEN = 64


def _array_type(item: Any, n: int) -> Any:
    """`item * n`, kept alive for small `n` (see _ARRAY_TYPES)."""
    kind = _ARRAY_TYPES.get((item, n))
    if kind is None:
        kind = item * n
        if n <= _ARRAY_TYPES_MAX_LEN:
            _ARRAY_TYPES[item, n] = kind
    return kind


# The environment array of the last spawn: its entries but the last (the
# census cookie, new for every command) and the ctypes array holding them.
_ENV_ARRAY: list[Any] = [None, None]


def _env_array(env: Sequence[bytes]) -> tuple[Any, Any]:
    """A NULL-terminated char* array of `env`, and the array whose entries
    it points into (keep it until the spawn is over: another thread may
    replace the cache meanwhile). Commands mostly inherit our environment
    (child_environment gives them the same entry objects) and differ only in
    their last entry, the census cookie: the array of the others is built
    once and copied (~13 us a spawn for 36 entries, else)."""
    import ctypes

    n = len(env)
    head = env[:-1]
    # C strings end at the first NUL: refuse one inside, as subprocess does
    # (the entries of the cached array were checked when it was built).
    if n and b"\0" in env[-1]:
        raise ValueError(_NUL)
    cached_head, cached = _ENV_ARRAY
    if n == 0 or cached_head is None or len(cached_head) != n - 1 or cached_head != head:
        if b"\0" in b"".join(head):
            raise ValueError(_NUL)
        cached = (ctypes.c_char_p * (n + 1))(*env, None)
        _ENV_ARRAY[:] = [list(head), cached]  # the array keeps the entries alive
    array = type(cached)()  # a copy: the cached array itself is never changed
    ctypes.memmove(array, cached, ctypes.sizeof(cached))
    if n:
        array[n - 1] = env[-1]
    return array, cached


def _spawn_with(
    fn: Any,
    program: str,
    argv: Sequence[str],
    env: Sequence[bytes],
    cwd: str | None,
    fds: tuple[int, int, int],
    cgroup_fd: int,
    keep: Sequence[int] = (),
) -> tuple[int, int, int]:
    import ctypes

    pidfd, error = ctypes.c_int(-1), ctypes.c_int(0)
    kept = sorted({fd for fd in keep if fd > 2}) if keep else []
    c_keep = _array_type(ctypes.c_int, len(kept))(*kept) if kept else None
    born = _array_type(ctypes.c_longlong, 2)()
    args = [os.fsencode(a) for a in argv]
    # C strings end at the first NUL: refuse one inside, as subprocess does
    # (the environment's entries: in _env_array).
    if b"\0" in b"".join(args) or "\0" in program or (cwd is not None and "\0" in cwd):
        raise ValueError(_NUL)
    c_argv = _array_type(ctypes.c_char_p, len(args) + 1)(*args, None)
    c_env, _entries = _env_array(env)  # _entries: held until fn() returns
    pid = fn(
        os.fsencode(program),
        c_argv,
        c_env,
        None if cwd is None else os.fsencode(cwd),
        fds[0],
        fds[1],
        fds[2],
        c_keep,
        len(kept),
        cgroup_fd,
        ctypes.byref(pidfd),
        ctypes.byref(error),
        born,
    )
    if pid >= 0:
        return int(pid), pidfd.value, start_tick(born[0], born[1])
    code = error.value or errno.EINVAL
    if pid == -2:
        raise CloneRefused(code, f"clone3 refused: {os.strerror(code)}")
    bad_cwd = (
        cwd is not None and code in (errno.ENOENT, errno.ENOTDIR, errno.EACCES) and not os.path.isdir(cwd)
    )
    raise OSError(code, os.strerror(code), cwd if bad_cwd else program)


# How far from a tick's edge both ends of the birth bracket must be (ns):
# the child's start time is then surely that tick (see start_tick).
BORN_MARGIN = 50_000


@functools.cache
def _tick_ns() -> int:
    """A clock tick of /proc/PID/stat's starttime, in ns (0: unknown)."""
    try:
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0
    return 1_000_000_000 // hz if hz > 0 and 1_000_000_000 % hz == 0 else 0


def start_tick(before: int, born: int) -> int:
    """The child's start time in clock ticks since boot (as /proc/PID/stat
    gives it), from the spawner's bracket: CLOCK_BOOTTIME just before the
    clone (`before`) and read by the child as its first act (`born`), in ns.
    The kernel stamps the start between the two (copy_process, on the same
    clock, shifted by the same time namespace) and reports it rounded down
    to a tick; so when the bracket, widened by BORN_MARGIN on both sides,
    lies within one tick, that tick is the start. 0 (unknown: read
    /proc/PID/stat) otherwise, ~3 % of spawns."""
    tick = _tick_ns()
    if tick <= 0 or before <= 0 or born < before:
        return 0
    first = (before - BORN_MARGIN) // tick
    return first if first == (born + BORN_MARGIN) // tick else 0


def spawn_into(
    program: str,
    argv: Sequence[str],
    env: Sequence[bytes],
    cwd: str | os.PathLike[str] | None,
    fds: tuple[int, int, int],
    cgroup_fd: int,
    keep: Sequence[int] = (),
    *,
    from_worker: bool = False,
) -> tuple[int, int, int]:
    """Start `program` (its argv `argv`) in a new session inside the cgroup
    open on `cgroup_fd`, with stdio `fds` and the descriptors `keep` passed
    on; return its pid, its pidfd and its start time in clock ticks (0:
    unknown, see start_tick). `from_worker`: the clone is made by the
    cloner's thread, the caller waiting (see _cloner.py).
    Raises the OSError of the exec (as subprocess does), or CloneRefused."""
    path = compiled_spawner()
    if path is None:
        raise CloneRefused(errno.ENOSYS, "no spawner")
    fn = _function(path)
    if from_worker:
        from ._cloner import clone_in_worker

        fn = clone_in_worker(fn)
    return _spawn_with(fn, program, argv, env, None if cwd is None else os.fspath(cwd), fds, cgroup_fd, keep)


# Set when clone3 was refused here for a spawn with no cgroup (ENOSYS on an
# old kernel, EPERM or ENOSYS from a container's seccomp filter):
# process-group commands go through subprocess.Popen from then on.
_PLAIN_REFUSED: list[int] = []


def spawn_plain(
    program: str,
    argv: Sequence[str],
    env: Sequence[bytes],
    cwd: str | os.PathLike[str] | None,
    fds: tuple[int, int, int],
    keep: Sequence[int] = (),
) -> tuple[int, int, int] | None:
    """Start `program` (its argv `argv`, its environment the KEY=value
    entries `env`) in a new session through the spawner, in our own cgroup:
    its pid, pidfd and start time (as spawn_into), or None where there is no spawner or clone3 is
    refused here (the caller uses Popen). After an idle gap the clone is made
    by the cloner's thread (_cloner.py). Raises the exec's OSError as
    subprocess does, and what a fork would raise at a resource limit."""
    if _PLAIN_REFUSED:
        return None
    from ._cloner import after_idle

    try:
        return spawn_into(program, argv, env, cwd, fds, -1, keep, from_worker=after_idle())
    except CloneRefused as exc:
        if exc.errno in (errno.EAGAIN, errno.ENOMEM):
            raise OSError(exc.errno, os.strerror(exc.errno)) from None
        _PLAIN_REFUSED.append(exc.errno or errno.ENOSYS)
        return None


def _readable_within(fd: int, timeout: float) -> bool:
    """Block until `fd` is readable (a pidfd: its process ended), at most
    `timeout` seconds. poll(2), not select(2): select refuses a descriptor
    numbered 1024 or more, which a process with many files open is given."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


# A trial's status when the program ran and exited but its status could not
# be read: the process ignores SIGCHLD (the kernel reaps its children), or
# waited for any child. The spawn itself worked: a failed exec is reported
# by the spawner before it returns.
STATUS_LOST = 256


def _trial(fn: Any, program: str, argv: Sequence[str], cgroup_fd: int, timeout: float) -> int | None:
    """Run `program` through the spawner `fn` with no stdio, inside the
    cgroup open on `cgroup_fd` (-1: none), and wait at most `timeout` for it:
    its exit status (STATUS_LOST if it cannot be read), or None when it had
    to be killed. Raises what the spawn raises (CloneRefused, the exec's
    OSError)."""
    from . import _pidfd  # (imports trio: only where a trial runs)

    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        _pid, pidfd, _ = _spawn_with(fn, program, argv, [], None, (null, null, null), cgroup_fd)
    finally:
        os.close(null)
    try:
        ready = _readable_within(pidfd, timeout)
        if not ready:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        code = _pidfd.reap_exited(pidfd)
    finally:
        os.close(pidfd)
    if not ready:
        return None
    return STATUS_LOST if code is None else code


def spawner_trial(program: str, argv: Sequence[str], cgroup_fd: int, timeout: float) -> int | None:
    """_trial through this process's spawner (CloneRefused without one)."""
    path = compiled_spawner()
    if path is None:
        raise CloneRefused(errno.ENOSYS, "no spawner")
    return _trial(_function(path), program, argv, cgroup_fd, timeout)


def _spawner_works(fd: int) -> bool:
    """The spawner open on `fd` loads and starts a program (no cgroup).

    A kernel (or a seccomp filter, as container runtimes install) that
    refuses clone3 does not make the build bad: it is kept, and the cgroup
    probe (_cgroup._spawner_enters) finds that it cannot place commands, so
    they go through a shim, without a rebuild in every process."""
    path = _fd_path(fd)
    try:
        st, via = os.fstat(fd), os.stat(path)
        if (st.st_dev, st.st_ino) != (via.st_dev, via.st_ino):
            return False
        return _trial(_function(path), "/bin/sh", ["sh", "-c", "exit 7"], -1, 10) in (7, STATUS_LOST)
    except CloneRefused:
        return True
    except (OSError, AttributeError):
        return False


def shim_argv(procs: str, argv: Sequence[str], name: str | None = None) -> list[str]:
    """The argv that enters the cgroup of `procs` and then runs `argv`
    (argv[0] the program's path); the command sees `name` as its argv[0]
    where the shim can arrange it (the compiled ones; the /bin/sh shim's
    `exec` cannot, so there it sees the path)."""
    shim = compiled_shim()
    if shim is not None:
        return [shim, procs, argv[0], argv[0] if name is None else name, *argv[1:]]
    if len(argv) == 3 and argv[0] == "/bin/sh" and argv[1] == "-c":
        return ["/bin/sh", "-c", _SHIM_EVAL, "sh", procs, argv[2]]
    return ["/bin/sh", "-c", _SHIM_EXEC, procs, *argv]
