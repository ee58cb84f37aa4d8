# trio.run_process, owned: the one-import migration.
#
# `trio_procown.run_process` takes trio.run_process's arguments and gives its
# results (subprocess.CompletedProcess, CalledProcessError with the output,
# a process handle under nursery.start), and trio's own validation errors,
# word for word and in trio's order (then Popen's: a stream value with no
# fileno() is refused, never taken for one of open_owned_command's targets;
# a refused spawn's OSError is in Popen's words), so code and tests written
# against trio keep working (docs/migrating.md lists what differs). The
# difference is the point: the command runs in an owned domain
# (open_owned_command), so cancellation, a `check` failure or an error ends
# every process it started, within the teardown's bound, before anything
# propagates; the CompletedProcess carries the receipt (`.receipt`).
#
# How trio's arguments map onto an owned command:
#
#   stdin=b"..." (default b"")  -> fed through a pipe, then EOF
#   stdin=None                  -> the caller's stdin (fd 0), as trio
#   stdin=fd / file object      -> passed as is
#   stdin=subprocess.DEVNULL    -> /dev/null
#   stdin=subprocess.PIPE       -> (nursery.start only) handle.stdin, a SendStream
#   capture_stdout=True         -> the single drain ("capture")
#   stdout=None (default)       -> the caller's stdout ("inherit"), as trio
#   stdout=subprocess.PIPE      -> (nursery.start only) handle.stdout, a
#                                  ReceiveStream fed losslessly by the drain
#   stderr=subprocess.STDOUT    -> merged into stdout
#
# deliver_cancel is honoured as in trio: on cancellation it is called with
# the handle, shielded, until the direct process exits; then the owned
# teardown ends whatever else of the domain is left. Unlike trio's, its wait
# is bounded (grace + kill_wait), so a custom cancel can be gentler but can
# neither hang the caller nor leave the tree behind.
#
# Options that cannot be honoured while owning the tree raise instead of
# silently dropping ownership: preexec_fn (runs in the child before exec:
# unsafe with threads, and the domain must be entered first),
# start_new_session=False and process_group (the command always starts in a
# session of its own), close_fds=False (the command would hold our pipes).

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, cast, final

import trio

from . import _clock
from ._budgets import DEFAULT_DRAIN_WAIT, DEFAULT_KILL_WAIT
from ._command import CAPTURE, DEVNULL, INHERIT, STDOUT, OwnedCommand, Target, open_owned_command
from ._receipt import Receipt, signame

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._census import EscapeePolicy
    from ._choice import DomainName
from ._spawn import inheritable, normalize_command
from ._stdin import HasFileno

# Popen keywords that would give up ownership of the tree, and why. Each is
# accepted at its Popen default (what code spelling out the defaults passes),
# and refused otherwise.
_REFUSED = {
    "preexec_fn": "it runs in the child before exec, where the command must already be in its domain "
    "(and it is unsafe with threads)",
    "process_group": "the command always starts in a session and process group of its own, so only "
    "process_group=0 (a group of its own, led by it) can be honoured",
    "user": "changing user is not supported by the owned spawn",
    "group": "changing group is not supported by the owned spawn",
    "extra_groups": "changing groups is not supported by the owned spawn",
    "umask": "the owned spawn does not change the umask (set it in the command: sh -c 'umask 077; ...')",
    "restore_signals": "the command always starts with SIGPIPE, SIGXFZ and SIGXFSZ at their defaults",
    "pipesize": "the owned spawn does not resize pipes",
    "startupinfo": "Windows only",
    "creationflags": "Windows only",
}
_POPEN_DEFAULTS: dict[str, object] = {
    "preexec_fn": None,
    "process_group": None,
    "user": None,
    "group": None,
    "extra_groups": None,
    "umask": -1,
    "restore_signals": True,
    "pipesize": -1,
    "startupinfo": None,
    "creationflags": 0,
}
_TEXT_OPTIONS = ("universal_newlines", "text", "encoding", "errors", "bufsize")
# What trio's pipe streams give an unsized receive_some() at most.
_DEFAULT_RECEIVE_SIZE = 65536
# Options of trio_procown itself, accepted beside trio's.
# trio's own cancel gives the process 5 s between SIGTERM and SIGKILL; the
# drop-in gives the command (and now its tree) the same, unless told otherwise.
TRIO_CANCEL_GRACE = 5.0
_OWNED = ("grace", "kill_wait", "drain_wait", "domain", "escapees", "max_output", "first_signal", "pass_fds")


