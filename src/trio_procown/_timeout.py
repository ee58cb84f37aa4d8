# `procown timeout` (also the `procown-timeout` console script): GNU
# coreutils timeout(1), with the command owned.
#
#     procown timeout [OPTION] DURATION COMMAND [ARG]...
#
# The front end follows GNU timeout 9.x where it documents behaviour: the
# same options, parsed the same way (getopt: options first, the first
# operand ends them; unambiguous long-option prefixes), the same DURATION
# syntax (a C floating-point number with an optional s/m/h/d suffix; 0
# disables), the same SIGNAL syntax (a name with or without SIG, any case,
# RTMIN+n/RTMAX-n, or a number, where a shell status 128+N means N), the
# same exit statuses, and the same corner cases: `-s0 -k D` sends nothing and
# then KILL (137); a signal that reaches procown itself (INT, QUIT, HUP, TERM,
# or the -s signal) is relayed to the command; when the command dies of
# signal N by itself (not timed out) procown dies of signal N too, core dumps
# disabled, so that the caller sees what it would without procown; when the
# KILL stage was needed procown dies of SIGKILL (137), or exits 137 with
# --foreground, as GNU does. -v prints GNU's line, with procown's name.
#
# What is not GNU's, and why:
#   - the command runs in an owned domain (a cgroup where available), so the
#     signal reaches every process it started, setsid() escapees included,
#     not only its process group;
#   - every wait is bounded. GNU without -k sends one signal and waits for
#     the command for ever; here the graceful stage lasts -k DURATION, or the
#     library's default grace (DEFAULT_GRACE, 2 s) without -k, and then the
#     domain gets SIGKILL (status 137). With -k the bound is the one asked for;
#   - a relayed signal starts the same bounded teardown (that signal first);
#   - --foreground is accepted, but the command still runs in its own
#     session: its whole domain is signalled (SIGCONT follows, as always), and
#     it has no controlling terminal (it can read a terminal on its stdin,
#     but not open /dev/tty). Only the exit on KILL differs (137, not death);
#   - --receipt FILE|- and --json, as for `procown run`.
#
# The command inherits procown's stdin, stdout and stderr as is (as under
# GNU timeout: a terminal stays a terminal, and a closed reader gives it
# EPIPE/SIGPIPE directly); the receipt says they were not captured.

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import errno
import getopt
import os
import re
import signal
import sys
import unicodedata
from collections.abc import AsyncIterator, Mapping, Sequence

import trio

from . import __version__
from ._budgets import DEFAULT_GRACE, DEFAULT_KILL_WAIT
from ._cli import (
    DURATION_UNITS,
    EXIT_PROCOWN,
    EXIT_TIMEOUT,
    SIGNAL_BASE,
    cannot_run_status,
    shell_script_argv,
)
from ._command import DEVNULL, INHERIT, OwnedCommand, open_owned_command
from ._domain import BY_THE_CALLER
from ._errors import DomainUnavailable
from ._receipt import Action, Receipt
from ._spawn import command_failure, exec_path, inherited_fds, resolve_argv

NAME = "procown"  # in place of GNU's "timeout" at the start of each diagnostic
EXIT_KILLED = SIGNAL_BASE + signal.SIGKILL  # 137
MAX_SECONDS = 1e10  # larger durations (inf included) are capped: still a bound

