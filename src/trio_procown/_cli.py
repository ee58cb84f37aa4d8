# The `procown` command line: `run`, `doctor` and `demo`.
#
# `procown run [options] -- COMMAND [ARG...]` is GNU `timeout` built on an
# owned command. One trio.run holds, in one nursery:
#
#   - a signal watcher (trio.open_signal_receiver for SIGINT, SIGTERM and
#     SIGHUP). The first signal is remembered and cancels the *current
#     stage*; later signals cancel it again, which changes nothing while the
#     library's shielded teardown runs, so a second Ctrl-C neither skips the
#     teardown's bounds nor makes the teardown longer.
#   - two pumps, one per stream, that follow `run.stream("stdout")` and
#     `run.stream("stderr")` (the library's single drain; we never touch the
#     pipes) and write each chunk to our own fd 1 / fd 2 as it arrives, so
#     output streams through live and the two streams stay apart. Writes run
#     in a worker thread (abandonable on cancel) so that a reader of ours that
#     stops reading can never freeze the event loop, and with it the timeout
#     or the signal handling. They use os.write on the fd (unbuffered, the
#     same effect as buffer.write + flush) so that an abandoned write holds
#     no Python-level lock at interpreter shutdown.
#
# Stages: (1) the owned block, inside a cancel scope the watcher cancels:
# the command runs until it exits, its --timeout fires, or a signal cancels
# the scope (the library tears down, then Cancelled is caught here). The
# pumps live *outside* that scope, so what the command prints while it is
# torn down still gets through. (2) forwarding what is left in memory: a
# signal arriving during this stage abandons it. Then the receipt is written
# and the exit status is computed from the receipt and the remembered
# signal, following GNU timeout's conventions (see EPILOG). A broken pipe on
# our stdout/stderr (our reader went away, as in `procown run -- yes | head
# -1`) stops that pump at once and closes our read end of the command's
# pipe, so the command sees the broken pipe on its next write as it would
# without procown (usually dying of SIGPIPE); procown exits 128+13 once the
# command has ended.
#
# The pumps follow the drain *losslessly*: when our reader is slower than the
# command, the drain holds back and the command's writes block, as they
# would under GNU timeout; no byte is skipped. As a safety net each pump
# counts what it passed on; if that is ever less than the receipt says was
# read (a drain abandoned at teardown, say), procown says how many bytes
# were not passed on and exits 125 rather than pass a gap for success.
# procown's stdin (fd 0) is inherited by the command as is, as under GNU
# timeout: the same open file description, so a file offset is shared (in
# `{ head -c 3 >/dev/null; procown run -- cat; } < f` cat reads on from byte
# 3), with no copy and no drain. Reopening it by path (/dev/stdin) would
# start a regular file over at byte 0. A closed fd 0 gives the command
# /dev/null; that is decided before procown opens anything that could take
# fd 0.
#
# Argument errors print one line (`procown: error: ...`) and exit 125.
#
# `procown timeout` (GNU timeout's syntax) lives in _timeout.py; `procown
# demo` in _demo.py.

from __future__ import annotations

import argparse
import errno
import io
import math
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from typing import IO, Any, Literal, NoReturn, TextIO, TypeVar

import trio

from . import __version__
from ._budgets import DEFAULT_GRACE, DEFAULT_KILL_WAIT
from ._cgroup import COST_IDLE, COST_SAMPLES, placement_method, spawn_cost_note, spawn_costs
from ._choice import auto_choice, available_domains
from ._command import OwnedCommand, open_owned_command
from ._drain import DEFAULT_MAX_OUTPUT, ChunkStream
from ._errors import CliError, DomainUnavailable
from ._receipt import Receipt
from ._spawn import command_failure, inherited_fds

EXIT_TIMEOUT = 124  # the --timeout expired
EXIT_PROCOWN = 125  # procown itself failed
EXIT_CANNOT_RUN = 126  # the command was found but cannot be run
EXIT_NOT_FOUND = 127  # the command was not found
SIGNAL_BASE = 128  # 128+N: killed by / ended by signal N

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

EXAMPLES = """\
examples:
  procown run --timeout 600 -- make test
  procown run --timeout 5 --receipt - -- sh -c 'server & client'
  procown run --receipt receipt.json --domain process-group -- ./build.sh

"""