_Path = str | bytes | os.PathLike[str] | os.PathLike[bytes]


class RunProcessOptions(TypedDict, total=False):
    """The keyword arguments of `run_process` besides its own: those
    trio.run_process forwards to Popen on Unix (the same types; preexec_fn,
    process_group, user, group, extra_groups, umask, restore_signals and
    pipesize are refused at run time unless at Popen's default, see
    docs/migrating.md), then trio_procown's."""

    stdout: int | HasFileno | None
    stderr: int | HasFileno | None
    close_fds: bool
    cwd: _Path | None
    env: Mapping[str, str] | None
    executable: _Path | None
    preexec_fn: Callable[[], object] | None
    restore_signals: bool
    start_new_session: bool
    pass_fds: Sequence[int]
    group: str | int | None
    extra_groups: Iterable[str | int] | None
    user: str | int | None
    umask: int
    pipesize: int
    process_group: int | None
    grace: float
    kill_wait: float
    drain_wait: float
    domain: DomainName
    escapees: EscapeePolicy
    max_output: int
    first_signal: int


class OwnedCompletedProcess(subprocess.CompletedProcess[bytes]):
    """What `run_process` returns: a `subprocess.CompletedProcess` (same
    fields, same repr) that also carries the owned command's receipt."""

    receipt: Receipt

    def __repr__(self) -> str:
        return "CompletedProcess" + super().__repr__()[len(type(self).__name__) :]


class OwnedCalledProcessError(subprocess.CalledProcessError):
    """What `run_process` raises with ``check=True`` for a non-zero status:
    a `subprocess.CalledProcessError` (same fields, message and repr) that
    also carries the owned command's receipt."""

    receipt: Receipt

    def __repr__(self) -> str:
        return "CalledProcessError" + super().__repr__()[len(type(self).__name__) :]


