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
    assert (m.cause, m.forced, m.domain_empty, m.output) == ("exited", False, True, "complete")
    assert m.leftovers is False


def test_leftovers_after_exit_get_the_full_ladder() -> None:
    """Members that outlive the leader are terminated, and marked as leftovers."""
    m = Escalation(BUDGETS)
    m.handle(Event.LEADER_EXITED)
    assert m.handle(Event.NOT_EMPTY) is Do.SIGNAL_GRACEFUL
    assert m.budget() == 2.0
    assert m.cause == "exited"
    assert m.leftovers is True


def test_timeout_that_needs_force() -> None:
    """Grace expiring leads to SIGKILL and forced=True; kill_wait expiring means not proven empty."""
    m = Escalation(BUDGETS)
    assert m.handle(Event.STOP, cause="timed_out") is Do.SIGNAL_GRACEFUL
    assert m.handle(Event.EXPIRED) is Do.SIGNAL_FORCE
    assert m.forced is True
    assert m.budget() == 1.0
    assert m.handle(Event.EXPIRED) is Do.WAIT_DRAIN
    assert m.domain_empty is False
    assert m.handle(Event.EXPIRED) is Do.ABANDON_DRAIN
    assert m.output == "abandoned"
    assert m.state is State.REAPING


def test_graceful_success_is_not_forced() -> None:
    """An empty domain within the grace never reaches SIGKILL."""
    m = Escalation(BUDGETS)
    m.handle(Event.STOP, cause="cancelled")
    assert m.handle(Event.EMPTY) is Do.WAIT_DRAIN
    assert m.forced is False
    assert m.domain_empty is True
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
    before = (m.state, m.cause, m.forced, m.domain_empty, m.output)
    with pytest.raises(IllegalTransition):
        m.handle(event, cause="error" if event is Event.STOP else None)
    assert (m.state, m.cause, m.forced, m.domain_empty, m.output) == before


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
