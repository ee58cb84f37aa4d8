# Spawn preparation: from the caller's arguments to a leader running inside
# its domain, with its pipes, drains and stdin feeder ready.
#
# Everything that can be refused is refused here, before anything runs:
# budgets (negative, NaN, infinite), a bad max_output, a missing executable,
# a bad cwd, an unavailable domain. Then, in this order: the fds (a pipe per
# captured stream, /dev/null or a file otherwise), the domain's preparation
# (a fresh cgroup and its placement shim), the pid mark (every descendant's
# pid is allocated after it, see _procfs), the spawn in a new session, and
# the domain taking hold of the leader. A failure at any step undoes the
# steps before it, so a spawn that raises leaves nothing running.

from __future__ import annotations

import math
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import trio

from . import _keeper, _procfs
from ._census import COOKIE_VAR, Census, EscapeePolicy
from ._choice import DomainName, make_domain
from ._domain import Domain
from ._drain import Drain
from ._leader import Leader
from ._stdin import Feeder, HasFileno, StdinSource

CAPTURE = "capture"
STDOUT = "stdout"
DEVNULL = "devnull"
INHERIT = "inherit"  # the caller's own stream (our fd 1 or 2), passed as is
# A target: one of the names above, a file path, or an open fd / file
# object (passed to the command as is, not closed by us).
Target: TypeAlias = "str | os.PathLike[str] | int | HasFileno"
Command: TypeAlias = "str | Sequence[str | os.PathLike[str]]"


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


def resolve_argv(command: Command, cwd: str | os.PathLike[str] | None, path: str | None) -> list[str]:
    """The argv to execute; a missing or non-executable program raises the
    OSError subclass the OS would give, before anything is spawned."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = [os.fspath(a) for a in command]
    if not argv:
        msg = "the command is empty"
        raise ValueError(msg)
    exe = argv[0]
    if os.sep not in exe:
        found = shutil.which(exe, path=path)
        if found is None:
            msg = f"executable not found on PATH: {exe!r}"
            raise FileNotFoundError(2, msg, exe)
        argv[0] = found
    else:
        full = exe if cwd is None or os.path.isabs(exe) else os.path.join(os.fspath(cwd), exe)
        try:
            mode = os.stat(full).st_mode
        except (OSError, ValueError):  # as os.path.exists: missing, unreachable, or a bad name
            msg = f"executable not found: {exe!r}"
            raise FileNotFoundError(2, msg, exe) from None
        if stat.S_ISDIR(mode) or not os.access(full, os.X_OK):
            msg = f"not an executable file: {exe!r}"
            raise PermissionError(13, msg, exe)
    return argv


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


def given_name(command: Command, argv: Sequence[str]) -> str:
    """The command's argv[0] as the caller gave it (resolve_argv puts the
    program's path in its place)."""
    if isinstance(command, str):
        return argv[0]
    return os.fspath(next(iter(command)))


def check_cwd(cwd: str | os.PathLike[str] | None) -> None:
    if cwd is not None and not os.path.isdir(cwd):
        where = os.fspath(cwd)
        if not os.path.exists(cwd):
            raise FileNotFoundError(2, f"cwd does not exist: {where!r}", where)
        raise NotADirectoryError(20, f"cwd is not a directory: {where!r}", where)


@dataclass(slots=True)
class Spawned:
    """A leader running in its domain, with what was prepared around it."""

    leader: Leader
    domain: Domain
    census: Census
    started: float  # trio.current_time() of the spawn
    drains: dict[str, Drain] = field(default_factory=dict)
    feeder: Feeder | None = None
    targets: dict[str, str] = field(default_factory=dict)  # where each uncaptured stream goes
    guard: _keeper.Guard = field(default_factory=lambda: _keeper.Guard(0, "unknown"))  # what the keeper knows


def spawn(
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
    keeper_grace: float = 2.0,
) -> tuple[list[str], Spawned]:
    """Spawn `command` into a new domain; return its argv and what was made.
    Raises before anything is left running."""
    check_max_output(max_output)
    if stdout == STDOUT:
        msg = "stdout cannot be merged into itself"
        raise ValueError(msg)
    census = Census(escapees, Census.inherited(os.environ, env))
    child_env = child_environment(env, COOKIE_VAR, census.value)
    argv = resolve_argv(command, cwd, (os.environ if env is None else env).get("PATH", os.defpath))
    check_cwd(cwd)
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
        program, spawn_argv = own_domain.command_line(argv, given_name(command, argv))
        mark = _procfs.spawn_mark()  # before the spawn: every descendant's pid comes after it
        try:
            leader = Leader.spawn(
                spawn_argv,
                executable=program,
                stdin=stdin_fd,
                stdout=out_fd,
                stderr=err_fd,
                cwd=cwd,
                env=child_env,
                cgroup_fd=own_domain.spawn_cgroup_fd(),
            )
            leader.mark = mark
        except BaseException:
            own_domain.abort_spawn()
            raise
        started = trio.current_time()
        try:
            own_domain.attach(leader, started)
            # Made now, not before the spawn: the command is already running.
            drains = {name: Drain(name, fd, max_output) for name, fd in pipes.items()}
        except BaseException:
            leader.kill_now()
            leader.reap()
            own_domain.release()
            raise
        feeder = Feeder(feeder_fd, feeder_src) if feeder_src is not None and feeder_fd is not None else None
    except BaseException:
        for fd in parent_fds:
            os.close(fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    # The keeper ends the domain if this process dies before its teardown:
    # one write to its pipe (started at the first command, see _keeper.py).
    cgroup = getattr(own_domain, "path", "")
    told = _keeper.Entry(keeper_grace, leader.pid, leader.start, census.token, cgroup)
    guard = _keeper.opened(told, keeper)
    return argv, Spawned(leader, own_domain, census, started, drains, feeder, targets, guard)


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
        os.fstat(fd)  # a closed stream raises EBADF before anything is started
        targets[name] = "inherited"
        return fd
    if not isinstance(target, (str, os.PathLike)):
        fd = _given_fd(name, target)
        targets[name] = f"fd {fd}"
        return fd
    fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC) if target == DEVNULL else _open_target(target)
    child_fds.append(fd)
    targets[name] = "devnull" if target == DEVNULL else f"file {os.fspath(target)}"
    return fd