@final
class OwnedProcess:
    """The handle `nursery.start(trio_procown.run_process, ...)` returns: the
    members of `trio.Process` that callers use, over an owned command.

    Synopsis::

        import functools

        async with trio.open_nursery() as nursery:
            start = functools.partial(trio_procown.run_process, ["sleep", "30"], check=False)
            proc = await nursery.start(start)
            proc.terminate()
            print(await proc.wait())
    """

    # trio.Process's own: its streams are bytes, never text.
    universal_newlines: Final = False
    encoding: Final = None
    errors: Final = None

    def __init__(
        self,
        run: OwnedCommand,
        args: object,
        stdin: trio.abc.SendStream | None,
        stdout: trio.abc.ReceiveStream | None,
        stderr: trio.abc.ReceiveStream | None,
    ) -> None:
        self.run = run  # the owned command (its receipt, its output record)
        self.args = args
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.stdio: trio.StapledStream[trio.abc.SendStream, trio.abc.ReceiveStream] | None = (
            trio.StapledStream(stdin, stdout) if stdin is not None and stdout is not None else None
        )

    @property
    def pid(self) -> int:
        return self.run.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (-N for signal N)."""
        return self.run.poll()

    def poll(self) -> int | None:
        return self.run.poll()

    async def wait(self) -> int:
        """Wait until the direct process has exited; return its status (at
        once, as trio's does, also while the teardown of what it started
        goes on)."""
        return await self.run._wait_exited()

    def send_signal(self, sig: int) -> None:
        self.run.send_signal(sig)

    def terminate(self) -> None:
        self.run.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.run.send_signal(signal.SIGKILL)

    def __repr__(self) -> str:
        # trio.Process's own words, as isinstance() answers as for it: a log
        # line or a test that matches trio's repr goes on matching
        # (type(proc) names OwnedProcess).
        return _trio_repr(self.args, self.pid, self.returncode)

    # trio.Process's private state, for code that reaches into it: trio's
    # own methods called unbound (trio.Process.kill(proc) reads _proc), and
    # proc._proc.wait() to block until the process is gone. _proc is a view
    # with the members of subprocess.Popen those calls use. _pidfd is None,
    # as trio's is once the process is reaped or where it has no pidfd: the
    # owned command's pidfd is not lent out (the teardown closes it).
    _pidfd: Final = None

    @property
    def _proc(self) -> _PopenView:
        return _PopenView(self)


@final
class _PopenView:
    """OwnedProcess._proc: the subprocess.Popen members that callers of
    trio.Process's private Popen use, over the owned command. wait() blocks
    the calling thread until the direct process has exited, as Popen's
    does, but never reaps it: the teardown does, at its end."""

    def __init__(self, proc: OwnedProcess) -> None:
        self._owner = proc

    @property
    def pid(self) -> int:
        return self._owner.pid

    @property
    def args(self) -> object:
        return self._owner.args

    @property
    def returncode(self) -> int | None:
        return self._owner.poll()

    def poll(self) -> int | None:
        return self._owner.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Block until the direct process has exited (at most `timeout`
        seconds: then subprocess.TimeoutExpired); its status."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while (code := self._owner.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                cmd: Any = self._owner.args
                raise subprocess.TimeoutExpired(cmd, timeout or 0.0)
            # In slices: the wait below takes a finite bound (a poll() in ms).
            self._owner.run._block_until_exited(min(left, 60.0))
        return code

    def send_signal(self, sig: int) -> None:
        self._owner.send_signal(sig)

    def terminate(self) -> None:
        self._owner.terminate()

    def kill(self) -> None:
        self._owner.kill()


# It has every public member of trio.Process, so code ported from
# trio.run_process that checks isinstance(proc, trio.Process) goes on
# working: trio.Process is an abstract base class (its metaclass is an
# ABCMeta that forbids subclassing), and registering ours with it changes
# nothing but that answer.
trio.Process.register(OwnedProcess)


class _ChunkReceiveStream(trio.abc.ReceiveStream):
    """A ReceiveStream over the command's single drain (lossless), with
    trio's stream semantics: closing it closes the pipe's read end (the
    command's next write sees a broken pipe, as with trio's own pipe), a
    receive after the close raises ClosedResourceError, and two tasks
    receiving at once raise BusyResourceError."""

    def __init__(self, run: OwnedCommand, name: Literal["stdout", "stderr"]) -> None:
        self._run = run
        self._name: Literal["stdout", "stderr"] = name
        self._chunks = run.stream(name, lossless=True)
        self._pending = b""
        self._closed = False
        self._busy = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        # trio's FdStream, word for word: its checks in its order, its
        # default size, its messages.
        if self._busy:
            msg = "another task is using this stream for receive"
            raise trio.BusyResourceError(msg)
        if max_bytes is None:
            max_bytes = _DEFAULT_RECEIVE_SIZE
        else:
            if not isinstance(max_bytes, int):
                msg = "max_bytes must be integer >= 1"
                raise TypeError(msg)
            if max_bytes < 1:
                msg = "max_bytes must be integer >= 1"
                raise ValueError(msg)
        self._busy = True
        try:
            if self._closed:
                raise trio.ClosedResourceError("file was already closed")
            if not self._pending:
                try:
                    self._pending = await self._chunks.__anext__()
                except StopAsyncIteration:
                    self._pending = b""
                if self._closed:  # closed by another task while we waited
                    raise trio.ClosedResourceError("another task closed this fd")
                if not self._pending:
                    return b""
            else:
                await trio.lowlevel.checkpoint()
        finally:
            self._busy = False
        if max_bytes >= len(self._pending):
            data, self._pending = self._pending, b""
        else:
            data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending = b""
            self._chunks.close()
            self._run.stop_reading(self._name)
        await trio.lowlevel.checkpoint()


def _trio_repr(args: object, pid: int, code: int | None) -> str:
    """trio.Process's repr of a process with `args`, `pid` and status `code`."""
    if code is None:
        status = f"running with PID {pid}"
    elif code < 0:
        status = f"exited with signal {-code}"
    else:
        status = f"exited with status {code}"
    return f"<trio.Process {args!r}: {status}>"


def _check_command(command: object, shell: bool) -> None:
    # trio's own messages, word for word.
    if isinstance(command, (str, bytes)) and not shell:
        msg = "command must be a sequence (not a string or bytes) if shell=False on UNIX systems"
        raise TypeError(msg)
    if not isinstance(command, (str, bytes)) and shell:
        msg = "command must be a string or bytes (not a sequence) if shell=True on UNIX systems"
        raise TypeError(msg)