EPILOG = """\
exit status (GNU timeout's conventions):
  N      the command's own status when it exits by itself
  128+N  the command died of signal N by itself (not by procown's teardown)
  124    the --timeout expired; the command was torn down
  125    procown itself failed (bad option, domain unavailable, bad --cwd, ...,
         or output not passed on because a drain was abandoned at teardown)
  126    the command was found but cannot be run (no permission)
  127    the command was not found
  128+N  procown received signal N (SIGHUP 129, SIGINT 130, SIGTERM 143),
         tore the command down, then exited (141 when its output pipe broke)
  Telling the two 128+N apart: only 129, 130, 141 and 143 can be procown's
  own; for those, the receipt (--receipt) tells: cause=cancelled means
  procown received the signal, otherwise the command died of signal N.
"""

RUN_DESCRIPTION = """\
Run COMMAND so that procown owns every process it starts. When the command
exits, when --timeout expires, or when procown receives SIGINT, SIGTERM or
SIGHUP, whatever is left of it is torn down (SIGTERM, --grace seconds,
SIGKILL, --kill-wait seconds) before procown exits. The command's stdout and
stderr stream through live, kept apart; procown's stdin is passed to it.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit with status 125."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_PROCOWN, f"procown: error: {message} (see '{self.prog} --help')\n")


# A duration's optional unit, as GNU timeout (and `procown timeout`) take it.
DURATION_UNITS = {"s": 1, "m": 60, "h": 60 * 60, "d": 60 * 60 * 24}


def _seconds(text: str) -> float:
    scale = DURATION_UNITS.get(text[-1:], 0)
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        msg = f"not a number of seconds (like 30, 2.5, 90s, 10m, 1h, 1d): {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if math.isnan(value) or value < 0 or math.isinf(value):
        msg = f"must be a finite, non-negative number of seconds: {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    if not digits.isdigit() or int(digits) == 0:
        msg = f"not a size in bytes (like 1048576, 512K, 64M, 1G): {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return int(digits) * scale


def build_parser() -> argparse.ArgumentParser:
    """The `procown` argument parser."""
    parser = _Parser(
        prog="procown",
        description="Run commands that own everything they start: bounded teardown, receipts.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"procown {__version__}")
    sub = parser.add_subparsers(
        title="subcommands", dest="subcommand", metavar="{run,timeout,doctor,demo}", required=True
    )

    run = sub.add_parser(
        "run",
        help="run a command, owned, with a timeout and a receipt",
        usage="procown run [options] -- COMMAND [ARG...]",
        description=RUN_DESCRIPTION,
        epilog=EXAMPLES + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help="tear the command down after S seconds (exit status 124); S may end in s, m, h or d "
        "(seconds, minutes, hours, days), as for GNU timeout; default: no timeout",
    )
    run.add_argument(
        "--grace",
        type=_seconds,
        default=DEFAULT_GRACE,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL in the teardown (default: %(default)s)",
    )
    run.add_argument(
        "--kill-wait",
        type=_seconds,
        default=DEFAULT_KILL_WAIT,
        metavar="S",
        help="seconds to wait for the domain to empty after SIGKILL (default: %(default)s)",
    )
    run.add_argument(
        "--domain",
        choices=("auto", "cgroup", "process-group", "slurm"),
        default="auto",
        help="what holds the command's processes; see `procown doctor` (default: %(default)s)",
    )
    run.add_argument(
        "--escapees",
        choices=("terminate", "report"),
        default="terminate",
        help="what to do with processes found outside the domain at teardown (default: %(default)s)",
    )
    run.add_argument("--cwd", metavar="DIR", help="run the command in DIR")
    run.add_argument(
        "--max-output",
        type=_size,
        default=DEFAULT_MAX_OUTPUT,
        metavar="BYTES",
        help=(
            "memory bound per output stream for the receipt's record (suffixes K, M, G); output "
            "is forwarded losslessly whatever the bound: a slow reader of procown holds the "
            "command back (default: 64M)"
        ),
    )
    run.add_argument(
        "--receipt",
        metavar="FILE",
        help="write the receipt to FILE as JSON; '-' prints a short summary on stderr at the end",
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="with --receipt -, print the receipt on stderr as JSON (alone, implies --receipt -)",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    run.set_defaults(run_parser=run)

    # Listed for --help only: main() hands `procown timeout ...` to _timeout
    # before argparse sees it (GNU's getopt syntax, not argparse's).
    sub.add_parser(
        "timeout",
        help="GNU timeout(1), owned: procown timeout [OPTION] DURATION COMMAND [ARG]...",
        add_help=False,
    )

    doctor_parser = sub.add_parser(
        "doctor",
        help="show which ownership domains this machine offers and which one auto picks",
        description=(
            "Show which ownership domains this machine offers, which one `auto` picks, and why; "
            "which one gives the kernel's evidence of escapes; and stale domains: procown-* cgroups "
            "whose owner is gone (under TRIO_PROCOWN_CGROUP_ROOT if set, else the whole cgroup v2 tree)."
        ),
    )
    doctor_parser.add_argument(
        "--clean",
        action="store_true",
        help="end the processes of stale domains (SIGTERM, grace, SIGKILL) and remove their cgroups",
    )
    sub.add_parser(
        "demo",
        help="a short built-in demonstration (about 4 seconds)",
        description=(
            "Run four small owned commands and print their receipts: a natural exit, a timeout "
            "that also ends a forked grandchild, a command that ignores SIGTERM (forced), and an "
            "outer cancellation that keeps the output printed before it. Exits 0 when every "
            "receipt says what it should."
        ),
    )
    return parser


class RunOptions:
    """What `procown run` was asked to do. (A plain class: a dataclass, or
    a NamedTuple, costs a fraction of a millisecond more at every start.)"""

    __slots__ = (
        "command",
        "cwd",
        "domain",
        "escapees",
        "grace",
        "json",
        "kill_wait",
        "max_output",
        "receipt",
        "timeout",
    )

    def __init__(
        self,
        command: list[str],
        timeout: float | None = None,
        grace: float = DEFAULT_GRACE,
        kill_wait: float = DEFAULT_KILL_WAIT,
        domain: Literal["auto", "cgroup", "process-group", "slurm"] = "auto",
        escapees: Literal["terminate", "report"] = "terminate",
        cwd: str | None = None,
        receipt: str | None = None,
        json: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> None:
        self.command = command
        self.timeout = timeout
        self.grace = grace
        self.kill_wait = kill_wait
        self.domain: Literal["auto", "cgroup", "process-group", "slurm"] = domain
        self.escapees: Literal["terminate", "report"] = escapees
        self.cwd = cwd
        self.receipt = receipt
        self.json = json
        self.max_output = max_output


def entry() -> None:
    """The `procown` console script: main(), then a prompt exit (_exit.py)."""
    from ._exit import run_and_exit

    run_and_exit(main)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `procown` console script; returns the exit status.

    `procown timeout ...` may instead end the process by a signal, as GNU
    timeout does (see _timeout.main)."""
    from ._entry import release

    early = release()  # signals that came before procown could relay them
    args_given = sys.argv[1:] if argv is None else list(argv)
    if args_given[:1] == ["timeout"]:
        from ._timeout import main as timeout_main

        return timeout_main(args_given[1:], prog="procown timeout", early=early)
    for signum in early:  # nothing was started: as if the signal came now
        if signum in STOP_SIGNALS:
            return SIGNAL_BASE + signum
        signal.raise_signal(signum)  # (its own disposition again: default, ignored)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_PROCOWN
    try:
        if args.subcommand == "doctor":
            return doctor(clean=args.clean)
        if args.subcommand == "demo":
            from ._demo import run_demo  # here: _demo builds on this module

            return run_demo()
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            args.run_parser.error("a COMMAND is needed: procown run [options] -- COMMAND [ARG...]")
        options = RunOptions(
            command=command,
            timeout=args.timeout,
            grace=args.grace,
            kill_wait=args.kill_wait,
            domain=args.domain,
            escapees=args.escapees,
            cwd=args.cwd,
            receipt=args.receipt,
            json=args.json,
            max_output=args.max_output,
        )
        return run_command(options)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_PROCOWN
    except KeyboardInterrupt:
        # SIGINT outside the window where procown handles it itself.
        return SIGNAL_BASE + signal.SIGINT
    except CliError as exc:
        _say(f"procown: error: {exc}")
        return EXIT_PROCOWN
    except Exception as exc:
        traceback.print_exc()
        _say(f"procown: internal error: {exc!r}")
        return EXIT_PROCOWN


