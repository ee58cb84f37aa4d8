"""The teardown state machine, without processes."""

from __future__ import annotations

import pytest

from trio_procown._escalation import Budgets, Do, Escalation, Event, IllegalTransition, State

BUDGETS = Budgets(grace=2.0, kill_wait=1.0, drain_wait=0.5)


def test_natural_exit_with_empty_domain_signals_nothing() -> None:
    """A leader that exits alone with nothing left goes straight to the drain."""
    m = Escalation(BUDGETS)
    assert m.next_action is Do.WAIT_FOR_EXIT_OR_STOP
    assert m.handle(Event.LEADER_EXITED) is Do.CHECK_DOMAIN
    assert m.handle(Event.EMPTY) is Do.WAIT_DRAIN
    assert m.budget() == 0.5
    assert m.handle(Event.EOF) is Do.REAP
    assert m.handle(Event.REAPED) is Do.NOTHING
    assert (m.cause, m.forced, m.output) == ("exited", False, "complete")


def test_leftovers_after_exit_get_the_full_ladder() -> None:
    """Members that outlive the leader get the full ladder."""
    m = Escalation(BUDGETS)
    m.handle(Event.LEADER_EXITED)
    assert m.handle(Event.NOT_EMPTY) is Do.SIGNAL_GRACEFUL
    assert m.budget() == 2.0
    assert m.cause == "exited"


def test_timeout_that_needs_force() -> None:
    """Grace expiring leads to SIGKILL and forced=True; then the drain, abandoned when it expires."""
    m = Escalation(BUDGETS)
    assert m.handle(Event.STOP, cause="timed_out") is Do.SIGNAL_GRACEFUL
    assert m.handle(Event.EXPIRED) is Do.SIGNAL_FORCE
    assert m.forced is True
    assert m.budget() == 1.0
    assert m.handle(Event.EXPIRED) is Do.WAIT_DRAIN
    assert m.handle(Event.EXPIRED) is Do.ABANDON_DRAIN
    assert m.output == "abandoned"
    assert m.state is State.REAPING
    assert m.handle(Event.ABANDONED) is Do.REAP
    assert m.handle(Event.REAPED) is Do.NOTHING


def test_graceful_success_is_not_forced() -> None:
    """An empty domain within the grace never reaches SIGKILL."""
    m = Escalation(BUDGETS)
    m.handle(Event.STOP, cause="cancelled")
    assert m.handle(Event.EMPTY) is Do.WAIT_DRAIN
    assert m.forced is False
    assert m.cause == "cancelled"


@pytest.mark.parametrize(
    ("setup", "event"),
    [
        ([], Event.EOF),
        ([], Event.EXPIRED),
        ([(Event.LEADER_EXITED, None)], Event.LEADER_EXITED),
        ([(Event.STOP, "error")], Event.STOP),
        ([(Event.STOP, "error"), (Event.EMPTY, None)], Event.EMPTY),
    ],
)
def test_illegal_event_raises_and_changes_nothing(
    setup: list[tuple[Event, str | None]], event: Event
) -> None:
    """An event the current state does not accept raises and leaves the state as it was."""
    m = Escalation(BUDGETS)
    for ev, cause in setup:
        m.handle(ev, cause=cause)  # type: ignore[arg-type]
    before = (m.state, m.cause, m.forced, m.output)
    with pytest.raises(IllegalTransition):
        m.handle(event, cause="error" if event is Event.STOP else None)
    assert (m.state, m.cause, m.forced, m.output) == before


def test_stop_needs_a_valid_cause() -> None:
    """A stop without a cause (or with "exited") is refused."""
    m = Escalation(BUDGETS)
    with pytest.raises(IllegalTransition):
        m.handle(Event.STOP)
    with pytest.raises(IllegalTransition):
        m.handle(Event.STOP, cause="exited")
    assert m.state is State.RUNNING


def test_budget_total_bounds_the_teardown() -> None:
    """The sum of the budgets is the teardown's bound."""
    assert BUDGETS.total == pytest.approx(3.5)


@pytest.mark.parametrize(
    ("policy", "expected"), [("terminate", Do.SIGNAL_GRACEFUL), ("report", Do.WAIT_DRAIN)]
)
def test_escapee_policy_decides_a_check_that_found_only_escapees(policy: str, expected: Do) -> None:
    """Only escapees left after the leader exited: the ladder under "terminate", none under "report"."""
    m = Escalation(BUDGETS, escapees=policy)  # type: ignore[arg-type]
    m.handle(Event.LEADER_EXITED)
    assert m.signals_escapees is (policy == "terminate")
    assert m.handle(Event.ESCAPEES) is expected


def test_unknown_escapee_policy_is_refused() -> None:
    """A policy other than terminate/report raises ValueError."""
    with pytest.raises(ValueError, match="escapees"):
        Escalation(BUDGETS, escapees="ignore")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setup", "forced_before"),
    [
        ([(Event.STOP, "timed_out")], False),
        ([(Event.LEADER_EXITED, None)], False),
        ([(Event.STOP, "cancelled"), (Event.EXPIRED, None)], True),
        ([(Event.STOP, "cancelled"), (Event.EMPTY, None)], False),
    ],
)
def test_a_starved_teardown_forces_once_then_finishes(
    setup: list[tuple[Event, str | None]], forced_before: bool
) -> None:
    """The teardown's own deadline: SIGKILL now unless it was already sent, then reap; forced is set."""
    m = Escalation(BUDGETS)
    for ev, cause in setup:
        m.handle(ev, cause=cause)  # type: ignore[arg-type]
    assert m.forced is forced_before
    expected = Do.REAP if forced_before else Do.FORCE_AND_REAP
    assert m.handle(Event.DEADLINE) is expected
    assert m.forced is True
    assert m.state is State.REAPING
    assert m.handle(Event.REAPED) is Do.NOTHING


def test_deadline_is_not_an_event_of_a_running_command() -> None:
    """Before any teardown there is no teardown deadline to pass."""
    with pytest.raises(IllegalTransition):
        Escalation(BUDGETS).handle(Event.DEADLINE)