def _check_text(options: dict[str, object]) -> None:
    # trio's own message, word for word.
    for key in _TEXT_OPTIONS:
        if options.get(key):
            msg = (
                "trio.Process only supports communicating over "
                f"unbuffered byte streams; the '{key}' option is not supported"
            )
            raise TypeError(msg)


def _check_stdio(value: object, data: bool = False) -> None:
    """What Popen accepts for stdin, stdout or stderr (None, PIPE, DEVNULL,
    STDOUT, an fd, an object with a fileno method; with `data`, stdin's
    bytes, trio's), with Popen's error otherwise: a path or a name is not a
    file here, as in trio (open_owned_command's own targets, such as
    "devnull" or a path, would quietly write a file)."""
    if value is None or isinstance(value, int):
        return
    if data and isinstance(value, (bytes, bytearray, memoryview)):
        return
    if not hasattr(value, "fileno"):
        msg = f"'{type(value).__name__}' object has no attribute 'fileno'"
        raise AttributeError(msg)


def _check_options(options: dict[str, object]) -> None:
    for key, why in _REFUSED.items():
        if key in options and not _is_default(key, options[key]):
            msg = f"trio_procown.run_process cannot honour {key}= while owning the command's tree: {why}"
            raise TypeError(msg)
    if "start_new_session" in options and not options["start_new_session"]:
        msg = (
            "trio_procown.run_process cannot honour start_new_session=False: the command always starts "
            "in a session of its own (that is how its tree is owned)"
        )
        raise ValueError(msg)
    if "close_fds" in options and not options["close_fds"]:
        msg = "trio_procown.run_process cannot honour close_fds=False: the command would hold our pipes open"
        raise ValueError(msg)
    known = {
        "cwd",
        "env",
        "stdout",
        "stderr",
        "shell",
        "start_new_session",
        "close_fds",
        "executable",
        *_OWNED,
    }
    unknown = set(options) - known - set(_REFUSED) - set(_TEXT_OPTIONS)
    if unknown:
        name = sorted(unknown)[0]
        msg = f"Popen.__init__() got an unexpected keyword argument {name!r}"  # trio's, from Popen
        raise TypeError(msg)


def _is_default(key: str, value: object) -> bool:
    default = _POPEN_DEFAULTS[key]
    if key == "process_group" and type(value) is int and value == 0:
        return True  # a new group led by the command: its own session gives it that
    return value is default or (type(value) is type(default) and value == default)


def _output_target(name: str, value: Any, capture: bool) -> Target:
    if capture:
        return CAPTURE  # (a stream given beside it was refused: see run_process)
    if value is _ABSENT or value is None:
        return INHERIT
    if value == subprocess.DEVNULL:
        return DEVNULL
    if value == subprocess.PIPE:
        return CAPTURE
    if value == subprocess.STDOUT:
        if name == "stdout":
            msg = "STDOUT can only be used for stderr"
            raise ValueError(msg)
        return STDOUT
    target: Target = value  # an fd or a file object: passed as is
    return target


_ABSENT: Any = object()


