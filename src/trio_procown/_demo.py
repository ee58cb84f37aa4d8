# `procown demo`: four small owned commands and their receipts.
#
# The scenarios are one table: each names a command, how it is run (its own
# options, or an outer trio.move_on_after that cancels the block), and the
# facts its receipt must show. One loop runs them in order, prints each
# receipt with its checks, and the demo exits 0 only when every check held.
# A stop signal (SIGINT, SIGTERM, SIGHUP) cancels the demo; the command
# running then is torn down first, as under `procown run`, and the demo
# exits 128+N.

from __future__ import annotations

import math
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ._cli import EXIT_PROCOWN, SIGNAL_BASE, STOP_SIGNALS, Stopper, exit_status
from ._command import OwnedCommand, OwnedOptions, open_owned_command
from ._procfs import read_stat
from ._receipt import Receipt

Checks = Callable[[OwnedCommand, Receipt], dict[str, bool]]


@dataclass(frozen=True)
class Scenario:
    """One demonstration: a command, how it is run, what its receipt must say."""

    heading: str
    shown: str  # the command as a user would type it
    command: str | list[str]
    options: OwnedOptions
    checks: Checks  # name -> held, from the run and its receipt
    cancel_after: float = math.inf  # an outer trio.move_on_after, not a timeout of its own


def _gone(pid: int) -> bool:
    """True when `pid` no longer runs (absent, or a zombie awaiting its reaper)."""
    info = read_stat(pid)
    return info is None or info.zombie


def _grandchild_checks(run: OwnedCommand, receipt: Receipt) -> dict[str, bool]:
    words = run.stdout.split()  # b"started PID"
    grandchild = int(words[1]) if len(words) == 2 and words[1].isdigit() else None
    return {
        "cause timed_out": receipt.cause == "timed_out",
        "domain empty": receipt.domain_empty,
        f"grandchild (pid {grandchild}) terminated": grandchild is not None and _gone(grandchild),
    }


GRANDCHILD = "sleep 30 & echo started $!; sleep 30"
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ignoring SIGTERM', flush=True)\n"
    "time.sleep(30)\n"
)
EARLY = "import time\nprint('early output', flush=True)\ntime.sleep(30)\n"

SCENARIOS = (
    Scenario(
        "1. A natural exit",
        "echo hello",
        ["echo", "hello"],
        {},
        lambda run, r: {"cause exited": r.cause == "exited", "status 0": r.returncode == 0},
    ),
    Scenario(
        "2. A timeout that also ends the grandchild the shell forked",
        f"procown run --timeout 1 -- sh -c '{GRANDCHILD}'",
        GRANDCHILD,
        {"timeout": 1},
        _grandchild_checks,
    ),
    Scenario(
        "3. A command that ignores SIGTERM: SIGKILL after the grace period",
        "procown run --timeout 1 --grace 0.5 -- python -c '<ignore SIGTERM; sleep 30>'",
        [sys.executable, "-c", STUBBORN],
        {"timeout": 1, "grace": 0.5},
        lambda run, r: {"forced": r.forced, "killed by SIGKILL": r.returncode == -signal.SIGKILL},
    ),
    Scenario(
        "4. An outer cancel (trio.move_on_after(1), no timeout of its own): output kept",
        "python -c '<print early output; sleep 30>'",
        [sys.executable, "-c", EARLY],
        {},
        lambda run, r: {
            "cause cancelled": r.cause == "cancelled",
            "early output kept": run.stdout == b"early output\n",
        },
        cancel_after=1,
    ),
)


def _show(scenario: Scenario, run: OwnedCommand) -> bool:
    """Print one scenario's output, receipt and checks; True if all held."""
    receipt = run.receipt
    assert receipt is not None
    print(f"\n== {scenario.heading}")
    print(f"$ {scenario.shown}")
    for name, data in (("stdout", run.stdout), ("stderr", run.stderr)):
        if data:
            print(f"{name}: {data.decode(errors='replace')!r}")
    if receipt.cause != "cancelled":
        print(f"(`procown run` would exit with status {exit_status(receipt)})")
    print(receipt.summary())
    checks = scenario.checks(run, receipt)
    failed = [name for name, held in checks.items() if not held]
    if failed:
        print(f"UNEXPECTED: {', '.join(failed)}")
    else:
        print(f"ok: {', '.join(checks)}")
    sys.stdout.flush()
    return not failed


async def demo() -> int:
    """`procown demo`: run every scenario; 0 when every receipt holds."""
    passed = 0
    for scenario in SCENARIOS:
        with trio.move_on_after(scenario.cancel_after):
            async with open_owned_command(scenario.command, **scenario.options) as run:
                await run.wait()
        passed += _show(scenario, run)
    print(f"\n{passed} of {len(SCENARIOS)} receipts as expected.")
    return 0 if passed == len(SCENARIOS) else 1


async def _stoppable_demo() -> int:
    """The demo, ended (after the teardown of what it runs) by a stop signal."""
    stopper = Stopper()
    status = EXIT_PROCOWN
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stopper.watch, signals)
            with trio.CancelScope() as scope:
                stopper.scope = scope
                status = await demo()
            nursery.cancel_scope.cancel()
    if scope.cancelled_caught and stopper.signum is not None:
        print(f"\ninterrupted by {signal.Signals(stopper.signum).name}", flush=True)
        return SIGNAL_BASE + stopper.signum
    return status


def run_demo() -> int:
    """Run `procown demo`; return its exit status."""
    return trio.run(_stoppable_demo)
