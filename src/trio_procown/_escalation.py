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
#   any state of the teardown ──deadline (the loop was starved past the
#   teardown's own bound)──▶ REAPING: SIGKILL now unless already forced, a
#   last short wait, then the receipt from what is seen.
#
# The machine also holds the escapee policy: whether processes the census
# finds outside the domain get the ladder ("terminate") or are only listed
# ("report"). A check that finds only escapees counts as empty under
# "report".
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
import signal
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:  # annotations only
    from ._receipt import Cause, OutputState

EscapeePolicy = Literal["terminate", "report"]


_TERM_THEN_CONT: tuple[int, ...] = (int(signal.SIGTERM), signal.SIGCONT)


def graceful_signals(first: int) -> tuple[int, ...]:
    """The first stage's signals: `first`, then SIGCONT so a stopped member
    can act on it. Signal 0 sends nothing (GNU timeout's ``-s 0``); an
    unknown signal number raises ValueError."""
    if isinstance(first, bool) or not isinstance(first, int):
        msg = f"first_signal must be a signal number, not {first!r}"
        raise TypeError(msg)
    if first == 0:
        return ()
    if first == signal.SIGTERM:
        return _TERM_THEN_CONT  # the default: no enum lookup
    try:
        sig = int(signal.Signals(first))
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
        if low is None or high is None or not low <= first <= high:  # real-time signals are unnamed
            msg = f"first_signal: {first!r} is not a signal on this platform"
            raise ValueError(msg) from None
        sig = first
    return (sig,) if sig == signal.SIGCONT else (sig, signal.SIGCONT)


# The machine's enums hash by identity (each member is a singleton, and
# equality is identity already): Enum's own __hash__ is a Python function,
# called for each dict lookup of a transition (16 calls per command).


class State(enum.Enum):
    __hash__ = object.__hash__

    RUNNING = "running"
    CHECKING = "checking"
    TERMINATING = "terminating"
    KILLING = "killing"
    DRAINING = "draining"
    REAPING = "reaping"
    DONE = "done"


class Event(enum.Enum):
    __hash__ = object.__hash__

    LEADER_EXITED = "leader exited"
    STOP = "stop"  # carries a cause: timed_out, cancelled, error or stopped
    EMPTY = "empty"  # nothing owned is alive
    NOT_EMPTY = "not empty"  # a check found owned processes alive in the domain
    ESCAPEES = "escapees"  # a check found only escapees alive (the policy decides)
    EXPIRED = "expired"  # the current wait's budget ran out
    EOF = "eof"  # every captured stream reached end of file
    ABANDONED = "abandoned"  # the read ends were closed after drain_wait
    REAPED = "reaped"
    DEADLINE = "deadline"  # the teardown's own deadline passed before it finished


class Do(enum.Enum):
    """What the driver must do next."""

    __hash__ = object.__hash__

    WAIT_FOR_EXIT_OR_STOP = "wait for the leader to exit or a stop request"
    CHECK_DOMAIN = "check the domain for members that outlived the leader"
    SIGNAL_GRACEFUL = "send SIGTERM and SIGCONT, then wait up to grace"
    SIGNAL_FORCE = "send SIGKILL, then wait up to kill_wait"
    WAIT_DRAIN = "wait up to drain_wait for end of output"
    ABANDON_DRAIN = "close the read ends; the output is abandoned"
    REAP = "reap the leader and record the receipt"
    FORCE_AND_REAP = "send SIGKILL now, wait briefly, then reap and record the receipt"
    NOTHING = "nothing: the teardown is over"


class IllegalTransition(RuntimeError):
    """An event arrived that the current state does not accept."""


class Budgets(NamedTuple):
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
    (State.REAPING, Event.ABANDONED): (State.REAPING, Do.REAP),
    (State.REAPING, Event.REAPED): (State.DONE, Do.NOTHING),
    # A starved teardown: whatever it was doing, force (if it has not) and finish.
    **{
        (state, Event.DEADLINE): (State.REAPING, Do.FORCE_AND_REAP)
        for state in (State.CHECKING, State.TERMINATING, State.KILLING, State.DRAINING, State.REAPING)
    },
}