async def run_process(
    command: _Path | Sequence[_Path],
    *,
    stdin: bytes | bytearray | memoryview | int | HasFileno | None = b"",
    shell: bool = False,
    capture_stdout: bool = False,
    capture_stderr: bool = False,
    check: bool = True,
    deliver_cancel: Callable[[trio.Process], Awaitable[object]]
    | Callable[[OwnedProcess], Awaitable[object]]
    | None = None,
    task_status: trio.TaskStatus[OwnedProcess] = trio.TASK_STATUS_IGNORED,
    **popen_options: Unpack[RunProcessOptions],
) -> OwnedCompletedProcess:
    """`trio.run_process`, owned: same arguments, results and errors, and
    every process the command starts ends before this returns or raises.

    The CompletedProcess (and a CalledProcessError) carries the receipt as
    ``.receipt``. Under ``nursery.start`` it hands back an `OwnedProcess`.
    Besides trio's options it takes ``grace``, ``kill_wait``, ``drain_wait``,
    ``domain``, ``escapees``, ``max_output`` and ``first_signal`` (see
    `open_owned_command`); ``grace`` is 5 s by default, trio's own window
    between SIGTERM and SIGKILL, and captured output is not bounded unless
    ``max_output`` is given (as in trio; a ``subprocess.PIPE`` stream keeps
    its 64 MiB default). `deliver_cancel`, if given, is called on
    cancellation as in trio, bounded by ``grace + kill_wait``; the owned
    teardown runs after it. Under ``nursery.start`` with
    ``stdin=subprocess.PIPE``, ``proc.stdin`` is the caller's to close.

    Synopsis::

        done = await trio_procown.run_process(["sh", "-c", "echo hi"], capture_stdout=True)
        print(done.returncode, done.stdout, done.receipt.domain_empty)
    """
    options: dict[str, Any] = dict(popen_options)  # (checked below, as trio and Popen check them)
    if isinstance(stdin, str):
        msg = "process stdin must be bytes, not str"
        raise UnicodeError(msg)
    started_as_task = task_status is not trio.TASK_STATUS_IGNORED
    if not started_as_task:
        if stdin is subprocess.PIPE:
            msg = (
                "stdin=subprocess.PIPE is only valid with nursery.start, "
                "since that's the only way to access the pipe; use nursery.start "
                "or pass the data you want to write directly"
            )
            raise ValueError(msg)
        for name in ("stdout", "stderr"):
            if options.get(name) is subprocess.PIPE:
                msg = (
                    f"{name}=subprocess.PIPE is only valid with nursery.start, "
                    "since that's the only way to access the pipe"
                )
                raise ValueError(msg)
    # From here trio's order: the capture conflicts, then open_process's
    # checks (the text options, the command's form), then Popen's.
    for name, capture in (("stdout", capture_stdout), ("stderr", capture_stderr)):
        if capture and name in options:
            msg = f"can't specify both {name} and capture_{name}"
            raise ValueError(msg)
    _check_text(options)
    shell = bool(shell)
    _check_command(command, shell)
    _check_options(options)
    _check_stdio(stdin, data=True)
    _check_stdio(options.get("stdout"))
    _check_stdio(options.get("stderr"))
    if not shell and isinstance(command, Sequence) and not command:
        msg = f"{type(command).__name__} index out of range"  # Popen's, from its args[0]
        raise IndexError(msg)
    owned: dict[str, Any] = {key: options.pop(key) for key in _OWNED if key in options}
    for key in ("start_new_session", "close_fds", *_POPEN_DEFAULTS, *_TEXT_OPTIONS):
        options.pop(key, None)  # (checked above: each is at a value we honour)
    executable = options.pop("executable", None)
    piped = {name: options.get(name, _ABSENT) is subprocess.PIPE for name in ("stdout", "stderr")}
    if "max_output" not in owned and not any(piped.values()):
        # trio keeps every captured byte, and so does the drop-in unless
        # told otherwise. (A PIPE keeps the bound: it is what holds the
        # command back while the caller does not read.)
        owned["max_output"] = sys.maxsize
    stdout = _output_target("stdout", options.pop("stdout", _ABSENT), capture_stdout)
    stderr = _output_target("stderr", options.pop("stderr", _ABSENT), capture_stderr)

    # executable= runs in place of the program (shell=False: argv[0] is
    # then only its name) or of /bin/sh (shell=True), as in Popen.
    argv = os.fsdecode(command) if shell else normalize_command(command)  # type: ignore[arg-type]

    await trio.lowlevel.checkpoint_if_cancelled()  # as trio: a cancelled scope starts nothing
    stdin_write: int | None = None
    stdin_read: int | None = None
    source: Any
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        source = bytes(stdin)
    elif stdin is None:
        # The caller's stdin, as trio; if our fd 0 is closed (or is not a
        # stdin at all but a close-on-exec fd of ours, such as trio's epoll
        # in a daemon that closed 0), the command reads /dev/null instead.
        source = 0 if inheritable(0) else None
    elif stdin is subprocess.PIPE or stdin == subprocess.PIPE:
        stdin_read, stdin_write = os.pipe()
        os.set_inheritable(stdin_read, False)
        source = stdin_read
    elif stdin is subprocess.DEVNULL or stdin == subprocess.DEVNULL:
        source = None
    else:
        source = stdin

    grace = owned.pop("grace", TRIO_CANCEL_GRACE)
    kill_wait = owned.pop("kill_wait", DEFAULT_KILL_WAIT)
    first_signal = owned.get("first_signal", signal.SIGTERM)
    run: OwnedCommand | None = None
    try:
        async with open_owned_command(
            argv,
            stdin=source,
            stdout=stdout,
            stderr=stderr,
            grace=grace,
            kill_wait=kill_wait,
            drain_wait=owned.pop("drain_wait", DEFAULT_DRAIN_WAIT),
            executable=executable,
            **options,
            **owned,
        ) as run:
            if stdin_read is not None:
                os.close(stdin_read)  # the command holds its own copy
                stdin_read = None
            send = trio.lowlevel.FdStream(stdin_write) if stdin_write is not None else None
            stdin_write = None
            handle = OwnedProcess(
                run,
                command,
                send,
                _ChunkReceiveStream(run, "stdout") if piped["stdout"] else None,
                _ChunkReceiveStream(run, "stderr") if piped["stderr"] else None,
            )
            try:
                task_status.started(handle)
            except BaseException:
                if send is not None:  # never handed over: ours to close
                    with trio.CancelScope(shield=True):
                        await send.aclose()
                raise
            # From here proc.stdin is the caller's, as in trio: it is not
            # closed under them (a write after the command ended raises
            # BrokenResourceError, not ClosedResourceError); they close it,
            # or its fd is closed when the stream is collected.
            try:
                await run.wait()
            except BaseException:
                if deliver_cancel is not None and run.poll() is None:
                    # (a trio.Process callback gets our handle, a registered trio.Process)
                    await _deliver(
                        run,
                        handle,
                        cast(Callable[[OwnedProcess], Awaitable[object]], deliver_cancel),
                        grace + kill_wait,
                    )
                raise
    except OSError as exc:
        if run is not None or not exc.errno or exc.strerror == os.strerror(exc.errno):
            raise
        # The spawn refused it, nothing started: Popen's words (our reason, a note).
        plain = OSError(exc.errno, os.strerror(exc.errno), exc.filename)
        plain.add_note(f"trio_procown: {exc.strerror}")
        raise plain from None
    except BaseException:
        if run is not None and deliver_cancel is None:
            _warn_if_killed(run, command, grace, first_signal)
        raise
    finally:
        for fd in (stdin_read, stdin_write):
            if fd is not None:
                os.close(fd)
    receipt = run.receipt
    assert receipt is not None
    code = receipt.returncode
    out = run.stdout if capture_stdout else None
    err = run.stderr if capture_stderr else None
    if code is None and check:
        # It outlived its bounded teardown (a process we may not signal):
        # there is no status to report, and the receipt says why.
        msg = f"{command!r} did not exit within its teardown; see .receipt"
        error = subprocess.SubprocessError(msg)
        error.receipt = receipt  # type: ignore[attr-defined]
        raise error
    if code and check:
        error = OwnedCalledProcessError(code, command, output=out, stderr=err)
        error.receipt = receipt
        raise error
    # (code is None for a command that outlived its teardown, without check: no status)
    done = OwnedCompletedProcess(command, code, out, err)  # type: ignore[arg-type]
    done.receipt = receipt
    return done