HELP = """\
Usage: {prog} [OPTION] DURATION COMMAND [ARG]...
  or:  {prog} [OPTION]
Start COMMAND, and kill it if still running after DURATION: GNU timeout(1),
with every process COMMAND starts owned and the teardown bounded.

Mandatory arguments to long options are mandatory for short options too.
      --preserve-status
                 exit with the same status as COMMAND, even when the
                   command times out
      --foreground
                 accepted for GNU compatibility: COMMAND still runs in its
                   own session and its whole domain is timed out (only the
                   exit on KILL differs: status 137 rather than death)
  -k, --kill-after=DURATION
                 send a KILL signal if COMMAND (or anything it started) is
                   still running this long after the initial signal was sent;
                   without it, after {grace:g} seconds (every wait is bounded)
  -s, --signal=SIGNAL
                 specify the signal to be sent on timeout;
                   SIGNAL may be a name like 'HUP' or a number;
                   see 'kill -l' for a list of signals
  -v, --verbose  diagnose to stderr any signal sent upon timeout
      --receipt=FILE
                 write the receipt to FILE as JSON; '-' prints a short
                   summary on stderr at the end
      --json     with --receipt -, print the receipt on stderr as JSON
      --help     display this help and exit
      --version  output version information and exit

DURATION is a floating point number with an optional suffix:
's' for seconds (the default), 'm' for minutes, 'h' for hours or 'd' for days.
A duration of 0 disables the associated timeout.

Upon timeout, send the TERM signal to COMMAND, if no other SIGNAL specified,
and to every process it started (its ownership domain), then SIGCONT.
A signal received by {name} itself (INT, QUIT, HUP, TERM) is sent on the same way.

Exit status:
  124  if COMMAND times out, and --preserve-status is not specified
  125  if {name} itself fails
  126  if COMMAND is found but cannot be invoked
  127  if COMMAND cannot be found
  137  if the KILL (9) signal was needed, or was the signal sent (128+9)
  -    the exit status of COMMAND otherwise (when COMMAND dies of signal N,
       {name} dies of signal N too)
"""


class UsageError(Exception):
    """A bad invocation: GNU's message (or none), then the "Try" line; 125."""


@dataclasses.dataclass(frozen=True)
class TimeoutOptions:
    """What `procown timeout` was asked to do."""

    command: list[str]
    duration: float | None = None  # None: no timeout (DURATION 0)
    signal: int = signal.SIGTERM  # 0: send nothing (then only -k's KILL)
    kill_after: float | None = None  # None: not given, or 0
    preserve_status: bool = False
    foreground: bool = False
    verbose: bool = False
    receipt: str | None = None
    json: bool = False

    @property
    def grace(self) -> float:
        """The graceful stage's bound: -k, else the library's default."""
        return self.kill_after if self.kill_after is not None else DEFAULT_GRACE


@dataclasses.dataclass(frozen=True)
class Ending:
    """How procown ends: an exit status, or death by a signal (as GNU's
    timeout raises the signal its command died of)."""

    status: int
    die_by: int | None = None


# -- DURATION ------------------------------------------------------------------

# What C's strtod() accepts at the start of a string: leading white space,
# a sign, then a hexadecimal or decimal number, INF/INFINITY or NAN(...).
_STRTOD = re.compile(
    r"""[ \t\n\v\f\r]*[+-]?(?:
        (?P<hex>0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?)
      | (?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?
      | (?i:inf(?:inity)?)
      | (?P<nan>(?i:nan)(?:\([0-9A-Za-z_]*\))?)
    )""",
    re.VERBOSE,
)
_UNITS = {"": 1, **DURATION_UNITS}


def parse_duration(text: str) -> float:
    """GNU timeout's DURATION in seconds; ValueError when it is not one."""
    match = _STRTOD.match(text)
    if match is None or match.group("nan"):
        raise ValueError(text)
    number = match.group(0)
    if match.group("hex"):
        sign = -1.0 if number.lstrip().startswith("-") else 1.0
        value = sign * float.fromhex(match.group("hex"))
    else:
        value = float(number)
    suffix = text[match.end() :]
    if suffix not in _UNITS or not value >= 0:
        raise ValueError(text)
    return value * _UNITS[suffix]


# -- SIGNAL --------------------------------------------------------------------

