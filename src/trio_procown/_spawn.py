# Spawn preparation: from the caller's arguments to a leader running inside
# its domain, with its pipes, drains and stdin feeder ready.
#
# Everything that can be refused is refused here, before anything runs:
# budgets (negative, NaN, infinite), a bad max_output, a missing executable,
# a bad cwd, an unavailable domain. Then, in this order: the fds (a pipe per
# captured stream, /dev/null or a file otherwise), the domain's preparation
# (a fresh cgroup and its placement shim), the clone count for the pid
# mark (see _procfs.spawn_mark), the spawn in a new session, the pid mark
# (just below the leader: every descendant's pid is allocated after it), and
# the domain taking hold of the leader. A failure at any step undoes the
# steps before it, so a spawn that raises leaves nothing running.

from __future__ import annotations

import errno
import functools
import math
import os
import stat
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, TypeAlias

import outcome
import trio

from . import _clock, _keeper, _procfs
from ._budgets import DEFAULT_GRACE
from ._census import COOKIE_VAR, Census, EscapeePolicy
from ._choice import DomainName, make_domain
from ._domain import Domain
from ._drain import Drain
from ._leader import Leader, reap_deferred
from ._stdin import Feeder, HasFileno, StdinSource

CAPTURE = "capture"
STDOUT = "stdout"
DEVNULL = "devnull"
INHERIT = "inherit"  # the caller's own stream (our fd 1 or 2), passed as is
# A target: one of the names above, a file path, or an open fd / file
# object (passed to the command as is, not closed by us).
Target: TypeAlias = "str | os.PathLike[str] | int | HasFileno"
Command: TypeAlias = "str | os.PathLike[str] | Sequence[str | bytes | os.PathLike[str]]"


def check_budget(name: str, value: float | None, *, optional: bool = False) -> None:
    """Refuse a budget that is not a finite, non-negative number of seconds
    (an `optional` one, the timeout, may also be None or inf: no deadline)."""
    if value is None and optional:
        return
    if optional and value == math.inf:
        return  # timeout=inf: no deadline of its own, like None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        msg = f"{name} must be a number of seconds, not {value!r}"
        raise TypeError(msg)
    if math.isnan(value) or value < 0 or math.isinf(value):
        # inf would make the teardown unbounded: every budget has a bound.
        msg = f"{name} must be a finite, non-negative number of seconds, not {value!r}"
        raise ValueError(msg)


def check_max_output(max_output: object) -> None:
    if not isinstance(max_output, int) or isinstance(max_output, bool) or max_output < 0:
        msg = f"max_output must be a non-negative int, not {max_output!r}"
        raise ValueError(msg)


def normalize_command(command: object) -> str | list[str]:
    """A command as a shell line (str) or an argv list of str: a path-like
    alone is one program, bytes and path-like arguments are decoded as the
    OS would (os.fsdecode), any other iterable is read once. Anything else
    is refused with a TypeError that says what a command may be."""
    if isinstance(command, str):
        return command
    if isinstance(command, os.PathLike):
        return [os.fsdecode(command)]
    if isinstance(command, (bytes, bytearray, memoryview)):
        msg = (
            "command must be a str (a shell line, run by /bin/sh -c) or a sequence of arguments, "
            f"not {type(command).__name__}: decode it, or pass [program, *args]"
        )
        raise TypeError(msg)
    try:
        items = list(command)  # type: ignore[call-overload]
    except TypeError:
        msg = (
            "command must be a str (a shell line, run by /bin/sh -c) or a sequence of arguments, "
            f"not {type(command).__name__}"
        )
        raise TypeError(msg) from None
    argv: list[str] = []
    for item in items:
        if not isinstance(item, (str, bytes, os.PathLike)):
            msg = f"each argument must be str, bytes or os.PathLike, not {type(item).__name__}: {item!r}"
            raise TypeError(msg)
        argv.append(os.fsdecode(item))
    return argv


def inheritable(fd: int) -> bool:
    """Whether `fd` is open and inheritable (not close-on-exec): a stdio
    stream of ours to pass on, not a closed number some fd of ours took."""
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False


