"""`procown timeout` against GNU timeout(1), run side by side.

Each comparison runs /usr/bin/timeout and procown's with the same arguments
and compares the raw wait statuses (Python's returncode: -N when the process
died of signal N, which GNU timeout does on purpose), so both the exit
status a shell shows and the way it was produced must agree. The cases are
GNU's documented ones (its --help, its manual, and coreutils' own tests:
tests/timeout/timeout.sh and timeout-parameters.sh). Then what only an
owned command does: a setsid() grandchild does not survive, and every wait
is bounded even where GNU would wait for ever.

Every command here ends by itself within seconds; a test that starts
something that could outlive it ends it by its pid.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import py
from helpers import alive
from trio_procown import _timeout
from trio_procown._budgets import DEFAULT_GRACE

GNU = shutil.which("timeout")
OURS = [sys.executable, "-m", "trio_procown", "timeout"]
SCRIPT = Path(sys.executable).with_name("procown-timeout")
WAIT = 30.0  # upper bound on any single run


def _is_gnu() -> bool:
    if GNU is None:
        return False
    version = subprocess.run([GNU, "--version"], capture_output=True, check=False, timeout=WAIT)
    return b"GNU coreutils" in version.stdout


needs_gnu = pytest.mark.skipif(not _is_gnu(), reason="GNU coreutils timeout is not installed")


def run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(list(argv), capture_output=True, timeout=WAIT, check=False, **kwargs)


def both(
    args: Sequence[str], **kwargs: Any
) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes]]:
    """GNU timeout's and procown timeout's results for the same arguments."""
    return gnu(args, **kwargs), run([*OURS, *args], **kwargs)


def gnu(args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """GNU timeout, named `timeout` in its messages as when run from PATH."""
    return run(["timeout", *args], executable=GNU, **kwargs)


def as_gnu(stderr: bytes) -> bytes:
    """procown's diagnostics with GNU's program name."""
    return b"".join(
        b"timeout:" + line[len(b"procown:") :] if line.startswith(b"procown:") else line
        for line in stderr.splitlines(keepends=True)
    )


# -- exit statuses: GNU's documented cases ----------------------------------------------

STATUS_CASES = [
    # (arguments, the status both give)
    (["10", "true"], 0),
    (["1d", "true"], 0),
    (["0", "true"], 0),  # 0 disables the timeout
    (["10", "sh", "-c", "exit 2"], 2),  # the command's own status
    ([".1", "sleep", "10"], 124),  # timed out
    (["0.003m", "sleep", "10"], 124),  # a suffix: 0.18 s
    (["--preserve-status", ".1", "sleep", "10"], 128 + signal.SIGTERM),
    # -s0 -k: nothing is sent, then KILL; GNU dies of it with its group (137)...
    (["-s0", "-k1", ".1", "sleep", "10"], -signal.SIGKILL),
    # ...and exits 137 with --foreground.
    (["--foreground", "-s0", "-k1", ".1", "sleep", "10"], 128 + signal.SIGKILL),
    (["-s", "KILL", ".1", "sleep", "10"], -signal.SIGKILL),
    (["--foreground", "-s", "KILL", ".1", "sleep", "10"], 128 + signal.SIGKILL),
    (["--preserve-status", "-s", "KILL", ".1", "sleep", "10"], -signal.SIGKILL),
    # The command dies of a signal by itself: timeout dies of the same signal.
    (["10", "sh", "-c", "kill -USR1 $$"], -signal.SIGUSR1),
    (["10", "sh", "-c", "kill -KILL $$"], -signal.SIGKILL),
    (["0", "sleep", ".3"], 0),
    (["-k", "1", "0", "sleep", ".2"], 0),  # -k has no effect with DURATION 0
    (["-k", "0", "10", "true"], 0),
    (["--kill-after=5", "--signal=INT", "--verbose", "10", "true"], 0),
    (["--kill", "5", "--sig", "HUP", "--pres", "10", "true"], 0),  # long-option prefixes
    (["-vk5", "-sINT", "10", "true"], 0),  # short options bundled
    # Real-time signals (unnamed in Python's signal module) are sent too.
    (["-s", "RTMIN+1", ".2", "sleep", "5"], 124),
    (["-s", "RTMAX-1", "--preserve-status", ".2", "sleep", "5"], 128 + signal.SIGRTMAX - 1),
    (["--", "10", "true"], 0),
    (["10", "--", "true"], 127),  # options end at DURATION: "--" is the command
    (["10.34", "sleep", "0"], 0),
    (["9.999999999", "sleep", "0"], 0),
    (["1e1", "true"], 0),
    ([" 5", "true"], 0),
    (["+5", "true"], 0),
    (["0x10", "true"], 0),
    (["inf", "true"], 0),
    (["--", "-0", "true"], 0),
    (["10", "sh", "-c", "exit 124"], 124),
    (["10", "sh", "-c", "exit 125"], 125),
    # 125: timeout's own errors.
    (["invalid", "sleep", "0"], 125),
    (["--kill-after=invalid", "1", "sleep", "0"], 125),
    (["42D", "sleep", "0"], 125),
    (["1x", "true"], 125),
    (["1 ", "true"], 125),
    (["1ss", "true"], 125),
    (["nan", "true"], 125),
    (["--", "-1", "true"], 125),
    (["--signal=invalid", "1", "sleep", "0"], 125),
    (["-s", "99", "1", "true"], 125),
    (["-s", "", "1", "true"], 125),
    (["-s", "RTMIN+31", "1", "true"], 125),
    (["--bogus", "1", "true"], 125),
    (["-x", "1", "true"], 125),
    (["-k"], 125),
    (["1"], 125),
    ([], 125),
    # 126: found but cannot be invoked; 127: not found.
    (["10", "."], 126),
    (["10", "/etc/passwd"], 126),
    (["10", "procown_no_such_command"], 127),
    (["10", ""], 127),  # execvp("") is ENOENT
    (["10", "/nonexistent/procown"], 127),
]


@needs_gnu
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "expected"), STATUS_CASES, ids=lambda v: repr(v) if isinstance(v, list) else ""
)
def test_status_matches_gnu(args: list[str], expected: int, tmp_path: Path) -> None:
    """The documented exit statuses, and how they are produced, are GNU's."""
    theirs, ours = both(args, cwd=tmp_path)
    assert theirs.returncode == expected, theirs.stderr
    assert ours.returncode == expected, ours.stderr
    assert ours.stdout == theirs.stdout