# gnulib's sig2str table order: where two names share a number (ABRT/IOT,
# CHLD/CLD, POLL/IO), the first one is the name printed.
# fmt: off
_TABLE_ORDER = [
    "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "FPE", "KILL", "SEGV", "PIPE", "ALRM", "TERM",
    "USR1", "USR2", "CHLD", "URG", "STOP", "TSTP", "CONT", "TTIN", "TTOU", "BUS", "POLL", "PROF",
    "SYS", "VTALRM", "XCPU", "XFSZ", "IOT", "EMT", "PHONE", "WIND", "CLD", "PWR", "CANCEL", "LWP",
    "WAITING", "FREEZE", "THAW", "LOST", "WINCH", "INFO", "IO", "STKFLT",
]
# fmt: on
_BY_NAME: dict[str, int] = {"EXIT": 0}
_BY_NUMBER: dict[int, str] = {0: "EXIT"}
for _name in _TABLE_ORDER:
    _number = getattr(signal, "SIG" + _name, None)
    if isinstance(_number, int):
        _BY_NAME[_name] = _number
        _BY_NUMBER.setdefault(_number, _name)
_RTMIN: int | None = getattr(signal, "SIGRTMIN", None)
_RTMAX: int | None = getattr(signal, "SIGRTMAX", None)
_STRTOL = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")


def signal_name(signum: int) -> str:
    """GNU's sig2str: "TERM", "EXIT" for 0, "RTMIN+1", or the number."""
    name = _BY_NUMBER.get(signum)
    if name is not None:
        return name
    if _RTMIN is not None and _RTMAX is not None and _RTMIN <= signum <= _RTMAX:
        if signum <= _RTMIN + (_RTMAX - _RTMIN) // 2:
            base, delta = "RTMIN", signum - _RTMIN
        else:
            base, delta = "RTMAX", signum - _RTMAX
        return base if delta == 0 else f"{base}{delta:+d}"
    return str(signum)


def _valid(signum: int) -> bool:
    return signal_name(signum) != str(signum)


def _str2sig(upper: str) -> int | None:
    if upper in _BY_NAME:
        return _BY_NAME[upper]
    if upper.isascii() and upper.isdigit():
        # gnulib's str2sig takes a plain number too, reached through "SIG15"
        # or "sig0" (the SIG prefix is stripped and the rest asked again);
        # its range is checked by the caller, as for any number.
        return int(upper) if len(upper) <= 10 else None
    if _RTMIN is None or _RTMAX is None:
        return None
    for base, low, high, origin in (
        ("RTMIN", 0, _RTMAX - _RTMIN, _RTMIN),
        ("RTMAX", _RTMIN - _RTMAX, 0, _RTMAX),
    ):
        if upper.startswith(base):
            rest = upper[len(base) :]
            if rest and not _STRTOL.fullmatch(rest):
                return None
            delta = int(rest) if rest else 0
            return origin + delta if low <= delta <= high else None
    return None


def parse_signal(text: str) -> int:
    """GNU's operand2sig: SIGNAL as a number; ValueError when it is not one."""
    signum: int | None
    if text[:1] in "0123456789" and text:
        if not text.isascii() or not text.isdigit() or int(text) > 2**31 - 1:
            raise ValueError(text)
        signum = int(text)
        # A shell status: 128+N (or 256+N, as ksh reports it) means N.
        signum &= 0xFF if signum >= 0xFF else 0x7F
    else:
        upper = "".join(c.upper() if "a" <= c <= "z" else c for c in text)
        signum = _str2sig(upper)
        if signum is None and upper.startswith("SIG"):
            signum = _str2sig(upper[3:])
    if signum is None or not _valid(signum):
        raise ValueError(text)
    return signum


# -- diagnostics ---------------------------------------------------------------

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
_UTF8 = re.compile(r"utf-?8", re.IGNORECASE)
_COERCED = ("C.UTF-8", "C.utf8", "UTF-8")
LEFT_QUOTE, RIGHT_QUOTE = "\u2018", "\u2019"  # GNU's quotes in a UTF-8 locale