# What the driver does on entering each state, and which budget bounds the
# states that wait.
_ACTION_OF: dict[State, Do] = {
    State.RUNNING: Do.WAIT_FOR_EXIT_OR_STOP,
    State.CHECKING: Do.CHECK_DOMAIN,
    State.TERMINATING: Do.SIGNAL_GRACEFUL,
    State.KILLING: Do.SIGNAL_FORCE,
    State.DRAINING: Do.WAIT_DRAIN,
    State.REAPING: Do.REAP,
    State.DONE: Do.NOTHING,
}
_BUDGET_OF: dict[State, str] = {
    State.TERMINATING: "grace",
    State.KILLING: "kill_wait",
    State.DRAINING: "drain_wait",
}


class Escalation:
    """The pure teardown state machine of one owned command.

    Synopsis::

        machine = Escalation(Budgets(grace=2, kill_wait=1, drain_wait=0.5), escapees="terminate")
        machine.handle(Event.STOP, cause="timed_out")   # -> Do.SIGNAL_GRACEFUL
        machine.handle(Event.EXPIRED)                   # -> Do.SIGNAL_FORCE
        machine.forced                                  # True
    """

    def __init__(
        self, budgets: Budgets, escapees: EscapeePolicy = "terminate", first_signal: int = signal.SIGTERM
    ) -> None:
        if escapees not in ("terminate", "report"):
            msg = f"escapees must be 'terminate' or 'report', not {escapees!r}"
            raise ValueError(msg)
        self.graceful = graceful_signals(first_signal)
        self.budgets = budgets
        self.escapees: EscapeePolicy = escapees
        self.state = State.RUNNING
        self.cause: Cause | None = None
        self.forced = False
        self.output: OutputState | None = None

    @property
    def signals_escapees(self) -> bool:
        """Do escapees get the ladder (policy "terminate"), or only a listing?"""
        return self.escapees == "terminate"

    @property
    def next_action(self) -> Do:
        return _ACTION_OF[self.state]

    def budget(self) -> float:
        """How long the current state may wait (its budget's field name is
        in _BUDGET_OF; states that do not wait have none)."""
        field = _BUDGET_OF.get(self.state)
        return 0.0 if field is None else float(getattr(self.budgets, field))

    def handle(self, event: Event, *, cause: Cause | None = None) -> Do:
        """Apply `event`; return the action the driver must perform next."""
        if event is Event.ESCAPEES and self.state is State.CHECKING:
            event = Event.NOT_EMPTY if self.signals_escapees else Event.EMPTY
        transition = _TRANSITIONS.get((self.state, event))
        if transition is None:
            msg = f"event {event.value!r} is not allowed in state {self.state.value!r}"
            raise IllegalTransition(msg)
        if event is Event.STOP:
            if cause not in ("timed_out", "cancelled", "error", "stopped"):
                msg = f"a stop needs a cause of timed_out, cancelled, error or stopped, not {cause!r}"
                raise IllegalTransition(msg)
        elif cause is not None:
            msg = f"only a stop carries a cause, not {event.value!r}"
            raise IllegalTransition(msg)

        new_state, action = transition
        if event is Event.STOP:
            self.cause = cause
        elif event is Event.LEADER_EXITED:
            self.cause = "exited"
        if action is Do.FORCE_AND_REAP and self.forced:
            action = Do.REAP  # SIGKILL was sent already: just finish
        if new_state is State.KILLING or action is Do.FORCE_AND_REAP:
            self.forced = True
        if self.state is State.DRAINING and event in (Event.EOF, Event.EXPIRED):
            self.output = "complete" if event is Event.EOF else "abandoned"
        self.state = new_state
        return action