@needs_gnu
def test_a_program_whose_exec_fails_gives_126_as_gnu(tmp_path: Path) -> None:
    """A program found whose exec fails for a reason other than ENOENT (here "Text file
    busy": it is open for writing) cannot be invoked: 126, as GNU timeout gives, with GNU's
    message, and not procown's own failure (125)."""
    program = tmp_path / "busy"
    shutil.copy("/bin/true", program)
    program.chmod(0o755)
    writer = os.open(program, os.O_WRONLY)
    try:
        theirs, ours = both(["10", str(program)], cwd=tmp_path)
    finally:
        os.close(writer)
    assert theirs.returncode == 126, theirs.stderr
    assert ours.returncode == 126, ours.stderr
    assert ours.stderr.replace(b"procown:", b"timeout:") == theirs.stderr


@needs_gnu
def test_script_without_interpreter_line_runs_in_sh_as_gnu(tmp_path: Path) -> None:
    """An executable file with no `#!` (no format the kernel knows) is run by
    /bin/sh, as execvp does for GNU timeout: same output, same status."""
    script = tmp_path / "plain-script"
    script.write_text('echo "ran as $0 with $1"\nexit 3\n')
    script.chmod(0o755)
    theirs, ours = both(["10", str(script), "arg"], cwd=tmp_path)
    assert (theirs.returncode, theirs.stdout) == (3, f"ran as {script} with arg\n".encode())
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout), ours.stderr