def utf8_quotes(environ: Mapping[str, str] | None = None) -> bool:
    """Does GNU quote with U+2018/U+2019 here (a UTF-8 LC_CTYPE) rather than '?

    Python itself may have set LC_CTYPE=C.UTF-8 (PEP 538 locale coercion)
    when the locale was C: that is taken for the C locale it came from."""
    env = os.environ if environ is None else environ
    name = env.get("LC_ALL") or ""
    if not name:
        ctype = env.get("LC_CTYPE") or ""
        coerced = ctype in _COERCED and env.get("LANG", "") in ("", "C", "POSIX")
        name = ctype if ctype and not coerced else env.get("LANG", "")
    return bool(_UTF8.search(name))


def _octal(text: str) -> str:
    return "".join(f"\\{b:03o}" for b in os.fsencode(text))


def quote(text: str, utf8: bool | None = None) -> str:
    """GNU's quote() (locale quoting style): the name in U+2018/U+2019 in a
    UTF-8 locale, 'sleep' otherwise, with C escapes for what cannot be shown
    as is."""
    if utf8 is None:
        utf8 = utf8_quotes()
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif utf8:
            if ch == RIGHT_QUOTE:
                out.append("\\" + RIGHT_QUOTE)
            elif "\udc80" <= ch <= "\udcff" or not (ch.isprintable() or unicodedata.category(ch) == "Zs"):
                out.append(_octal(ch))
            else:
                out.append(ch)
        elif ch == "'":
            out.append("\\'")
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(_octal(ch))
    body = "".join(out)
    return f"{LEFT_QUOTE}{body}{RIGHT_QUOTE}" if utf8 else f"'{body}'"


def _say(text: str) -> None:
    """One line on stderr, written at once; a broken stderr is ignored."""
    try:
        sys.stderr.flush()
        os.write(2, (text + "\n").encode(errors="surrogateescape"))
    except (OSError, ValueError, AttributeError):
        pass


# -- arguments -----------------------------------------------------------------

_SHORT = "k:s:v"
_LONG = ["kill-after=", "signal=", "verbose", "foreground", "preserve-status", "receipt=", "json"]
_LONG += ["help", "version"]


def _getopt_message(exc: getopt.GetoptError, argv: Sequence[str]) -> str:
    """GNU getopt's wording for what Python's getopt refused (`argv`: the
    arguments it was given)."""
    opt = exc.opt
    long = exc.msg.startswith(f"option --{opt} ")  # (a short option's reads "option -X ...")
    if "requires argument" in exc.msg:
        return f"option '--{opt}' requires an argument" if long else f"option requires an argument -- '{opt}'"
    if "must not have an argument" in exc.msg:
        return f"option '--{opt}' doesn't allow an argument"
    if "not a unique prefix" in exc.msg:
        # As glibc: the argument as written (with its "=value"), then every
        # long option it could be, in their table's order.
        written = next((a for a in argv if a.startswith("--") and a[2:].partition("=")[0] == opt), f"--{opt}")
        names = [name.rstrip("=") for name in _LONG if name.startswith(opt)]
        return f"option '{written}' is ambiguous; possibilities:" + "".join(f" '--{n}'" for n in names)
    return f"unrecognized option '--{opt}'" if long else f"invalid option -- '{opt}'"


def parse_args(argv: Sequence[str], prog: str) -> TimeoutOptions | int:
    """Parse as GNU timeout does; an int is an exit status (--help,
    --version). Raises UsageError for a bad invocation."""
    try:
        opts, operands = getopt.getopt(list(argv), _SHORT, _LONG)
    except getopt.GetoptError as exc:
        raise UsageError(_getopt_message(exc, argv)) from None
    kill_after: float | None = None
    signum: int = signal.SIGTERM
    verbose = foreground = preserve_status = as_json = False
    receipt: str | None = None
    for opt, value in opts:
        if opt in ("-k", "--kill-after"):
            kill_after = _duration(value)
        elif opt in ("-s", "--signal"):
            try:
                signum = parse_signal(value)
            except ValueError:
                raise UsageError(f"{quote(value)}: invalid signal") from None
        elif opt in ("-v", "--verbose"):
            verbose = True
        elif opt == "--foreground":
            foreground = True
        elif opt == "--preserve-status":
            preserve_status = True
        elif opt == "--receipt":
            receipt = value
        elif opt == "--json":
            as_json = True
        elif opt == "--help":
            sys.stdout.write(HELP.format(prog=prog, name=NAME, grace=DEFAULT_GRACE))
            sys.stdout.flush()
            return 0
        elif opt == "--version":
            print(f"{prog} (trio_procown) {__version__}", flush=True)
            return 0
    if len(operands) < 2:
        raise UsageError("")  # GNU names nothing here: only its "Try ... --help" line
    duration = _duration(operands[0])
    return TimeoutOptions(
        command=list(operands[1:]),
        duration=duration or None,
        signal=signum,
        kill_after=kill_after or None,
        preserve_status=preserve_status,
        foreground=foreground,
        verbose=verbose,
        receipt=receipt,
        json=as_json,
    )


