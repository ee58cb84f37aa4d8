"""Teardown time: a teardown's bounds are real seconds whatever the run's clock (_clock.py)."""

from __future__ import annotations

import signal
import time

import pytest
import trio
import trio.testing

import trio_procown
from conftest import MARKER, py
from helpers import domains
from trio_procown import _clock
from trio_procown._choice import DomainName

DOMAINS = domains()

# Ignores SIGTERM, says so, then sleeps: only the KILL stage ends it.
TERM_IGNORER = py(
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)
GRACE = 0.3


async def _cancel_once_ready(domain: DomainName) -> trio_procown.Receipt:
    """Run TERM_IGNORER, cancel its block from outside once it is ready; the receipt."""
    runs: list[trio_procown.OwnedCommand] = []
    async with trio.open_nursery() as nursery:

        async def body() -> None:
            async with trio_procown.open_owned_command(
                TERM_IGNORER, domain=domain, grace=GRACE, kill_wait=1.0, drain_wait=1.0
            ) as run:
                runs.append(run)
                async for _line in run.lines():
                    break
                nursery.cancel_scope.cancel()
                await run.wait()

        nursery.start_soon(body)
    receipt = runs[0].receipt
    assert receipt is not None
    return receipt


def _assert_killed_within_real_bounds(receipt: trio_procown.Receipt) -> None:
    assert (receipt.cause, receipt.returncode, receipt.forced) == ("cancelled", -signal.SIGKILL, True)
    assert (receipt.domain_empty, receipt.output, receipt.unreaped) == (True, "complete", ())
    waits = {s.detail: s for s in receipt.steps if s.action is trio_procown.Action.WAIT}
    grace = waits[f"budget {GRACE:g}s (grace)"]
    kill_wait = waits["budget 1s (kill_wait)"]
    signalled = next(s for s in receipt.steps if s.action is trio_procown.Action.SIGNAL)
    assert grace.outcome == "expired"
    assert kill_wait.outcome == "empty"  # SIGKILL had real time to land
    # The grace was given in real seconds: the receipt's times are real.
    assert grace.at - signalled.at >= GRACE


@pytest.mark.parametrize("domain", DOMAINS)
async def test_autojump_clock_gives_the_grace_in_real_time(
    domain: DomainName, autojump_clock: trio.testing.MockClock
) -> None:
    """Under pytest-trio's autojump_clock (the run's time leaps whenever
    every task waits), the grace and the kill stage's wait are still real
    seconds: the SIGKILL lands, the leader is reaped, the domain is proven
    empty. Before, the grace expired at once and the receipt said not empty,
    the leader unreaped and the output abandoned."""
    began = time.monotonic()
    receipt = await _cancel_once_ready(domain)
    _assert_killed_within_real_bounds(receipt)
    assert time.monotonic() - began >= GRACE


@pytest.mark.parametrize("domain", DOMAINS)
async def test_a_clock_that_stands_still_does_not_hold_the_teardown(
    domain: DomainName, mock_clock: trio.testing.MockClock
) -> None:
    """Under a MockClock that nobody moves, a teardown still ends within its
    real bound: before, the grace never expired and the block waited forever
    for a command that ignores SIGTERM."""
    before = trio.current_time()
    receipt = await _cancel_once_ready(domain)
    _assert_killed_within_real_bounds(receipt)
    assert trio.current_time() == before  # the run's clock did not move


async def test_the_callers_timeout_stays_on_the_runs_clock(autojump_clock: trio.testing.MockClock) -> None:
    """The command's own `timeout` is the caller's deadline, on the run's
    clock like trio.move_on_after: under autojump it passes as soon as
    everything waits, and the teardown that follows is real."""
    before = trio.current_time()
    result = await trio_procown.run_owned(["sh", "-c", "sleep 30; :", MARKER], timeout=1000)
    assert result.receipt.cause == "timed_out"
    assert result.returncode == -signal.SIGTERM
    assert trio.current_time() - before >= 1000


async def test_a_bound_under_the_system_clock_is_a_plain_deadline() -> None:
    """Under trio's own clock a bound is the cancel scope's deadline, and
    teardown time is the run's time: nothing else runs."""
    assert _clock.is_real()
    deadline = trio.current_time() + 5
    assert _clock.scope(deadline).deadline == deadline
    assert _clock.now_function() == trio.lowlevel.current_clock().current_time


async def test_a_bound_under_a_test_clock_ends_at_the_real_instant(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Under a test's clock a bound has no trio deadline (the clock could
    jump over it or never reach it) and is cancelled at its real instant."""
    assert not _clock.is_real()
    with _clock.after(0.05) as bound:
        assert bound.deadline == float("inf")
        await trio.sleep_forever()
    assert bound.cancelled_caught
    already = _clock.scope(_clock.now() - 1)
    assert already.cancel_called  # a bound already past is cancelled at once