def inherited_fds() -> tuple[int, ...]:
    """Our open descriptors above 2 that a command we exec would inherit (not
    close-on-exec): what a shell passes on to its commands, and GNU timeout
    to its command (a make jobserver's pipe, a `3<file` redirection)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return ()
    return tuple(sorted(fd for fd in map(int, names) if fd > 2 and inheritable(fd)))


def exec_path(env: Mapping[str, str] | None) -> str:
    """The PATH a program name is looked up on: `env`'s (a str or a bytes
    key, as subprocess reads it), ours when env is None, else os.defpath.
    (Read directly: os.get_exec_path costs a warnings context per call, a
    tenth of a spawn's Python work.)"""
    if env is None:
        return os.environ.get("PATH", os.defpath)
    path = env.get("PATH")
    if path is None:
        path = env.get(b"PATH")  # type: ignore[call-overload]
    return os.defpath if path is None else os.fsdecode(path)


def command_failure(exc: OSError, argv: Sequence[str]) -> int | None:
    """The errno when `exc`, raised by the spawn of `argv` (a program and its
    arguments, run with our PATH and cwd), says the command itself cannot be
    run, as a shell or GNU timeout tells it apart (127 for ENOENT, 126 for
    anything else): not found, not executable, or its exec failed (a "Text
    file busy" program, an argument list too long, ...), which the spawn
    reports against the program it ran. None for a failure to set the
    command up (a pipe, the domain, ...)."""
    if isinstance(exc, (FileNotFoundError, PermissionError)) or exc.errno in (
        errno.ENOEXEC,
        errno.EISDIR,
        errno.ENOTDIR,
    ):
        return exc.errno or errno.EACCES
    if not exc.errno or exc.filename is None:
        return None
    try:
        program = resolve_argv(list(argv), None, exec_path(None))[0]
    except (OSError, ValueError):
        return None
    return exc.errno if os.fsdecode(exc.filename) == program else None


def resolve_argv(command: str | list[str], cwd: str | os.PathLike[str] | None, path: str | None) -> list[str]:
    """The argv to execute; a missing or non-executable program raises the
    OSError subclass the OS would give (as subprocess does), before anything
    is spawned; an argument with a NUL raises ValueError."""
    if isinstance(command, str):
        if "\0" in command:
            raise ValueError("embedded null byte")
        return ["/bin/sh", "-c", command]
    argv = list(command)  # (normalized by the caller: our copy, argv[0] is replaced below)
    if not argv:
        msg = "the command is empty"
        raise ValueError(msg)
    if any("\0" in arg for arg in argv):
        raise ValueError("embedded null byte")
    exe = argv[0]
    if not exe:
        raise FileNotFoundError(errno.ENOENT, _said(errno.ENOENT, "executable not found"), exe)
    if os.sep not in exe:
        found = on_path(exe, path, cwd)
        if found is None:
            _not_on_path(exe, path, cwd)
        else:
            argv[0] = found
    else:
        full = exe if cwd is None or os.path.isabs(exe) else os.path.join(os.fspath(cwd), exe)
        try:
            mode = os.stat(full).st_mode
        except OSError as exc:  # missing, a file as a directory, a loop, a name too long: the OS's error
            raise OSError(exc.errno, _why("executable", exc), exe) from None
        if stat.S_ISDIR(mode) or not os.access(full, os.X_OK):
            raise PermissionError(errno.EACCES, _said(errno.EACCES, "not an executable file"), exe)
    return argv


def _on_path(name: str, path: str | None, cwd: str | os.PathLike[str] | None) -> Iterator[tuple[str, str]]:
    """Each place the child's exec looks for `name` on `path`, in order: the
    path as given to exec, and where it is from here (an empty or relative
    entry counts from `cwd`, where the command will run, as in subprocess)."""
    for folder in (path or "").split(os.pathsep):
        candidate = f"{folder or '.'}/{name}"
        yield (
            candidate,
            candidate if cwd is None or folder.startswith("/") else os.path.join(os.fspath(cwd), candidate),
        )


def on_path(name: str, path: str | None, cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The first file called `name` in `path`'s folders that we may execute
    and is not a directory, as the child's exec would find it (_on_path);
    None if there is none. What shutil.which answers, in half its time:
    access() first, which fails without an exception, then one stat for the
    folder case (a bare name's lookup on a PATH of 11 folders cost 28 us
    here through shutil.which, 14 us this way)."""
    for candidate, where in _on_path(name, path, cwd):
        if os.access(where, os.X_OK):
            try:
                mode = os.stat(where).st_mode
            except OSError:
                continue
            if not stat.S_ISDIR(mode):
                return candidate
    return None


def _why(what: str, exc: OSError) -> str:
    code = exc.errno or 0
    if code == errno.ENOENT:
        return _said(code, f"{what} not found" if what == "executable" else f"{what} does not exist")
    return _said(code, f"{what} is unusable")


def _said(code: int, why: str) -> str:
    """The OS's own words for `code` (what subprocess says, and what code
    written for it may match), then which input it was about."""
    return f"{os.strerror(code)} ({why})"


# What execvp(3) (glibc's) does with a bare name, folder by folder: EACCES
# (a folder we may not search, a file we may not execute, a folder of that
# name) is remembered and reported if no later folder has the program;
# these errors go on to the next folder; any other stops the search with
# itself. Python's subprocess reports the same (the first error other than
# ENOENT and ENOTDIR), and GNU timeout exits 126 for EACCES, 127 for ENOENT.
_NEXT_FOLDER = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ESTALE, errno.ENODEV, errno.ETIMEDOUT})


def _not_on_path(exe: str, path: str | None, cwd: str | os.PathLike[str] | None) -> NoReturn:
    """Raise what exec would for a name not found on PATH (see
    _NEXT_FOLDER): PermissionError if a file of that name is there but
    cannot be run, or a folder on PATH cannot be searched (as root, none
    is unsearchable), FileNotFoundError if it is nowhere."""
    denied: OSError | None = None
    for _, where in _on_path(exe, path, cwd):
        try:
            os.stat(where)
        except OSError as exc:
            code = exc.errno or errno.ENOENT
            if code in _NEXT_FOLDER:
                continue
            if code != errno.EACCES:
                raise OSError(code, _said(code, "while looking on PATH"), where) from None
            why = "not found on PATH; a folder on it cannot be searched"
            denied = denied or PermissionError(code, _said(code, why), where)
            continue
        # There, but a folder or not executable (or on_path had taken it).
        why = "on PATH but not executable"
        denied = denied or PermissionError(errno.EACCES, _said(errno.EACCES, why), where)
    if denied is not None:
        raise denied
    raise FileNotFoundError(errno.ENOENT, _said(errno.ENOENT, "executable not found on PATH"), exe)


# Our own environment, encoded, as last seen: (a copy of os.environ's
# bytes, the key left out, its other KEY=value entries). Most commands
# inherit it unchanged, so it is encoded once, not once per spawn.
_OURS: tuple[dict[bytes, bytes], bytes, list[bytes]] = ({}, b"", [])


def child_environment(env: Mapping[str, str] | None, key: str, value: str) -> list[bytes]:
    """The child's environment as KEY=value entries: `env` (None: ours, as
    it is now) with `key` set to `value`."""
    global _OURS
    extra = os.fsencode(key) + b"="
    if env is None:
        data: dict[bytes, bytes] | None = getattr(os.environ, "_data", None)
        if isinstance(data, dict):
            if data != _OURS[0] or extra != _OURS[1]:
                kept = [k + b"=" + v for k, v in data.items() if k + b"=" != extra]
                _OURS = (dict(data), extra, kept)
            return [*_OURS[2], extra + os.fsencode(value)]
        env = os.environ
    entries = []
    for k, v in env.items():
        name = os.fsencode(k)
        if not name or b"=" in name:
            msg = f"illegal environment variable name: {k!r}"
            raise ValueError(msg)
        if k != key:
            entries.append(name + b"=" + os.fsencode(v))
    return [*entries, extra + os.fsencode(value)]


def with_executable(command: str | list[str], executable: object) -> tuple[list[str], str]:
    """The argv that runs `executable` in place of the program `command`
    names, and the argv[0] it is given, as Popen's executable=: a sequence
    keeps its first item as the program's name only; a shell line runs
    under `executable` instead of /bin/sh (`executable -c LINE`). Found on
    PATH like a program, with the same errors."""
    if not isinstance(executable, (str, bytes, os.PathLike)):
        msg = f"executable must be a path (str, bytes or os.PathLike), not {type(executable).__name__}"
        raise TypeError(msg)
    program = os.fsdecode(executable)
    if isinstance(command, str):
        return [program, "-c", command], program
    if not command:
        msg = "the command is empty"
        raise ValueError(msg)
    return [program, *command[1:]], command[0]


def given_name(command: str | list[str], argv: Sequence[str]) -> str:
    """The command's argv[0] as the caller gave it (resolve_argv puts the
    program's path in its place)."""
    if isinstance(command, str):
        return argv[0]
    return command[0]


