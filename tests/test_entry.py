"""The console scripts' entry points: signals that come before procown can relay them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from conftest import MARKER
from trio_procown import _entry

WAIT = 60  # seconds: the bound of every subprocess here (a hang fails, never stalls)


def test_held_signals_are_noted_then_given_back() -> None:
    """While held, the early signals are only noted; release() gives them back their
    dispositions and returns each noted signal once, in the order it first came."""
    before = {signum: signal.getsignal(signum) for signum in _entry.EARLY}
    _entry.hold()
    try:
        for signum in (signal.SIGHUP, signal.SIGALRM, signal.SIGHUP):
            signal.raise_signal(signum)
    finally:
        noted = _entry.release()
    assert noted == [signal.SIGHUP, signal.SIGALRM]
    assert {signum: signal.getsignal(signum) for signum in _entry.EARLY} == before
    assert _entry.release() == []


def _early(signum: int, entry: str, args: list[str]) -> list[str]:
    """A fresh interpreter that gets `signum` before main() runs, as a console script
    that receives it during its imports, then runs `entry`'s main with `args`."""
    code = (
        "import os, sys\n"
        "from trio_procown import _entry\n"
        "_entry.hold()\n"
        f"os.kill(os.getpid(), {int(signum)})\n"
        f"from trio_procown.{entry} import main\n"
        "from trio_procown._exit import run_and_exit\n"
        f"sys.argv[1:] = {args!r}\n"
        "run_and_exit(main)\n"
    )
    return [sys.executable, "-c", code, MARKER]


def _started(tmp_path: Path) -> tuple[Path, list[str]]:
    """A command that leaves a mark as it starts, then sleeps (tagged for the survivor check)."""
    mark = tmp_path / "started"
    return mark, ["sh", "-c", f'touch "{mark}"; exec sleep 30', MARKER]


def _receipt(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@pytest.mark.timeout(WAIT * 2)
def test_timeout_relays_an_alarm_that_came_during_start_up(tmp_path: Path) -> None:
    """SIGALRM before procown timeout could relay it means time is up, as it would for GNU
    timeout (whose command is already running by then): the command is started and torn
    down with the timeout's signal, and the status is 124."""
    _mark, command = _started(tmp_path)
    receipt = tmp_path / "receipt.json"
    args = ["--receipt", str(receipt), "30", *command]
    done = subprocess.run(
        _early(signal.SIGALRM, "_timeout", args), capture_output=True, timeout=WAIT, check=False
    )
    assert done.returncode == 124, done.stderr
    assert done.stderr == b""
    seen = _receipt(receipt)
    assert seen["cause"] == "timed_out"
    assert ["SIGTERM", "SIGCONT"] in [step["signals"] for step in seen["steps"] if step["action"] == "signal"]


@pytest.mark.timeout(WAIT * 2)
def test_timeout_relays_an_interrupt_that_came_during_start_up(tmp_path: Path) -> None:
    """SIGINT before procown timeout could relay it reaches the command once it runs, and
    procown dies of SIGINT as the command did (GNU's status), with no Python traceback."""
    _mark, command = _started(tmp_path)
    receipt = tmp_path / "receipt.json"
    args = ["--receipt", str(receipt), "30", *command]
    done = subprocess.run(
        _early(signal.SIGINT, "_timeout", args), capture_output=True, timeout=WAIT, check=False
    )
    assert done.returncode == -signal.SIGINT, done.stderr
    assert done.stderr == b""
    seen = _receipt(receipt)
    assert seen["cause"] == "cancelled"
    assert seen["returncode"] == -signal.SIGINT
    assert ["SIGINT", "SIGCONT"] in [step["signals"] for step in seen["steps"] if step["action"] == "signal"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-s", "USR1", "5", "cmd"], signal.SIGUSR1),
        (["-vsusr2", "5", "cmd"], signal.SIGUSR2),
        (["--sig=10", "5", "cmd"], 10),
        (["-k", "1", "--signal", "SIGHUP", "5", "cmd"], signal.SIGHUP),
        (["5", "-s", "USR1"], None),  # after the duration: the command's own argument
        (["-s", "KILL", "5"], None),  # not catchable
        (["-s", "RTMIN+1", "5"], None),  # left to the parser
        (["-s"], None),
    ],
)
def test_the_timeout_signal_is_read_before_the_parser(args: list[str], expected: int | None) -> None:
    """timeout's -s signal, read from argv as GNU's getopt reads it (options before the
    duration, abbreviations, clusters), so that it is held during start-up too."""
    assert _entry.timeout_signal(args) == expected


@pytest.mark.timeout(WAIT * 2)
def test_timeout_relays_its_own_signal_that_came_during_start_up(tmp_path: Path) -> None:
    """With -s USR1, a SIGUSR1 that came during start-up is relayed once the command
    runs, as GNU timeout (which handles its -s signal) would have: the command dies of
    it, and so does procown, without a traceback."""
    _mark, command = _started(tmp_path)
    receipt = tmp_path / "receipt.json"
    args = ["-s", "USR1", "--receipt", str(receipt), "30", *command]
    code = (
        "import os, sys\n"
        "from trio_procown import _entry\n"
        f"sys.argv[1:] = {args!r}\n"
        "_entry.hold(_entry.timeout_signal(sys.argv[1:]))\n"  # as the procown-timeout script
        f"os.kill(os.getpid(), {int(signal.SIGUSR1)})\n"
        "from trio_procown._timeout import main\n"
        "from trio_procown._exit import run_and_exit\n"
        "run_and_exit(main)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, MARKER], capture_output=True, timeout=WAIT, check=False
    )
    assert done.returncode == -signal.SIGUSR1, done.stderr
    assert done.stderr == b""
    seen = _receipt(receipt)
    assert seen["returncode"] == -signal.SIGUSR1
    assert ["SIGUSR1", "SIGCONT"] in [step["signals"] for step in seen["steps"] if step["action"] == "signal"]


@pytest.mark.timeout(WAIT * 2)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_run_ends_on_a_signal_that_came_during_start_up(tmp_path: Path, signum: int) -> None:
    """`procown run` given a stop signal before it could relay it starts nothing and exits
    128+N, without a Python traceback."""
    mark, command = _started(tmp_path)
    done = subprocess.run(
        _early(signum, "_cli", ["run", "--", *command]), capture_output=True, timeout=WAIT, check=False
    )
    assert done.returncode == 128 + signum, done.stderr
    assert done.stderr == b""
    assert not mark.exists()


@pytest.mark.timeout(WAIT * 2)
def test_run_dies_of_an_unhandled_signal_that_came_during_start_up(tmp_path: Path) -> None:
    """A signal `procown run` does not handle (SIGALRM) that came during start-up acts by its
    own disposition once held no more, as it would have at once: procown dies of it, having
    started nothing."""
    mark, command = _started(tmp_path)
    done = subprocess.run(
        _early(signal.SIGALRM, "_cli", ["run", "--", *command]),
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == -signal.SIGALRM, done.stderr
    assert not mark.exists()


def test_console_scripts_go_through_the_entry_points() -> None:
    """The installed console scripts are the entry points that hold the early signals."""
    scripts = {
        ep.name: ep.value
        for ep in entry_points(group="console_scripts")
        if ep.value.startswith("trio_procown")
    }
    assert scripts == {
        "procown": "trio_procown._entry:procown",
        "procown-timeout": "trio_procown._entry:procown_timeout",
    }