def _duration(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError:
        raise UsageError(f"invalid time interval {quote(text)}") from None
    return min(value, MAX_SECONDS)


# -- running -------------------------------------------------------------------

# Signals that procown relays to the command as GNU timeout does (besides
# the -s signal); SIGALRM is GNU's own timer signal: it means "time is up".
RELAYED = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM)
# Never caught, whatever -s says: uncatchable, job control that GNU ignores,
# the child-exit signal, and faults (a handler would loop on a real one).
_NOT_CAUGHT = frozenset(
    {
        0,
        signal.SIGKILL,
        signal.SIGSTOP,
        signal.SIGCHLD,
        signal.SIGTTIN,
        signal.SIGTTOU,
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
    }
)


class _Control:
    """The timer and the signal relay of one run: each asks the owned
    command for its teardown at most once, saying (-v) what it sends."""

    def __init__(self, options: TimeoutOptions) -> None:
        self.options = options
        self.stopping = False
        self.narrated = False  # the first stage's line was printed live
        self.relayed: set[int] = set()  # signals already passed on to the domain

    def narrate(self, signum: int) -> None:
        if self.options.verbose:
            _say(f"{NAME}: sending signal {signal_name(signum)} to command {quote(self.options.command[0])}")

    def _stop(self, run: OwnedCommand, cause: str, signum: int) -> None:
        if self.stopping and cause == "cancelled" and signum not in self.relayed:
            # GNU relays every signal it receives, not only the first: a
            # later, different one (INT after TERM, TERM after the timeout's
            # signal) goes on to the domain; the teardown and its bound stay.
            self.relayed.add(signum)
            if run.signal_domain(signum):
                self.narrate(signum)
            return
        if self.stopping or run.phase.value != "running":
            return  # a teardown is running (bounded) or over: nothing to add
        self.relayed.add(signum)
        self.stopping = True
        self.narrate(signum)
        self.narrated = True
        # A relayed signal: GNU sends the signal it received, not -s's.
        first = signum if signum != self.options.signal else None
        run.request_stop("timed_out" if cause == "timed_out" else "cancelled", first_signal=first)

    async def timer(self, run: OwnedCommand) -> None:
        if self.options.duration is None:
            return
        await trio.sleep_until(run.started_at + self.options.duration)
        self._stop(run, "timed_out", self.options.signal)

    async def relay(self, run: OwnedCommand, signals: AsyncIterator[int], early: Sequence[int] = ()) -> None:
        """Act on each signal procown receives; first on those `early`, which
        came before the relay was ready (see _entry.py), as if they came now."""
        for signum in early:
            self._received(run, signum)
        async for signum in signals:
            self._received(run, signum)

    def _received(self, run: OwnedCommand, signum: int) -> None:
        if signum == signal.SIGALRM:
            self._stop(run, "timed_out", self.options.signal)
        else:
            self._stop(run, "cancelled", signum)


def _caught(options: TimeoutOptions) -> tuple[int, ...]:
    extra = () if options.signal in _NOT_CAUGHT or options.signal in RELAYED else (options.signal,)
    return (*RELAYED, signal.SIGALRM, *extra)