def check_pass_fds(pass_fds: Sequence[int], domain: DomainName) -> tuple[int, ...]:
    """The descriptors above 2 to pass on, each checked open (EBADF
    otherwise, before anything runs); refused for a Slurm job, whose
    command runs where our descriptors are not."""
    if pass_fds is None:
        return ()
    if isinstance(pass_fds, (str, bytes)) or not all(
        isinstance(fd, int) and not isinstance(fd, bool) for fd in pass_fds
    ):
        msg = f"pass_fds must be a sequence of file descriptors (ints), not {pass_fds!r}"
        raise TypeError(msg)
    passed = tuple(sorted({fd for fd in pass_fds if fd > 2}))
    if not passed:
        return passed
    if not isinstance(domain, str) or domain == "slurm":  # "slurm" or a SlurmDomain
        msg = "pass_fds cannot reach a command run as a Slurm job"
        raise ValueError(msg)
    for fd in passed:
        os.fstat(fd)  # a closed fd raises EBADF here
    return passed


def check_cwd(cwd: str | os.PathLike[str] | bytes | None) -> str | None:
    """The cwd as a str, once it is known to be a directory: the OS's error
    otherwise (a NUL in it is a ValueError, as in subprocess)."""
    if cwd is None:
        return None
    where = os.fsdecode(cwd)
    if "\0" in where:
        raise ValueError("embedded null byte")
    try:
        mode = os.stat(where).st_mode
    except OSError as exc:
        raise OSError(exc.errno, _why("cwd", exc), where) from None
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, _said(errno.ENOTDIR, "cwd is not a directory"), where)
    return where


