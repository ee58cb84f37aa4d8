"""The `procown` command line, run as a real executable in a subprocess.

Every test starts `python -m trio_procown ...` and waits for it with a
timeout; a test that fails half-way still ends what it started (SIGTERM to
procown so that it tears its command down, then SIGKILL). Synchronisation
is by events: a line that the command printed and procown forwarded.
"""

from __future__ import annotations

import json
import os
import select
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

import pytest

from conftest import py
from helpers import alive
from trio_procown import Receipt

PROCOWN = [sys.executable, "-m", "trio_procown"]
WAIT = 20.0  # upper bound on any single wait for procown

# A shell that forks a grandchild, prints its pid, and waits.
GRANDCHILD = ["sh", "-c", "sleep 30 & echo $!; sleep 30"]


def procown(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """Run procown to completion (bounded), capturing its output."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([*PROCOWN, *args], capture_output=True, timeout=WAIT, check=False, **kwargs)


@contextmanager
def started(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """Start procown with piped output; end it whatever happens to the test."""
    proc = subprocess.Popen(
        [*PROCOWN, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # procown tears its command down
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


class LineReader:
    """Read lines from a pipe with a deadline, without buffering past them."""

    def __init__(self, pipe: Any) -> None:
        self.fd = pipe.fileno()
        self.pending = b""

    def readline(self, timeout: float = WAIT) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no complete line within {timeout}s (got {self.pending!r})")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                data = os.read(self.fd, 65536)
                if not data:
                    pytest.fail(f"end of output before a complete line (got {self.pending!r})")
                self.pending += data
        line, _, self.pending = self.pending.partition(b"\n")
        return line + b"\n"


def gone(pid: int) -> bool:
    """True when `pid` no longer runs (absent, or a zombie left for its reaper)."""
    return not alive(pid)


def error_line(stderr: bytes) -> str:
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def receipt_keys() -> set[str]:
    return set(Receipt("exited", 0, "process-group", False, True, "complete").to_dict())


# -- exit statuses ---------------------------------------------------------------


def test_exit_status_is_the_commands_own() -> None:
    """A command that exits by itself gives procown its exit status."""
    done = procown("run", "--", *py("import sys; sys.exit(3)"))
    assert done.returncode == 3, done.stderr


def test_command_killed_by_a_signal_gives_128_plus_n() -> None:
    """A command killed by signal N outside our teardown gives 128+N."""
    done = procown("run", "--", *py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert done.returncode == 128 + signal.SIGKILL, done.stderr


def test_timeout_gives_124_and_ends_the_forked_grandchild(tmp_path: Path) -> None:
    """--timeout gives 124 and the teardown also ends a grandchild the shell forked."""
    receipt_path = tmp_path / "receipt.json"
    done = procown("run", "--timeout", "0.5", "--receipt", str(receipt_path), "--", *GRANDCHILD)
    assert done.returncode == 124, done.stderr
    grandchild = int(done.stdout.split()[0])
    assert gone(grandchild)
    receipt = json.loads(receipt_path.read_text())
    assert receipt["cause"] == "timed_out"
    assert receipt["domain_empty"] is True


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("30", 30.0),
        ("2.5", 2.5),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        ("0", 0.0),
    ],
)
def test_durations_take_gnu_timeouts_units(given: str, seconds: float) -> None:
    """--timeout, --grace and --kill-wait take a number of seconds or, as GNU timeout, one with a unit."""
    from trio_procown._cli import build_parser

    args = build_parser().parse_args(
        ["run", "--timeout", given, "--grace", given, "--kill-wait", given, "--", "true"]
    )
    assert (args.timeout, args.grace, args.kill_wait) == (seconds, seconds, seconds)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["run", "--bogus", "--", "true"], id="unknown-option"),
        pytest.param(["run", "--timeout", "soon", "--", "true"], id="bad-number"),
        pytest.param(["run", "--timeout", "5x", "--", "true"], id="bad-unit"),
        pytest.param(["run", "--timeout", "m", "--", "true"], id="unit-alone"),
        pytest.param(["run", "--grace", "-1", "--", "true"], id="negative"),
        pytest.param(["run", "--domain", "jail", "--", "true"], id="bad-choice"),
        pytest.param(["run", "--max-output", "lots", "--", "true"], id="bad-size"),
        pytest.param(["run"], id="no-command"),
        pytest.param([], id="no-subcommand"),
        pytest.param(["run", "--cwd", "/nonexistent/procown", "--", "true"], id="bad-cwd"),
        pytest.param(["run", "--receipt", "/nonexistent/procown/r.json", "--", "true"], id="bad-receipt"),
    ],
)
def test_error_of_procown_itself_gives_125_and_one_line(args: list[str]) -> None:
    """A bad invocation prints one `procown: error: ...` line and exits 125."""
    done = procown(*args)
    assert done.returncode == 125
    assert error_line(done.stderr).startswith("procown: error: ")
    assert done.stdout == b""


def test_unavailable_domain_gives_125() -> None:
    """Asking for a domain this machine cannot offer is an error of procown: 125."""
    env = {**os.environ, "TRIO_PROCOWN_CGROUP_ROOT": "/nonexistent/procown"}
    done = procown("run", "--domain", "cgroup", "--", "true", env=env)
    assert done.returncode == 125
    assert "cgroup domain is unavailable" in error_line(done.stderr)


def test_command_that_cannot_be_run_gives_126(tmp_path: Path) -> None:
    """A command found but not executable gives 126, with nothing run."""
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    done = procown("run", "--", str(script))
    assert done.returncode == 126
    assert error_line(done.stderr).startswith("procown: cannot run ")
    assert done.stdout == b""


def test_a_program_whose_exec_fails_gives_126(tmp_path: Path) -> None:
    """A program found whose exec fails for a reason other than ENOENT (here "Text file
    busy": it is open for writing) cannot be run: 126, with the reason, not procown's own
    failure (125)."""
    program = tmp_path / "busy"
    shutil.copy("/bin/true", program)
    program.chmod(0o755)
    writer = os.open(program, os.O_WRONLY)
    try:
        done = procown("run", "--", str(program))
    finally:
        os.close(writer)
    assert done.returncode == 126, done.stderr
    assert error_line(done.stderr) == f"procown: cannot run {str(program)!r}: Text file busy"


def test_file_in_no_executable_format_runs_as_a_shell_script(tmp_path: Path) -> None:
    """An executable file with no #! line (ENOEXEC) is run by /bin/sh with its arguments, as
    execvp runs it for GNU timeout and env, found on PATH as execvp finds it; its status is the
    script's own."""
    script = tmp_path / "no-shebang"
    script.write_text('echo "ran $1"\nexit 3\n')
    script.chmod(0o755)
    done = procown("run", "--", str(script), "with-arg")
    assert (done.returncode, done.stdout) == (3, b"ran with-arg\n"), done.stderr
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    done = procown("run", "--", "no-shebang", "on-path", env=dict(os.environ, PATH=path))
    assert (done.returncode, done.stdout) == (3, b"ran on-path\n"), done.stderr


def test_command_not_found_gives_127() -> None:
    """A command that does not exist gives 127."""
    done = procown("run", "--", "procown-no-such-command-here")
    assert done.returncode == 127
    assert "procown-no-such-command-here" in error_line(done.stderr)


# -- signals to procown -----------------------------------------------------------


@pytest.mark.parametrize("domain", ["auto", "process-group"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_to_procown_tears_down_then_exits_128_plus_n(
    tmp_path: Path, sig: signal.Signals, domain: str
) -> None:
    """SIGINT/SIGTERM/SIGHUP to procown mid-run tear the whole command down, then 128+N."""
    receipt_path = tmp_path / "receipt.json"
    with started("run", "--domain", domain, "--receipt", str(receipt_path), "--", *GRANDCHILD) as proc:
        grandchild = int(LineReader(proc.stdout).readline())
        proc.send_signal(sig)
        assert proc.wait(timeout=WAIT) == 128 + sig
    assert gone(grandchild)
    receipt = json.loads(receipt_path.read_text())
    assert receipt["cause"] == "cancelled"
    assert receipt["domain_empty"] is True


# Survives SIGTERM, saying so on stdout (one write per signal); only SIGKILL ends it.
STUBBORN = py(
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: os.write(1, b'term\\n'))\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


def test_second_sigint_neither_skips_nor_lengthens_the_teardown(tmp_path: Path) -> None:
    """A second Ctrl-C during the teardown keeps its grace and kill bounds, no more."""
    receipt_path = tmp_path / "receipt.json"
    grace, kill_wait = 1.0, 1.0
    args = ["--grace", str(grace), "--kill-wait", str(kill_wait), "--receipt", str(receipt_path)]
    with started("run", *args, "--", *STUBBORN) as proc:
        out = LineReader(proc.stdout)
        assert out.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        assert out.readline() == b"term\n"  # the teardown has begun
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT) == 128 + signal.SIGINT
    receipt = json.loads(receipt_path.read_text())
    assert receipt["cause"] == "cancelled"
    assert receipt["forced"] is True
    assert receipt["domain_empty"] is True
    signals = [s for s in receipt["steps"] if s["action"] == "signal"]
    assert "SIGTERM" in signals[0]["detail"]
    assert "SIGKILL" in signals[-1]["detail"]
    # Not skipped: SIGKILL only after the full grace period...
    assert signals[-1]["at"] - signals[0]["at"] >= grace - 0.05
    # ...and not lengthened: the teardown stayed within its budgets.
    assert receipt["duration"] - signals[0]["at"] < grace + kill_wait + 0.5 + 1.0


def test_signal_during_the_timeouts_teardown_keeps_124(tmp_path: Path) -> None:
    """A signal that arrives while the timeout's teardown runs changes neither it nor the 124."""
    receipt_path = tmp_path / "receipt.json"
    args = ["--timeout", "0.5", "--grace", "0.5", "--receipt", str(receipt_path)]
    with started("run", *args, "--", *STUBBORN) as proc:
        out = LineReader(proc.stdout)
        assert out.readline() == b"ready\n"
        assert out.readline() == b"term\n"  # the timeout's teardown has begun
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 124
    receipt = json.loads(receipt_path.read_text())
    assert (receipt["cause"], receipt["forced"], receipt["domain_empty"]) == ("timed_out", True, True)


@pytest.mark.timeout(60)
def test_broken_output_pipe_reaches_the_command_and_exits_141(tmp_path: Path) -> None:
    """`procown run -- yes | head -1`: when procown's reader goes away, procown
    stops reading at once, `yes` sees the broken pipe itself and dies of
    SIGPIPE (nothing tears it down), and procown exits 141 as a shell expects."""
    receipt_path = tmp_path / "receipt.json"
    with started("run", "--receipt", str(receipt_path), "--", "yes") as proc:
        assert LineReader(proc.stdout).readline() == b"y\n"
        assert proc.stdout is not None
        proc.stdout.close()  # as `head -1` does
        assert proc.wait(timeout=WAIT) == 128 + signal.SIGPIPE
    receipt = json.loads(receipt_path.read_text())
    assert (receipt["cause"], receipt["returncode"]) == ("exited", -signal.SIGPIPE)
    assert [s for s in receipt["steps"] if s["action"] == "signal"] == []  # not torn down
    assert receipt["domain_empty"] is True


def test_command_that_handles_the_broken_pipe_sees_it() -> None:
    """A command that handles EPIPE itself (Python ignores SIGPIPE) gets it on
    its next write, as without procown, and goes on; procown still exits 141."""
    code = (
        "import os, sys, time\n"
        "try:\n"
        "    while True:\n"
        "        print('y', flush=True)\n"
        "        time.sleep(0.01)\n"
        "except BrokenPipeError:\n"
        "    os.write(2, b'saw the broken pipe\\n')\n"
        "    os._exit(0)\n"
    )
    with started("run", "--", *py(code)) as proc:
        LineReader(proc.stdout).readline()
        assert proc.stdout is not None
        proc.stdout.close()
        assert proc.wait(timeout=WAIT) == 128 + signal.SIGPIPE
        assert proc.stderr is not None
        assert proc.stderr.read() == b"saw the broken pipe\n"


# -- output and receipts ----------------------------------------------------------


def test_output_streams_live_and_stays_apart() -> None:
    """Lines reach procown's stdout and stderr, each its own, while the command still runs."""
    code = (
        "import sys, time\n"
        "print('to stdout', flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\n"
        "time.sleep(30)\n"
    )
    with started("run", "--", *py(code)) as proc:
        assert LineReader(proc.stdout).readline(timeout=10) == b"to stdout\n"
        assert LineReader(proc.stderr).readline(timeout=10) == b"to stderr\n"
        assert proc.poll() is None  # the command has not ended
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 128 + signal.SIGTERM


def test_large_output_passes_through_whole() -> None:
    """Output much larger than a pipe arrives byte for byte when procown's reader keeps up."""
    size = 20 << 20
    done = procown("run", "--", *py(f"import sys; sys.stdout.buffer.write(b'x' * {size})"))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) == size


def test_slow_reader_gets_every_byte() -> None:
    """A reader slower than the command gets every byte: the command is held back, nothing is skipped."""
    code = "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 8192)\n"
    got = bytearray()
    with started("run", "--max-output", "64K", "--", *py(code)) as proc:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(16384):
            got += chunk
            time.sleep(0.002)  # a slow reader (the point of the test)
        proc.wait(timeout=WAIT)
    assert proc.returncode == 0
    assert bytes(got) == bytes(range(256)) * 8192


def test_stdin_is_passed_to_the_command() -> None:
    """procown's stdin reaches the command."""
    done = procown("run", "--", "cat", input=b"piped in\n", stdin=None)
    assert (done.returncode, done.stdout) == (0, b"piped in\n")


def test_stdin_keeps_the_callers_file_offset(tmp_path: Path) -> None:
    """As under GNU timeout, the command inherits procown's stdin: it reads on from the shared offset."""
    path = tmp_path / "in.txt"
    path.write_bytes(b"abcdef")
    script = f"{{ head -c 3 >/dev/null; {shlex.join(PROCOWN)} run -- cat; }} < {shlex.quote(str(path))}"
    done = subprocess.run(["sh", "-c", script], capture_output=True, timeout=WAIT, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"def", b"")


def test_open_fds_above_2_are_passed_to_the_command(tmp_path: Path) -> None:
    """As a shell's command (and GNU timeout's) would, the command inherits
    procown's open descriptors above 2: `3<file` reaches it."""
    (tmp_path / "in.txt").write_bytes(b"from fd 3\n")
    script = f"{shlex.join(PROCOWN)} run -- sh -c 'cat <&3' 3< {shlex.quote(str(tmp_path / 'in.txt'))}"
    done = subprocess.run(["sh", "-c", script], capture_output=True, timeout=WAIT, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"from fd 3\n", b"")


def test_closed_stdin_gives_the_command_dev_null() -> None:
    """With procown's fd 0 closed, the command reads /dev/null (end-of-file at once)."""
    script = f'exec 0<&-; exec {shlex.join(PROCOWN)} run -- sh -c "cat; echo status \\$?"'
    done = subprocess.run(["sh", "-c", script], capture_output=True, timeout=WAIT, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"status 0\n", b"")


def test_receipt_file_is_the_librarys_json(tmp_path: Path) -> None:
    """--receipt FILE writes JSON with exactly the keys of Receipt.to_dict()."""
    receipt_path = tmp_path / "receipt.json"
    done = procown("run", "--receipt", str(receipt_path), "--", *py("print('hi')"))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"hi\n", b"")
    receipt = json.loads(receipt_path.read_text())
    assert set(receipt) == receipt_keys()
    assert receipt["cause"] == "exited"
    assert receipt["returncode"] == 0
    assert receipt["output"] == "complete"


def test_receipt_dash_json_goes_to_stderr() -> None:
    """--receipt - --json prints the JSON receipt on stderr after the command's output."""
    done = procown("run", "--receipt", "-", "--json", "--", *py("print('hi')"))
    assert (done.returncode, done.stdout) == (0, b"hi\n")
    receipt = json.loads(done.stderr)
    assert set(receipt) == receipt_keys()
    assert receipt["cause"] == "exited"


def test_receipt_dash_prints_the_summary() -> None:
    """--receipt - prints the receipt's short human summary on stderr."""
    done = procown("run", "--timeout", "0.3", "--receipt", "-", "--", *py("import time; time.sleep(30)"))
    assert done.returncode == 124
    text = done.stderr.decode()
    assert text.startswith("cause=timed_out ")
    assert "reached its own timeout" in text


# -- help, doctor, demo -----------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["run"], ["doctor"], ["demo"]], ids=lambda a: " ".join(a) or "top")
def test_help_reads_well(args: Sequence[str]) -> None:
    """`--help` works for procown and every subcommand, and documents the exit statuses."""
    done = procown(*args, "--help")
    assert done.returncode == 0
    text = done.stdout.decode()
    assert text.startswith(f"usage: procown {' '.join(args)}".rstrip())
    if args in ([], ["run"]):
        for status in ("124", "125", "126", "127", "128+N"):
            assert status in text


def test_doctor_names_the_domains_and_the_choice() -> None:
    """`procown doctor` lists each domain and says what auto picks."""
    done = procown("doctor")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "cgroup" in text
    assert "process-group" in text
    assert "auto picks: " in text
    from trio_procown import _cgroup

    root = _cgroup.default_root()
    if (
        root is not None
        and _cgroup.unavailable_reason(root) is None
        and _cgroup.spawns_into(os.path.realpath(root))
    ):
        assert "cgroup spawn cost (measured now" in text  # the cost of this machine, measured


def test_demo_runs_and_every_receipt_holds() -> None:
    """`procown demo` runs its four scenarios and each receipt says what it should."""
    started_at = time.monotonic()
    done = procown("demo")
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    text = done.stdout.decode()
    assert "4 of 4 receipts as expected" in text
    for cause in ("cause=exited", "cause=timed_out", "forced=True", "cause=cancelled"):
        assert cause in text
    assert time.monotonic() - started_at < 8