@dataclasses.dataclass(frozen=True)
class _Streams:
    """What the command gets for fds 0, 1 and 2: procown's own, as is (as
    under GNU timeout); /dev/null for one that is closed. Decided before
    procown opens anything, which would otherwise take the closed number."""

    stdin: int | None
    stdout: str
    stderr: str

    @classmethod
    def inherited(cls) -> _Streams:
        open_ = []
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
                open_.append(True)
            except OSError:
                open_.append(False)
        return cls(
            stdin=0 if open_[0] else None,
            stdout=INHERIT if open_[1] else DEVNULL,
            stderr=INHERIT if open_[2] else DEVNULL,
        )


async def _run(
    options: TimeoutOptions, streams: _Streams, early: Sequence[int] = ()
) -> tuple[Ending, Receipt | None]:
    control = _Control(options)
    command = options.command
    code = exec_error(command[0])
    if code is not None:
        return _failed_to_run(command[0], code), None
    run: OwnedCommand | None = None
    argv = list(command)
    with trio.open_signal_receiver(*_caught(options)) as signals:
        while True:
            try:
                async with (
                    open_owned_command(
                        argv,
                        grace=options.grace,
                        kill_wait=DEFAULT_KILL_WAIT,
                        stdin=streams.stdin,
                        stdout=streams.stdout,
                        stderr=streams.stderr,
                        first_signal=options.signal,
                        pass_fds=inherited_fds(),  # as GNU's command inherits them (a jobserver's pipe)
                    ) as run,
                    trio.open_nursery() as nursery,
                ):
                    nursery.start_soon(control.timer, run)
                    nursery.start_soon(control.relay, run, signals, early)
                    await run.wait()
                    nursery.cancel_scope.cancel()
            except DomainUnavailable as exc:
                _say(f"{NAME}: error: {exc}")
                return Ending(EXIT_PROCOWN), None
            except OSError as exc:
                if run is not None:
                    raise
                if exc.errno == errno.ENOEXEC and argv == list(command):  # once
                    argv = shell_script_argv(command)  # as execvp
                    continue
                return _spawn_failure(command[0], exc, argv), None
            except ValueError as exc:
                if run is not None:
                    raise
                # The library refuses a signal it cannot name.
                _say(f"{NAME}: cannot use signal {signal_name(options.signal)}: {exc}")
                return Ending(EXIT_PROCOWN), None
            break
    receipt = run.receipt
    assert receipt is not None
    if options.verbose:
        for name in _later_signals(receipt, control.narrated):
            _say(f"{NAME}: sending signal {name} to command {quote(command[0])}")
    return ending(receipt, options), receipt