@dataclass(slots=True)
class Spawned:
    """A leader running in its domain, with what was prepared around it."""

    leader: Leader
    domain: Domain
    census: Census
    started: float  # trio.current_time() of the spawn
    origin: float  # teardown time of the spawn (_clock.py): the receipt's times count from it
    drains: dict[str, Drain] = field(default_factory=dict)
    feeder: Feeder | None = None
    targets: dict[str, str] = field(default_factory=dict)  # where each uncaptured stream goes
    guard: _keeper.Guard = field(default_factory=lambda: _keeper.Guard(0, "unknown"))  # what the keeper knows


# The spawn, as steps: what comes before the clone, then (yielded) the
# clone itself, a call that blocks until the command has exec'd (in the
# kernel's vfork wait, ~0.15 ms when the machine is idle, milliseconds
# when other commands' processes hold the CPUs), then what follows it. The
# caller makes the clone on the event loop's thread, or, while other
# commands are live, in a worker thread (open_owned_command), so that the
# loop serves them meanwhile; everything else runs on the loop.
SpawnSteps: TypeAlias = Generator[Callable[[], Leader], Leader, tuple[list[str], Spawned]]


def spawn_steps(
    command: Command,
    *,
    stdin: StdinSource,
    stdout: Target,
    stderr: Target,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    domain: DomainName,
    escapees: EscapeePolicy,
    max_output: int,
    subreaper: bool,
    keeper: bool = True,
    keeper_grace: float = DEFAULT_GRACE,
    pass_fds: Sequence[int] = (),
    executable: str | os.PathLike[str] | None = None,
) -> SpawnSteps:
    """Spawn `command` into a new domain; return its argv and what was made
    (with `executable`, see with_executable). Raises before anything is
    left running. Steps (see SpawnSteps): yields the clone, to be sent
    back the Leader it returned (or thrown what it raised)."""
    check_max_output(max_output)
    passed = check_pass_fds(pass_fds, domain)
    if stdout == STDOUT:
        msg = "stdout cannot be merged into itself"
        raise ValueError(msg)
    census = Census(escapees, Census.inherited(os.environ, env))
    child_env = child_environment(env, COOKIE_VAR, census.value)
    command = normalize_command(command)
    cwd = check_cwd(cwd)
    name: str | None = None
    if executable is not None:
        command, name = with_executable(command, executable)
    argv = resolve_argv(command, cwd, exec_path(env))
    own_domain = make_domain(domain)
    if subreaper:
        from ._subreaper import enable_subreaper

        enable_subreaper()

    pipes: dict[str, int] = {}  # each captured stream's read end: its drain is made after the spawn
    targets: dict[str, str] = {}
    parent_fds: list[int] = []
    child_fds: list[int] = []
    try:
        stdin_fd, feeder_fd, feeder_src = _stdin_fd(stdin, parent_fds, child_fds)
        out_fd = _output_fd("stdout", stdout, pipes, targets, parent_fds, child_fds)
        if stderr == STDOUT:
            err_fd = out_fd
            targets["stderr"] = "merged into stdout"
        else:
            err_fd = _output_fd("stderr", stderr, pipes, targets, parent_fds, child_fds)
        program, spawn_argv = own_domain.command_line(argv, name or given_name(command, argv))
        # The keeper ends the domain if this process dies before its
        # teardown (started at the first command, see _keeper.py). It is told
        # before the spawn, of what is known then (the cgroup, the census
        # token): a command may kill this process before the spawn returns.
        # Once the leader is known, the line is told again with it.
        mark = _procfs.spawn_mark()  # its clone count before the spawn (mark_of)
        told = _keeper.Entry(keeper_grace, token=census.token, cgroup=getattr(own_domain, "path", ""))
        guard = _keeper.opened(told, keeper)
        try:
            reap_deferred()  # (on the loop's thread: the clone may not be)
            leader = yield functools.partial(
                Leader.spawn,
                spawn_argv,
                executable=program,
                stdin=stdin_fd,
                stdout=out_fd,
                stderr=err_fd,
                cwd=cwd,
                env=child_env,
                cgroup_fd=own_domain.spawn_cgroup_fd(),
                pass_fds=passed,
            )
            leader.mark = _procfs.mark_of(mark, leader.pid)  # every descendant's pid comes after it
        except BaseException:
            own_domain.abort_spawn()
            guard.close()
            raise
        started = trio.current_time()
        origin = _clock.at(started)
        try:
            own_domain.attach(leader, started)
            # Made now, not before the spawn: the command is already running.
            drains = {name: Drain(name, fd, max_output) for name, fd in pipes.items()}
        except BaseException:
            leader.kill_now()
            if not leader.reap():  # (SIGKILL takes a moment): reaped at a later spawn
                leader.defer()
            own_domain.release()
            guard.close()
            raise
        feeder = Feeder(feeder_fd, feeder_src) if feeder_src is not None and feeder_fd is not None else None
    except BaseException:
        for fd in parent_fds:
            os.close(fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    told.leader, told.start = leader.pid, leader.start
    _keeper.attached(guard, told)
    return argv, Spawned(leader, own_domain, census, started, origin, drains, feeder, targets, guard)


def _open_target(target: str | os.PathLike[str]) -> int:
    return os.open(os.fspath(target), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)


def _given_fd(name: str, target: object) -> int:
    """An open fd, or a file object's, given as an output target."""
    if isinstance(target, bool):
        fd = -1
    elif isinstance(target, int):
        fd = target
    elif callable(getattr(target, "fileno", None)):
        fd = target.fileno()  # type: ignore[attr-defined]
        flush = getattr(target, "flush", None)
        if callable(flush):
            flush()  # what Python buffered goes first, in order
    else:
        msg = (
            f"{name} must be 'capture', 'devnull', 'inherit', a path, an open file descriptor "
            f"or file object{', or stdout' if name == 'stderr' else ''}, not {type(target).__name__}"
        )
        raise TypeError(msg)
    if not isinstance(fd, int) or fd < 0:
        msg = f"{name} must be an open file descriptor (>= 0), not {fd!r}"
        raise ValueError(msg)
    os.fstat(fd)  # a closed fd raises EBADF here, before anything is started
    return fd


def _stdin_fd(
    stdin: StdinSource, parent_fds: list[int], child_fds: list[int]
) -> tuple[int, int | None, bytes | trio.abc.ReceiveStream | None]:
    """The child's stdin fd, and the feeder's fd and source if one is needed."""
    if stdin is None:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        child_fds.append(fd)
        return fd, None, None
    if isinstance(stdin, (bytes, bytearray, memoryview, trio.abc.ReceiveStream)):
        r, w = os.pipe()
        parent_fds.append(w)
        child_fds.append(r)
        src = stdin if isinstance(stdin, trio.abc.ReceiveStream) else bytes(stdin)
        return r, w, src
    if isinstance(stdin, (str, os.PathLike)):
        fd = os.open(os.fspath(stdin), os.O_RDONLY | os.O_CLOEXEC)
        child_fds.append(fd)
        return fd, None, None
    if (isinstance(stdin, int) and not isinstance(stdin, bool)) or callable(getattr(stdin, "fileno", None)):
        # An open fd (or file object) is handed over as a shell's `< file`
        # would: the child inherits the same open file description, so it
        # reads from (and moves) the caller's offset. Not reopened, not
        # dup'd by us, and not closed: the fd stays the caller's.
        fd = stdin if isinstance(stdin, int) else stdin.fileno()
        if fd < 0:
            msg = f"stdin must be an open file descriptor (>= 0), not {fd}"
            raise ValueError(msg)
        os.fstat(fd)  # a closed fd raises EBADF here, before anything is started
        return fd, None, None
    msg = (
        "stdin must be None, bytes, a path, an open file descriptor or file object, "
        f"or a trio ReceiveStream, not {type(stdin).__name__}"
    )
    raise TypeError(msg)


def _output_fd(
    name: str,
    target: Target,
    pipes: dict[str, int],
    targets: dict[str, str],
    parent_fds: list[int],
    child_fds: list[int],
) -> int:
    if target == CAPTURE:
        r, w = os.pipe()
        parent_fds.append(r)
        child_fds.append(w)
        pipes[name] = r
        return w
    if target == INHERIT:
        fd = 1 if name == "stdout" else 2
        if inheritable(fd):  # close-on-exec: not a stdout of ours (trio's epoll, a socket)
            targets[name] = "inherited"
            return fd
        fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        child_fds.append(fd)
        targets[name] = f"devnull (our fd {1 if name == 'stdout' else 2} is closed or close-on-exec)"
        return fd
    if not isinstance(target, (str, os.PathLike)):
        fd = _given_fd(name, target)
        targets[name] = f"fd {fd}"
        return fd
    fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC) if target == DEVNULL else _open_target(target)
    child_fds.append(fd)
    targets[name] = "devnull" if target == DEVNULL else f"file {os.fspath(target)}"
    return fd


def finish_spawn(steps: SpawnSteps, cloned: outcome.Outcome[Leader]) -> tuple[list[str], Spawned]:
    """Go on with spawn_steps after its clone, from what the clone gave."""
    try:
        cloned.send(steps)
    except StopIteration as done:
        result: tuple[list[str], Spawned] = done.value
        return result
    msg = "spawn_steps yields once"  # pragma: no cover - the steps have one clone
    raise AssertionError(msg)