def _say(text: str) -> None:
    """One line on stderr; a broken stderr is ignored."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


# -- procown run ---------------------------------------------------------------


def run_command(options: RunOptions) -> int:
    """`procown run`: run the command owned; return the exit status."""
    stdin = _stdin()  # first: anything opened while fd 0 is closed would become fd 0
    if options.cwd is not None and not os.path.isdir(options.cwd):
        msg = f"--cwd {options.cwd!r} is not a directory"
        raise CliError(msg)
    return with_receipt(options.receipt, options.json, lambda: trio.run(_run, options, stdin))


_T = TypeVar("_T")


def with_receipt(receipt_to: str | None, as_json: bool, body: Callable[[], tuple[_T, Receipt | None]]) -> _T:
    """Open --receipt FILE (or stdout for --json) before `body` runs anything,
    run it, then write the receipt it returned; return its result."""
    if receipt_to is None and as_json:
        receipt_to = "-"
    receipt_file = open_receipt(receipt_to)
    try:
        result, receipt = body()
    except BaseException:
        if receipt_file is not None:
            receipt_file.close()
        raise
    finish_receipt(receipt_to, receipt_file, receipt, as_json)
    return result


def open_receipt(receipt_to: str | None) -> IO[str] | None:
    """Open --receipt FILE before anything runs (CliError if it cannot be
    written); None for no receipt or '-'."""
    if receipt_to is None or receipt_to == "-":
        return None
    try:
        return open(receipt_to, "w", encoding="utf-8")  # closed by finish_receipt
    except OSError as exc:
        msg = f"cannot write the receipt to {receipt_to!r}: {exc.strerror or exc}"
        raise CliError(msg) from None


def finish_receipt(
    receipt_to: str | None, receipt_file: IO[str] | None, receipt: Receipt | None, as_json: bool
) -> None:
    """Write the receipt to its file (removed if nothing ran) or, for '-',
    its summary (or JSON) on stderr."""
    if receipt_file is None and (receipt_to != "-" or receipt is None):
        return  # no receipt asked for: json is never imported (start-up cost)
    import json

    if receipt_file is not None:
        with receipt_file:
            if receipt is not None:
                json.dump(receipt.to_dict(), receipt_file, indent=2)
                receipt_file.write("\n")
        if receipt is None:  # nothing ran: leave no empty, non-JSON receipt
            os.unlink(receipt_file.name)
    elif receipt_to == "-" and receipt is not None:
        _say(json.dumps(receipt.to_dict(), indent=2) if as_json else receipt.summary())


def cannot_run_status(code: int) -> int:
    """The exit status for a command that cannot be run with errno `code`
    (_spawn.command_failure): 127 not found, 126 anything else."""
    return EXIT_NOT_FOUND if code == errno.ENOENT else EXIT_CANNOT_RUN


class Stopper:
    """Remembers the first stop signal and cancels the current stage."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.scope: trio.CancelScope | None = None

    def stop(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
        if self.scope is not None:
            self.scope.cancel()

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            self.stop(signum)


class _Sink:
    """One of procown's own output streams, written with blocking writes
    (called in a worker thread)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.forwarded = 0  # bytes of the command's stream passed on
        self.broken = False  # our reader went away (EPIPE)
        self.fd: int | None = None
        if stream is None:
            return
        try:
            stream.flush()
            self.fd = stream.fileno()
        except (OSError, ValueError, io.UnsupportedOperation):
            self.fd = None

    def write(self, data: bytes) -> None:
        if self.fd is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
            return
        if self.stream is None:
            return
        buffer: Any = getattr(self.stream, "buffer", None)
        if buffer is not None:
            buffer.write(data)
            buffer.flush()
        else:
            self.stream.write(data.decode(errors="replace"))
            self.stream.flush()


async def _pump(
    run: OwnedCommand, name: Literal["stdout", "stderr"], chunks: ChunkStream, sink: _Sink
) -> None:
    """Forward one stream of the command, chunk by chunk, as it arrives."""
    try:
        async for chunk in chunks:
            await trio.to_thread.run_sync(sink.write, chunk, abandon_on_cancel=True)
            sink.forwarded += len(chunk)
    except BrokenPipeError:
        # Our reader went away (`procown run -- yes | head -1`): stop at once,
        # and let the command see the broken pipe as it would without us.
        sink.broken = True
        chunks.close()  # no longer holds the drain back
        run.stop_reading(name)


async def _run(options: RunOptions, stdin: int | None) -> tuple[int, Receipt | None]:
    stopper = Stopper()
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stopper.watch, signals)
            try:
                return await _run_and_forward(options, stopper, stdin)
            finally:
                nursery.cancel_scope.cancel()


async def _run_and_forward(
    options: RunOptions, stopper: Stopper, stdin: int | None
) -> tuple[int, Receipt | None]:
    """Run the command owned, forward its output as it arrives, and return
    the exit status and the receipt (None when nothing could be started)."""
    run: OwnedCommand | None = None
    sinks = {"stdout": _Sink(sys.stdout), "stderr": _Sink(sys.stderr)}
    forwarding = trio.CancelScope()
    owned = trio.CancelScope()
    command = list(options.command)
    with forwarding:
        async with trio.open_nursery() as pumps:
            stopper.scope = owned
            with owned:
                while True:
                    try:
                        async with open_owned_command(
                            command,
                            timeout=options.timeout,
                            grace=options.grace,
                            kill_wait=options.kill_wait,
                            stdin=stdin,
                            cwd=options.cwd,
                            domain=options.domain,
                            escapees=options.escapees,
                            max_output=options.max_output,
                            # Our inheritable fds above 2 go on, as a shell's would
                            # (a jobserver's pipe); a Slurm job runs elsewhere.
                            pass_fds=() if options.domain == "slurm" else inherited_fds(),
                        ) as run:
                            for name in ("stdout", "stderr"):
                                chunks = run.stream(name, lossless=True)
                                pumps.start_soon(_pump, run, name, chunks, sinks[name])
                            await run.wait()
                    except DomainUnavailable as exc:
                        _say(f"procown: error: {exc}")
                        return EXIT_PROCOWN, None
                    except OSError as exc:
                        if run is not None:
                            raise
                        if exc.errno == errno.ENOEXEC and command == list(options.command):  # once
                            command = shell_script_argv(options.command)
                            continue
                        code = command_failure(exc, command)
                        if code is not None:
                            _say(f"procown: cannot run {options.command[0]!r}: {_reason(exc)}")
                            return cannot_run_status(code), None
                        _say(f"procown: error: cannot start {options.command[0]!r}: {_reason(exc)}")
                        return EXIT_PROCOWN, None
                    break
            # The owned block is over (torn down); what is left to forward is
            # in memory. A signal from now on abandons the forwarding.
            stopper.scope = forwarding
    stopper.scope = None
    assert run is not None
    receipt = run.receipt
    assert receipt is not None
    # A signal that cancelled the command, or that cut the forwarding short,
    # ended procown: 128+N. One that arrived while a teardown for another
    # cause (the timeout, leftovers of an exit) was running changed nothing.
    if receipt.cause == "cancelled" or forwarding.cancel_called:
        signum = stopper.signum
        return (SIGNAL_BASE + signum if signum is not None else EXIT_PROCOWN), receipt
    # Our own output pipe broke: we stopped reading that stream, the command
    # saw the broken pipe, and procown ends as a writer to a broken pipe
    # does in a shell pipeline, whatever the command did about it.
    if receipt.cause == "exited" and any(sink.broken for sink in sinks.values()):
        return SIGNAL_BASE + signal.SIGPIPE, receipt
    status = exit_status(receipt)
    # The pumps are lossless, so a gap means bytes the drain read but never
    # handed on (it was abandoned at teardown). Never let that pass for
    # success. (A stream whose reader went away was left unread on purpose.)
    for record in receipt.streams:
        sink = sinks.get(record.name)
        if sink is not None and not sink.broken and sink.forwarded < record.captured:
            _say(
                f"procown: error: {record.captured - sink.forwarded} byte(s) of the command's "
                f"{record.name} were not passed on (the drain was abandoned at teardown); "
                f"the command's own exit status was {status}"
            )
            status = EXIT_PROCOWN
    return status, receipt


def _stdin() -> int | None:
    """procown's stdin for the command to inherit as is (fd 0, its offset
    shared), or None (``/dev/null``) when fd 0 is closed."""
    try:
        os.fstat(0)
    except OSError:
        return None
    return 0


def shell_script_argv(command: Sequence[str]) -> list[str]:
    """What execvp runs for a file in no format the kernel runs (ENOEXEC):
    a shell script, as `/bin/sh FILE ARGS...` (glibc's fallback, which
    GNU timeout, env and nohup inherit), FILE found on PATH as execvp
    found it."""
    import shutil  # (only here: start-up cost)

    name = command[0]
    path = name if "/" in name else (shutil.which(name) or name)
    return ["/bin/sh", path, *command[1:]]


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def exit_status(receipt: Receipt) -> int:
    """The exit status for a receipt, when no signal ended procown."""
    if receipt.cause == "timed_out":
        return EXIT_TIMEOUT
    if receipt.cause == "exited" and receipt.returncode is not None:
        code = receipt.returncode
        return code if code >= 0 else SIGNAL_BASE - code
    return EXIT_PROCOWN


# -- procown doctor ------------------------------------------------------------


def doctor(*, clean: bool = False) -> int:
    """`procown doctor`: which domains this machine offers and what auto picks,
    which gives kernel evidence of escapes, and stale domains (removed with
    `clean`)."""
    options = available_domains()
    lines = ["ownership domains, strongest first:"]
    width = max(len(o.name) for o in options)
    for option in options:
        state = "available  " if option.available else "unavailable"
        lines.append(f"  {option.name:<{width}}  {state}  {option.reason}")
    status = 0
    try:
        choice = auto_choice()
    except DomainUnavailable as exc:
        lines.append(f"auto picks: nothing ({exc})")
        status = 1
    else:
        skipped = [o for o in options[: options.index(choice)] if not o.available]
        why = "; ".join(f"{o.name} is unavailable: {o.reason}" for o in skipped)
        if skipped:
            lines.append(f"auto picks: {choice.name}, because {why}")
        else:
            lines.append(f"auto picks: {choice.name}, the strongest domain available here ({choice.reason})")
    kernel = any(o.name == "cgroup" and o.available for o in options)
    cgroup_evidence = "cgroup: the kernel's (no process leaves its cgroup without privilege)"
    census_evidence = "the census's (a descendant that calls setsid() and clears its environment is not seen)"
    evidence = cgroup_evidence if kernel else "no domain here has the kernel's"
    lines.append(f"escape evidence: {evidence}; process-group: {census_evidence}")
    if kernel:
        lines.append(f"cgroup placement: {placement_method()}")
        costs = spawn_costs()
        if costs is not None:
            ms = {name: f"{taken * 1e3:.2f} ms" for name, taken in costs.items()}
            lines.append(
                f"cgroup spawn cost (measured now: /bin/true, median of {COST_SAMPLES}): "
                f"{ms['into a cgroup']} back to back, {ms['into a cgroup after idle']} after "
                f"{COST_IDLE * 1e3:g} ms idle "
                f"({ms['own cgroup after idle']} in our own cgroup after the same idle)"
            )
    lines.append(_slurm_line())
    stale_lines, cleaned = _stale_domains(clean)
    lines.extend(stale_lines)
    if not cleaned:
        status = 1
    note = spawn_cost_note() if any(o.name == "cgroup" and o.available for o in options) else None
    if note:
        lines.append(f"note: {note}")
    print("\n".join(lines), flush=True)
    return status


def _slurm_line() -> str:
    """doctor's line on the Slurm domain (never picked by auto)."""
    from ._slurm import cluster_status

    usable, what = cluster_status()
    state = "reachable" if usable else "not usable"
    return f"slurm (--domain slurm, never picked by auto): {state}: {what}"


def _stale_domains(clean: bool) -> tuple[list[str], bool]:
    """doctor's lines on stale domains, and False if some could not be removed."""
    from . import _cgroup, _stale

    top = os.environ.get(_cgroup.ROOT_ENV) or _cgroup.cgroup2_mount()
    if top is None:
        return ["stale domains: none (no cgroup v2 hierarchy)"], True
    found = _stale.find(top)
    if not found:
        return [f"stale domains: none under {top}"], True
    if not clean:
        head = f"stale domains: {len(found)} under {top} (their owner is gone); `procown doctor --clean` "
        return [head + "ends and removes them:", *(f"  {s.describe()}" for s in found)], True
    outcomes = _stale.clean(found, DEFAULT_GRACE, DEFAULT_KILL_WAIT)
    lines = [f"stale domains: {len(found)} under {top} (their owner is gone); ending and removing them:"]
    lines += [f"  {s.path}: {outcome}" for s, outcome in zip(found, outcomes, strict=True)]
    return lines, all(outcome == "removed" for outcome in outcomes)