@needs_gnu
@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("INT", "INT"),
        ("2", "INT"),
        ("SIGINT", "INT"),
        ("sigint", "INT"),
        ("130", "INT"),  # a shell status, 128+N
        ("HUP", "HUP"),
        ("1", "HUP"),
        ("SigHup", "HUP"),
        ("USR1", "USR1"),
        ("10", "USR1"),
        ("266", "USR1"),  # ksh's 256+N
        ("TERM", "TERM"),
    ],
)
def test_signal_names_and_numbers_match_gnu(spec: str, name: str, tmp_path: Path) -> None:
    """-s takes names (with or without SIG, any case) and numbers as GNU does:
    the command's trap for that signal runs (--preserve-status shows it)."""
    script = f'trap "exit 42" {name}; sleep 5; exit 3'
    theirs, ours = both(["--preserve-status", "-s", spec, ".5", "sh", "-c", script], cwd=tmp_path)
    assert (theirs.returncode, ours.returncode) == (42, 42), ours.stderr


def gnu_accepts(args: list[str]) -> bool:
    return gnu([*args, "true"]).returncode != 125


@needs_gnu
def test_signal_syntax_matches_gnu() -> None:
    """Which SIGNAL operands GNU accepts, procown accepts, and no other."""
    specs = [
        "0", "00", "09", "EXIT", "SIGEXIT", "kill", "IOT", "CLD", "POLL", "IO", "PWR", "STKFLT",
        "RTMIN", "RTMAX", "RTMIN+1", "rtmin+01", "SIGRTMIN+1", "RTMIN+30", "RTMIN+31", "RTMAX-1",
        "RTMIN-1", "RTMAX+1", "32", "33", "34", "64", "65", "127", "128", "137", "200", "255",
        "256", "265", "384", "4294967305", "+1", " 1", "1 ", "0x9", "SIG", "sig", "", "UNUSED",
        "TERM ", "-1", "SIG15", "sig9", "SIG0", "SIG00", "SIG65", "SIG143", "SIG+1", "SIG1 ",
    ]  # fmt: skip
    for spec in specs:
        try:
            _timeout.parse_signal(spec)
            ours = True
        except ValueError:
            ours = False
        assert ours == gnu_accepts(["-s", spec, "1"]), spec


@needs_gnu
def test_duration_syntax_matches_gnu() -> None:
    """Which DURATION operands GNU accepts, procown accepts, and no other."""
    durations = [
        "0", "1", "1.5", ".5", "5.", "1e1", "1E+1", "0x10", "0x1.8p1", "inf", "INFINITY", " 1",
        "\t1", "+1", "-0", "1s", "1m", "1h", "1d", "2.5m", "nan", "-1", "1x", "1 ", "", "s",
        "1ss", "1e", "0x", "1_0", "1,5", "\u0661", "--1", "1S", "1D", "-inf", ".", "e1",
    ]  # fmt: skip
    for text in durations:
        try:
            _timeout.parse_duration(text)
            ours = True
        except ValueError:
            ours = False
        assert ours == gnu_accepts(["--", text]), repr(text)


def test_signal_names_are_gnus() -> None:
    """sig2str's names: the first of an alias pair, EXIT for 0, RTMIN+n/RTMAX-n."""
    names = {n: _timeout.signal_name(n) for n in (0, 6, 9, 15, 17, 29, 34, 35, 49, 50, 63, 64)}
    assert names == {
        0: "EXIT",
        6: "ABRT",
        9: "KILL",
        15: "TERM",
        17: "CHLD",
        29: "POLL",
        34: "RTMIN",
        35: "RTMIN+1",
        49: "RTMIN+15",
        50: "RTMAX-14",
        63: "RTMAX-1",
        64: "RTMAX",
    }


def test_quoting_is_gnus() -> None:
    """quote(): U+2018/U+2019 in a UTF-8 locale, ASCII quotes otherwise, C escapes."""
    left, right = _timeout.LEFT_QUOTE, _timeout.RIGHT_QUOTE
    assert _timeout.quote("sleep", utf8=True) == f"{left}sleep{right}"
    assert _timeout.quote("it's", utf8=True) == f"{left}it's{right}"
    assert _timeout.quote(f"x{left}y{right}z", utf8=True) == f"{left}x{left}y\\{right}z{right}"
    assert _timeout.quote("a\\b\tc", utf8=False) == "'a\\\\b\\tc'"
    assert _timeout.quote("it's", utf8=False) == "'it\\'s'"
    assert _timeout.quote("\u00e9", utf8=False) == "'\\303\\251'"
    assert _timeout.utf8_quotes({"LANG": "C.UTF-8"})
    assert not _timeout.utf8_quotes({"LC_ALL": "C", "LANG": "C.UTF-8"})
    # Python coerces a C locale to LC_CTYPE=C.UTF-8 (PEP 538): still the C locale.
    assert not _timeout.utf8_quotes({"LANG": "C", "LC_CTYPE": "C.UTF-8"})


