# The teardown's decisions, as data.
#
# Theory of operation. One owned command goes through these states:
#
#   RUNNING ──leader exited──▶ CHECKING ──nothing left──────────────▶ DRAINING
#      │                          │
#      │ stop(cause)              └──members left──┐
#      ▼                                           ▼
#   TERMINATING (SIGTERM+SIGCONT sent; wait ≤ grace) ──empty──────▶ DRAINING
#      │ grace expired
#      ▼
#   KILLING (SIGKILL sent, forced; wait ≤ kill_wait) ──empty / expired──▶ DRAINING
#
#   DRAINING (wait ≤ drain_wait for EOF) ──eof / expired (abandon)──▶ REAPING ──▶ DONE
#
# Every state that waits has a budget, so the time from leaving RUNNING to
# DONE is at most grace + kill_wait + drain_wait plus the cost of the actions
# themselves. The machine does no I/O: the driver (_command.py) asks it for
# the next action, performs it, and feeds back what it observed. Like h11's
# state machine, an event that is not legal in the current state raises
# IllegalTransition and changes nothing, so a driver bug cannot silently skip
# a stage of the teardown.

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._receipt import Cause, OutputState


class State(enum.Enum):
    RUNNING = "running"
    CHECKING = "checking"
    TERMINATING = "terminating"
    KILLING = "killing"
    DRAINING = "draining"
    REAPING = "reaping"
    DONE = "done"


class Event(enum.Enum):
    LEADER_EXITED = "leader exited"
    STOP = "stop"  # carries a cause: timed_out, cancelled, error or stopped
    EMPTY = "empty"  # nothing owned is alive
    NOT_EMPTY = "not empty"  # a check found owned processes alive
    EXPIRED = "expired"  # the current wait's budget ran out
    EOF = "eof"  # every captured stream reached end of file
    REAPED = "reaped"


class Do(enum.Enum):
    """What the driver must do next."""

    WAIT_FOR_EXIT_OR_STOP = "wait for the leader to exit or a stop request"
    CHECK_DOMAIN = "check the domain for members that outlived the leader"
    SIGNAL_GRACEFUL = "send SIGTERM and SIGCONT, then wait up to grace"
    SIGNAL_FORCE = "send SIGKILL, then wait up to kill_wait"
    WAIT_DRAIN = "wait up to drain_wait for end of output"
    ABANDON_DRAIN = "close the read ends; the output is abandoned"
    REAP = "reap the leader and record the receipt"
    NOTHING = "nothing: the teardown is over"


class IllegalTransition(RuntimeError):
    """An event arrived that the current state does not accept."""


@dataclass(frozen=True, slots=True)
class Budgets:
    grace: float
    kill_wait: float
    drain_wait: float

    @property
    def total(self) -> float:
        return self.grace + self.kill_wait + self.drain_wait


# (state, event) -> (next state, action to perform on entering it)
_TRANSITIONS: dict[tuple[State, Event], tuple[State, Do]] = {
    (State.RUNNING, Event.LEADER_EXITED): (State.CHECKING, Do.CHECK_DOMAIN),
    (State.RUNNING, Event.STOP): (State.TERMINATING, Do.SIGNAL_GRACEFUL),
    (State.CHECKING, Event.EMPTY): (State.DRAINING, Do.WAIT_DRAIN),
    (State.CHECKING, Event.NOT_EMPTY): (State.TERMINATING, Do.SIGNAL_GRACEFUL),
    (State.TERMINATING, Event.EMPTY): (State.DRAINING, Do.WAIT_DRAIN),
    (State.TERMINATING, Event.EXPIRED): (State.KILLING, Do.SIGNAL_FORCE),
    (State.KILLING, Event.EMPTY): (State.DRAINING, Do.WAIT_DRAIN),
    (State.KILLING, Event.EXPIRED): (State.DRAINING, Do.WAIT_DRAIN),
    (State.DRAINING, Event.EOF): (State.REAPING, Do.REAP),
    (State.DRAINING, Event.EXPIRED): (State.REAPING, Do.ABANDON_DRAIN),
    (State.REAPING, Event.REAPED): (State.DONE, Do.NOTHING),
}


class Escalation:
    """The pure teardown state machine of one owned command.

    Synopsis::

        machine = Escalation(Budgets(grace=2, kill_wait=1, drain_wait=0.5))
        machine.handle(Event.STOP, cause="timed_out")   # -> Do.SIGNAL_GRACEFUL
        machine.handle(Event.EXPIRED)                   # -> Do.SIGNAL_FORCE
        machine.forced                                  # True
    """

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets
        self.state = State.RUNNING
        self.cause: Cause | None = None
        self.forced = False
        self.domain_empty: bool | None = None
        self.output: OutputState | None = None
        self.leftovers = False  # members outlived a leader that exited by itself

    @property
    def next_action(self) -> Do:
        return {
            State.RUNNING: Do.WAIT_FOR_EXIT_OR_STOP,
            State.CHECKING: Do.CHECK_DOMAIN,
            State.TERMINATING: Do.SIGNAL_GRACEFUL,
            State.KILLING: Do.SIGNAL_FORCE,
            State.DRAINING: Do.WAIT_DRAIN,
            State.REAPING: Do.REAP,
            State.DONE: Do.NOTHING,
        }[self.state]

    def budget(self) -> float:
        """How long the current state may wait."""
        return {
            State.TERMINATING: self.budgets.grace,
            State.KILLING: self.budgets.kill_wait,
            State.DRAINING: self.budgets.drain_wait,
        }.get(self.state, 0.0)

    def handle(self, event: Event, *, cause: Cause | None = None) -> Do:
        """Apply `event`; return the action the driver must perform next."""
        key = (self.state, event)
        if key not in _TRANSITIONS:
            msg = f"event {event.value!r} is not allowed in state {self.state.value!r}"
            raise IllegalTransition(msg)
        if event is Event.STOP:
            if cause not in ("timed_out", "cancelled", "error", "stopped"):
                msg = f"a stop needs a cause of timed_out, cancelled, error or stopped, not {cause!r}"
                raise IllegalTransition(msg)
        elif cause is not None:
            msg = f"only a stop carries a cause, not {event.value!r}"
            raise IllegalTransition(msg)

        new_state, action = _TRANSITIONS[key]
        if event is Event.STOP:
            self.cause = cause
        elif event is Event.LEADER_EXITED:
            self.cause = "exited"
        if self.state is State.CHECKING and event is Event.NOT_EMPTY:
            self.leftovers = True
        if event is Event.EMPTY:
            self.domain_empty = True
        if self.state is State.KILLING and event is Event.EXPIRED:
            self.domain_empty = False
        if new_state is State.KILLING:
            self.forced = True
        if self.state is State.DRAINING:
            self.output = "complete" if event is Event.EOF else "abandoned"
        self.state = new_state
        return action