def _warn_if_killed(run: OwnedCommand, command: object, grace: float, first_signal: int) -> None:
    """trio's warning when its default cancel had to kill the process: it
    outlived the first signal for the whole grace and died of SIGKILL."""
    receipt = run.receipt
    if receipt is None or receipt.cause != "cancelled" or receipt.returncode != -signal.SIGKILL:
        return
    if not receipt.forced:
        return  # it was killed, but not by the teardown's second stage
    first = signame(first_signal) if first_signal else "its first signal"
    warnings.warn(
        RuntimeWarning(
            f"process {_trio_repr(command, run.pid, None)} ignored {first} for {grace:g} seconds. "
            "(Maybe you should pass a custom deliver_cancel?) Trying SIGKILL."
        ),
        stacklevel=3,
    )


async def _deliver(
    run: OwnedCommand,
    handle: OwnedProcess,
    deliver_cancel: Callable[[OwnedProcess], Awaitable[object]],
    bound: float,
) -> None:
    """Call the caller's deliver_cancel, shielded, until the direct process
    exits or `bound` passes; the owned teardown follows either way."""
    run.begin_stop("cancelled", f"deliver_cancel ({getattr(deliver_cancel, '__name__', 'custom')}) called")
    with _clock.after(bound, shield=True):
        async with trio.open_nursery() as nursery:

            async def deliver() -> None:
                await deliver_cancel(handle)

            nursery.start_soon(deliver)
            await handle.wait()
            nursery.cancel_scope.cancel()