# -- diagnostics ---------------------------------------------------------------


@needs_gnu
@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
@pytest.mark.parametrize(
    "args",
    [
        ["-v", "-s0", "-k", ".1", ".1", "sleep", "10"],  # coreutils' own test: EXIT, then KILL
        ["--verbose", ".1", "sleep", "10"],
        ["-v", "-s", "HUP", ".1", "/bin/sleep", "10"],
        ["-v", "10", "true"],  # nothing sent, nothing said
    ],
    ids=["s0-k", "term", "hup", "none"],
)
def test_verbose_lines_are_gnus(args: list[str], locale: str, tmp_path: Path) -> None:
    """-v: one line per signal sent, GNU's wording with procown's name."""
    env = {**os.environ, "LC_ALL": locale}
    theirs, ours = both(args, cwd=tmp_path, env=env)
    assert ours.returncode == theirs.returncode
    assert as_gnu(ours.stderr) == theirs.stderr


@needs_gnu
def test_error_messages_are_gnus(tmp_path: Path) -> None:
    """Usage errors and failures to run read as GNU's (procown's name, its --help)."""
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    cases = [["invalid", "true"], ["-s", "99", "1", "true"], ["--bogus", "1", "true"], ["10", "."]]
    # GNU's own tests' cases (coreutils tests/timeout): no command, an
    # ambiguous prefix (glibc lists what it could be), a long option that
    # is a digit, a short option that is a dash, a flag given a value.
    cases += [[], ["5"], ["--v", ".1", "sleep", "0"], ["--ver"], ["--v=3", "1", "true"], ["--1", "sh"]]
    cases += [["-v-", "1", "true"], ["--fore=x", "1", "true"], ["-k"], ["--kill"], ["--s", "1", "true"]]
    for args in cases:
        theirs, ours = both(args, cwd=tmp_path, env=env)
        expected = theirs.stderr.replace(b"'timeout --help'", b"'procown timeout --help'")
        assert as_gnu(ours.stderr) == expected, args


# -- signals that reach timeout itself ---------------------------------------------------


