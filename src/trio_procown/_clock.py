# Teardown time: the clock a teardown's bounds are kept on.
#
# A teardown's bounds (grace, kill_wait, drain_wait, the allowance, the
# polls and rechecks inside them) are promises about real processes: a
# command gets `grace` real seconds to clean up, and the block returns
# within the sum, real seconds too. Under trio's own clock (SystemClock,
# the default) trio time is real time, and the bounds are plain cancel
# scope deadlines, as they always were. A test's clock is not real time:
# under trio.testing.MockClock the run's time stands still until the test
# moves it (a TERM-ignoring command's teardown then waited forever), and
# with autojump (pytest-trio's `autojump_clock`) it leaps to the next
# deadline whenever every task waits, so a grace expired at once in real
# time, the SIGKILL got no time to land, and the receipt said the domain
# was not empty, the leader unreaped, the output abandoned (measured:
# "kill_wait -> expired" at +1.0 s of mock time, 0.09 s of real time).
#
# So under any other clock, teardown time is the monotonic clock
# (time.perf_counter) and a bound is a cancel scope without a deadline
# that a timer thread of ours cancels at the real instant: the mock clock
# may jump over it, but cannot end it early or hold it back. The command's
# own `timeout` stays the caller's, on the run's clock (it is the caller's
# deadline, like trio.move_on_after), and so do the readiness timeouts of
# services. Under the system clock nothing of this runs: one type check
# per bound.

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Callable

import trio

try:
    from trio._core._run import SystemClock as _SystemClock
except ImportError:  # pragma: no cover - trio moved it: every clock is then taken as a test's
    _SystemClock = None  # type: ignore[assignment,misc]

# How long the timer thread stays with nothing to time before it ends.
TIMER_IDLE_EXIT = 5.0


def is_real() -> bool:
    """Is the run's clock real time (trio's SystemClock)?"""
    return type(trio.lowlevel.current_clock()) is _SystemClock


def now_function() -> Callable[[], float]:
    """The function that reads teardown time in this run: the run's own
    clock when it is trio's system clock, else the monotonic clock."""
    clock = trio.lowlevel.current_clock()
    if type(clock) is _SystemClock:
        return clock.current_time
    return time.perf_counter


def now() -> float:
    """Teardown time now (see now_function)."""
    clock = trio.lowlevel.current_clock()
    if type(clock) is _SystemClock:
        return clock.current_time()
    return time.perf_counter()


def at(instant: float) -> float:
    """Teardown time of `instant`, a moment of the run's clock that has
    come: itself under the system clock; under a test's clock, whose
    moments are not real ones, now."""
    if type(trio.lowlevel.current_clock()) is _SystemClock:
        return instant
    return time.perf_counter()


def scope(deadline: float, *, shield: bool = False) -> trio.CancelScope:
    """A cancel scope that is cancelled at `deadline`, teardown time: a
    plain deadline under the system clock, else the timer thread's cancel
    at that real instant (the scope's own `deadline` is then infinite)."""
    if type(trio.lowlevel.current_clock()) is _SystemClock:
        return trio.CancelScope(deadline=deadline, shield=shield)
    bound = trio.CancelScope(shield=shield)
    if deadline <= time.perf_counter():
        bound.cancel()
    elif deadline != math.inf:
        _timer().add(deadline, bound)
    return bound


def after(seconds: float, *, shield: bool = False) -> trio.CancelScope:
    """A cancel scope cancelled `seconds` from now, teardown time."""
    return scope(now() + seconds, shield=shield)


async def sleep(seconds: float) -> None:
    """Sleep `seconds` of teardown time."""
    with after(seconds):
        await trio.sleep_forever()


class _Timer:
    """One thread that cancels scopes at real instants, for every run of
    this process that uses a clock of its own."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, trio.lowlevel.TrioToken, trio.CancelScope]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline: float, bound: trio.CancelScope) -> None:
        token = trio.lowlevel.current_trio_token()
        with self._cond:
            heapq.heappush(self._due, (deadline, next(self._order), token, bound))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="trio_procown bounds", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _serve(self) -> None:
        with self._cond:
            while True:
                if not self._due:
                    self._cond.wait(TIMER_IDLE_EXIT)
                    if not self._due:
                        self._thread = None
                        return
                    continue
                left = self._due[0][0] - time.perf_counter()
                if left > 0:
                    self._cond.wait(left)
                    continue
                _deadline, _order, token, bound = heapq.heappop(self._due)
                try:
                    token.run_sync_soon(bound.cancel)
                except trio.RunFinishedError:
                    pass  # that run is over: nothing of it waits any more


_TIMER: _Timer | None = None
_TIMER_LOCK = threading.Lock()


def _timer() -> _Timer:
    global _TIMER
    with _TIMER_LOCK:
        if _TIMER is None:
            _TIMER = _Timer()
        return _TIMER


def _forget_timer() -> None:  # in a forked child: the thread is not there
    global _TIMER, _TIMER_LOCK
    _TIMER = None
    _TIMER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_timer)