def exec_error(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    """The errno execvp(3) would fail with for `name` (ENOENT, EACCES,
    ENOTDIR, ...), found before anything is started by the spawn's own
    lookup (_spawn.resolve_argv); None when it can be executed (a file
    without `#!` included: see _run)."""
    try:
        resolve_argv([name], None, exec_path(environ))
    except OSError as exc:
        return exc.errno or errno.ENOENT
    except ValueError:  # an embedded NUL: no such file
        return errno.ENOENT
    return None


def _failed_to_run(name: str, code: int) -> Ending:
    """GNU's "failed to run command" and its status: 127 not found, 126
    cannot be invoked."""
    _say(f"{NAME}: failed to run command {quote(name)}: {os.strerror(code)}")
    return Ending(cannot_run_status(code))


def _spawn_failure(name: str, exc: OSError, argv: list[str]) -> Ending:
    """What the library refused at the spawn of `argv`: GNU's 127 or 126
    when the command itself cannot be run (its exec failing for any reason
    but ENOENT is 126, a "Text file busy" program say: command_failure), or
    125 when procown could not set the command up."""
    code = command_failure(exc, argv)
    if code is not None:
        return _failed_to_run(name, code)
    _say(f"{NAME}: error: cannot start {quote(name)}: {exc.strerror or exc}")
    return Ending(EXIT_PROCOWN)


def _later_signals(receipt: Receipt, narrated_first: bool) -> list[str]:
    """The signal stages of the teardown not yet told (-v): the KILL stage,
    and the stages of a teardown of what the command left behind."""
    stages = [
        s
        for s in receipt.steps
        if s.action is Action.SIGNAL and s.target == "domain" and not s.detail.endswith(BY_THE_CALLER)
    ]
    if narrated_first:
        stages = stages[1:]
    return [s.signals[0].removeprefix("SIG") if s.signals else "EXIT" for s in stages]


def ending(receipt: Receipt, options: TimeoutOptions) -> Ending:
    """How procown ends, GNU timeout's way, from the receipt."""
    code = receipt.returncode
    stopped = receipt.cause in ("timed_out", "cancelled")
    if stopped and (receipt.forced or code == -signal.SIGKILL):
        # GNU's KILL reaches its own process group, timeout included; with
        # --foreground it exits 137 instead.
        return Ending(EXIT_KILLED, None if options.foreground else signal.SIGKILL)
    if code is None:
        return Ending(EXIT_PROCOWN)
    if receipt.cause == "timed_out":
        if not options.preserve_status:
            return Ending(EXIT_TIMEOUT)
        return Ending(code if code >= 0 else SIGNAL_BASE - code)
    if code >= 0:
        return Ending(code)
    return Ending(SIGNAL_BASE - code, -code)


def _disable_core_dumps() -> bool:
    """As GNU timeout does before raising a signal it got from its command."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) == 0:  # PR_SET_DUMPABLE, 0
            return True
    except (OSError, AttributeError):
        pass
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, OSError, ValueError):
        return False
    return True


def die_by(signum: int) -> None:
    """End this process by `signum` (returns only if that did not end it).

    What a normal exit would do runs first (the atexit handlers: the
    library's keeper is told goodbye and waited for, so no helper outlives
    procown), then the streams are flushed."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if signum != signal.SIGKILL:
        if not _disable_core_dumps():
            return
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    signal.raise_signal(signum)


def _usage(prog: str, message: str) -> int:
    if message:
        _say(f"{NAME}: {message}")
    _say(f"Try '{prog} --help' for more information.")
    return EXIT_PROCOWN


def run_timeout(options: TimeoutOptions, early: Sequence[int] = ()) -> Ending:
    """Run the command owned, with GNU timeout's semantics; write the
    receipt; return how procown should end (not ending it). `early`: the
    signals procown received before it could relay them (_entry.py), relayed
    once the command runs."""
    from ._cli import with_receipt

    streams = _Streams.inherited()  # first: before anything takes a closed fd's number
    return with_receipt(options.receipt, options.json, lambda: trio.run(_run, options, streams, early))


def entry() -> None:
    """The `procown-timeout` console script: main(), then a prompt exit (_exit.py)."""
    from ._exit import run_and_exit

    run_and_exit(main)


def main(
    argv: Sequence[str] | None = None, prog: str = "procown-timeout", early: Sequence[int] | None = None
) -> int:
    """Entry point of `procown-timeout` and `procown timeout`. Returns the
    exit status, or ends the process by a signal as GNU timeout does (the
    command died of it, or the KILL stage was needed). `early`: the signals
    received before main() (_entry.py), taken from there when not given."""
    from ._entry import release
    from ._errors import CliError

    early = release() if early is None else early
    args = sys.argv[1:] if argv is None else argv
    try:
        try:
            parsed = parse_args(args, prog)
        except UsageError as exc:
            return _usage(prog, str(exc))
        if isinstance(parsed, int):
            return parsed
        result = run_timeout(parsed, early)
    except KeyboardInterrupt:
        # SIGINT before procown could relay it: nothing was started.
        result = Ending(SIGNAL_BASE + signal.SIGINT, signal.SIGINT)
    except CliError as exc:
        _say(f"{NAME}: error: {exc}")
        return EXIT_PROCOWN
    if result.die_by is not None:
        die_by(result.die_by)
    return result.status