@contextmanager
def started(argv: Sequence[str], cwd: Path, executable: str | None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        list(argv),
        executable=executable,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()  # only on failure: both relay and end their command by themselves
            proc.wait(timeout=WAIT)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def gnu_settled(pid: int) -> None:
    """Wait (at most WAIT) until GNU timeout, whose command is already
    running, sleeps in sigsuspend: only then has it stored its command's pid.
    A signal that comes sooner, even after the command printed "ready" (the
    child can exec and print before fork() has returned in the parent, on a
    loaded machine), finds no pid there and GNU ends at once with 128+signal,
    relaying nothing (measured: 11 of 100 runs beside a fork loop). Its
    kernel wait channel says where it sleeps; where that is hidden ("0"),
    any sleep counts (after the fork, sigsuspend is its only one)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            if "sigsuspend" in wchan or (
                wchan in ("", "0") and psutil.Process(pid).status() == psutil.STATUS_SLEEPING
            ):
                return
        except (OSError, psutil.NoSuchProcess):
            return  # gone: the caller sees its status
        time.sleep(0.001)  # (no event tells us: polled, bounded by WAIT)
    msg = f"GNU timeout (pid {pid}) never settled in sigsuspend"
    raise AssertionError(msg)


def relayed(
    prefix: Sequence[str], sig: int, command: list[str], cwd: Path, executable: str | None = None
) -> tuple[int, bytes]:
    """Start timeout on `command` (which prints "ready" once set up), send
    `sig` to timeout itself; its status and stderr."""
    with started([*prefix, "-v", "10", *command], cwd, executable) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        assert proc.stdout.readline() == b"ready\n"
        if executable == GNU:
            gnu_settled(proc.pid)
        proc.send_signal(sig)
        status = proc.wait(timeout=WAIT)
        return status, proc.stderr.read()


@needs_gnu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("trap", [True, False], ids=["trapped", "default"])
def test_signal_to_timeout_is_relayed_as_gnu_does(sig: signal.Signals, trap: bool, tmp_path: Path) -> None:
    """A signal sent to timeout itself goes on to the command: when the command
    traps it, its status is timeout's; when it dies of it, so does timeout."""
    if trap:
        # Exits 42 from its handler, at once and only once (GNU signals the
        # command and then its own process group: the signal comes twice).
        command = py(
            f"import os, signal, time\nsignal.signal({sig}, lambda *_: os._exit(42))\n"
            "print('ready', flush=True)\ntime.sleep(5)\nos._exit(3)\n"
        )
    else:
        # Dies of the signal (the default action, restored), and says it is
        # ready only once it would.
        command = py(
            f"import signal, time\nsignal.signal({sig}, signal.SIG_DFL)\n"
            "print('ready', flush=True)\ntime.sleep(5)\n"
        )
    theirs = relayed(["timeout"], sig, command, tmp_path, GNU)
    ours = relayed(OURS, sig, command, tmp_path)
    assert theirs[0] == (42 if trap else -sig)
    assert ours[0] == theirs[0]
    assert as_gnu(ours[1]) == theirs[1]  # "sending signal INT to command 'python'"
    assert theirs[1].startswith(b"timeout: sending signal " + sig.name.removeprefix("SIG").encode())


@needs_gnu
@pytest.mark.timeout(120)
def test_a_second_signal_is_relayed_too(tmp_path: Path) -> None:
    """GNU relays every signal it receives: a command that ignores TERM still
    dies of the INT sent after it, during the teardown's grace (-k 10), and
    timeout with it; procown does the same, not waiting out the grace."""
    command = ["sh", "-c", 'trap "" TERM; echo ready; sleep 5; exit 3']

    def twice(prefix: Sequence[str], executable: str | None = None) -> tuple[int, bytes]:
        with started([*prefix, "-v", "-k", "10", "10", *command], tmp_path, executable) as proc:
            assert proc.stdout is not None
            assert proc.stderr is not None
            assert proc.stdout.readline() == b"ready\n"
            if executable == GNU:
                gnu_settled(proc.pid)
            proc.send_signal(signal.SIGTERM)
            first = proc.stderr.readline()  # "sending signal TERM": relayed, and ignored
            proc.send_signal(signal.SIGINT)
            status = proc.wait(timeout=WAIT)
            return status, first + proc.stderr.read()

    theirs = twice(["timeout"], GNU)
    ours = twice(OURS)
    assert theirs[0] == -signal.SIGINT
    assert ours[0] == theirs[0], ours[1]
    assert as_gnu(ours[1]) == theirs[1]


@needs_gnu
def test_preexisting_child_does_not_confuse_it(tmp_path: Path) -> None:
    """coreutils' Bug#9098 case: started with a child already, timeout still
    times its command out (124, nothing printed)."""
    assert GNU is not None
    for prog in ([GNU], OURS):
        command = " ".join(prog)
        script = f"sleep .1 & exec {command} .5 sh -c 'sleep 2; echo foo'"
        done = run(["sh", "-c", script], cwd=tmp_path)
        assert (done.returncode, done.stdout) == (124, b""), (prog, done.stderr)


# -- what owning the command adds ---------------------------------------------------

# Forks a child that leaves the session (setsid), prints its pid, and sleeps.
SETSID_GRANDCHILD = py(
    "import os, sys, time\n"
    "r, w = os.pipe()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.setsid()\n"
    "    quiet = os.open(os.devnull, os.O_RDWR)\n"
    "    os.dup2(quiet, 1)\n"
    "    os.dup2(quiet, 2)\n"
    "    os.write(w, b'x')\n"
    "    time.sleep(30)\n"
    "    os._exit(0)\n"
    "os.read(r, 1)\n"
    "print(pid, flush=True)\n"
    "time.sleep(30)\n"
)


@needs_gnu
@pytest.mark.timeout(120)
def test_setsid_grandchild_survives_gnu_but_not_procown(tmp_path: Path) -> None:
    """GNU timeout signals its process group: a grandchild that called setsid()
    outlives it. procown's domain holds it: it is gone when procown exits."""
    under_gnu = gnu([".5", *SETSID_GRANDCHILD], cwd=tmp_path)
    escaped = int(under_gnu.stdout)
    try:
        assert under_gnu.returncode == 124
        assert alive(escaped)  # GNU left it running
    finally:
        os.kill(escaped, signal.SIGKILL)  # ours to end: we started it
    receipt_path = tmp_path / "receipt.json"
    ours = run([*OURS, "--receipt", str(receipt_path), ".5", *SETSID_GRANDCHILD], cwd=tmp_path)
    owned = int(ours.stdout)
    gone = not alive(owned)
    if not gone:
        os.kill(owned, signal.SIGKILL)
    assert ours.returncode == 124, ours.stderr
    assert gone
    receipt = json.loads(receipt_path.read_text())
    assert (receipt["cause"], receipt["domain_empty"], receipt["escaped"]) == ("timed_out", True, [])


# Ignores SIGTERM, saying so; only SIGKILL ends it.
STUBBORN = py(
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


@pytest.mark.timeout(60)
def test_without_kill_after_the_wait_is_still_bounded(tmp_path: Path) -> None:
    """Without -k GNU would wait for ever for a command that ignores the
    signal; procown sends KILL after the default grace (status 137, by
    SIGKILL as GNU's -k would), long before the command's 30 s are up."""
    receipt_path = tmp_path / "receipt.json"
    started_at = time.monotonic()
    done = run([*OURS, "-v", "--receipt", str(receipt_path), "1", *STUBBORN], cwd=tmp_path)
    assert time.monotonic() - started_at < 25  # not the command's 30 s
    assert done.returncode == -signal.SIGKILL, done.stderr
    lines = done.stderr.decode().splitlines()
    assert [line.split(" to command")[0] for line in lines] == [
        "procown: sending signal TERM",
        "procown: sending signal KILL",
    ]
    receipt = json.loads(receipt_path.read_text())
    assert (receipt["cause"], receipt["forced"], receipt["domain_empty"]) == ("timed_out", True, True)
    waits = [s["detail"] for s in receipt["steps"] if s["action"] == "wait"]
    assert f"budget {DEFAULT_GRACE:g}s (grace)" in waits


def test_kill_after_sets_the_grace(tmp_path: Path) -> None:
    """-k DURATION is the graceful stage's bound."""
    receipt_path = tmp_path / "receipt.json"
    done = run([*OURS, "--receipt", str(receipt_path), "-k", ".4", "1", *STUBBORN], cwd=tmp_path)
    assert done.returncode == -signal.SIGKILL, done.stderr
    receipt = json.loads(receipt_path.read_text())
    waits = [s["detail"] for s in receipt["steps"] if s["action"] == "wait"]
    assert "budget 0.4s (grace)" in waits


def test_what_the_command_left_behind_is_ended(tmp_path: Path) -> None:
    """The command exits by itself (its status is procown's); what it left
    running in its domain is torn down, not left as under GNU timeout."""
    receipt_path = tmp_path / "receipt.json"
    script = "sleep 30 & echo $!; exit 5"
    done = run([*OURS, "--receipt", str(receipt_path), "10", "sh", "-c", script], cwd=tmp_path)
    left = int(done.stdout)
    gone = not alive(left)
    if not gone:
        os.kill(left, signal.SIGKILL)
    assert done.returncode == 5
    assert gone
    receipt = json.loads(receipt_path.read_text())
    assert (receipt["cause"], receipt["domain_empty"]) == ("exited", True)


def test_receipt_dash_summarises_on_stderr(tmp_path: Path) -> None:
    """--receipt - prints the receipt's summary on stderr; the output was the
    command's own (inherited, not captured)."""
    done = run([*OURS, "--receipt", "-", ".3", "sh", "-c", "echo out; sleep 10"], cwd=tmp_path)
    assert (done.returncode, done.stdout) == (124, b"out\n")
    text = done.stderr.decode()
    assert text.startswith("cause=timed_out ")
    assert "stdout: not captured (inherited)" in text


def test_receipt_json(tmp_path: Path) -> None:
    """--json with --receipt - prints the JSON receipt on stderr."""
    done = run([*OURS, "--receipt", "-", "--json", "10", "sh", "-c", "exit 3"], cwd=tmp_path)
    assert done.returncode == 3
    receipt = json.loads(done.stderr)
    assert (receipt["cause"], receipt["returncode"], receipt["output"]) == ("exited", 3, "not captured")


def test_stdin_is_the_commands(tmp_path: Path) -> None:
    """procown's stdin is the command's, as under GNU timeout."""
    done = run([*OURS, "10", "cat"], input=b"piped in\n", stdin=None, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, b"piped in\n")


@needs_gnu
def test_open_fds_above_2_are_the_commands_as_under_gnu(tmp_path: Path) -> None:
    """A `3<file` redirection (or make's jobserver pipe) reaches the command,
    as GNU timeout's command inherits it; `make -j2` under a `+` rule keeps
    its jobserver through procown timeout."""
    (tmp_path / "in.txt").write_bytes(b"from fd 3\n")
    script = f'{{ "$@" 10 sh -c "cat <&3"; }} 3< {tmp_path / "in.txt"}'
    for prefix in ([str(GNU)], OURS):
        done = run(["sh", "-c", script, "sh", *prefix], cwd=tmp_path)
        assert (done.returncode, done.stdout) == (0, b"from fd 3\n"), (prefix, done.stderr)
    make = shutil.which("make")
    if make is not None:
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "Makefile").write_text("all: a b\na:\n\t@echo a\nb:\n\t@echo b\n")
        outer = f"all:\n\t+{shlex.join(OURS)} 60 $(MAKE) -s -C sub\n"
        (tmp_path / "Makefile").write_text(outer)
        built = run([make, "-s", "-j2"], cwd=tmp_path)
        assert built.returncode == 0, built.stderr
        assert b"jobserver unavailable" not in built.stderr


def test_closed_stdin_gives_the_command_dev_null(tmp_path: Path) -> None:
    """With procown's fd 0 closed the command reads /dev/null; nothing procown
    opens (the receipt file, its event loop) takes fd 0's place."""
    receipt_path = tmp_path / "receipt.json"
    ours = " ".join([*OURS, "--receipt", str(receipt_path)])
    script = f"exec 0<&-; exec {ours} 10 sh -c 'cat; echo status $?'"
    done = run(["sh", "-c", script], cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, b"status 0\n"), done.stderr
    assert json.loads(receipt_path.read_text())["cause"] == "exited"


def test_console_script_is_the_same_command(tmp_path: Path) -> None:
    """`procown-timeout` is `procown timeout` (for `alias timeout=procown-timeout`)."""
    if not SCRIPT.exists():
        pytest.skip("the package is not installed with its console scripts")
    done = run([str(SCRIPT), ".2", "sleep", "10"], cwd=tmp_path)
    assert done.returncode == 124
    helped = run([str(SCRIPT), "--help"])
    assert helped.returncode == 0
    assert helped.stdout.startswith(b"Usage: procown-timeout [OPTION] DURATION COMMAND [ARG]...")
    for status in (b"124", b"125", b"126", b"127", b"137"):
        assert status in helped.stdout
    bad = run([str(SCRIPT), "--bogus"])
    assert bad.returncode == 125
    assert bad.stderr.endswith(b"Try 'procown-timeout --help' for more information.\n")


def test_procown_help_lists_timeout() -> None:
    """`procown --help` names the timeout subcommand."""
    done = run([sys.executable, "-m", "trio_procown", "--help"])
    assert done.returncode == 0
    assert b"timeout" in done.stdout
