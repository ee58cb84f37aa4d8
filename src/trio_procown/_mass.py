# Mass teardown: how many teardowns are under way in this process, and what
# changes when there are many.
#
# A teardown among a few (at most INLINE_MAX under way) signals its domain
# from the event loop itself: the thread handoff of _signaller.py would cost
# a lone command about a millisecond of its deadline-to-return. Above that
# (a mass cancel) the signaller thread sends the signals.
#
# Python's cyclic garbage collector. When thousands of commands are torn
# down together, what their teardowns allocate (process tables of 10,000
# rows, steps, receipts) survives into the oldest generation, and each full
# collection then walks the whole heap: measured with 2,000 cgroup commands
# cancelled together, three gen-2 collections of 170-290 ms inside the
# teardown, each a stall of the loop of that length and together a quarter
# of the time the teardowns had. So when a burst begins (more than
# INLINE_MAX under way, or asked for: see below) the heap as it is then is
# frozen: gc.freeze() moves it to the permanent generation, which
# collections skip. While the freeze holds, each teardown that begins or
# ends freezes again what has survived since (gc.freeze() is a splice of
# lists, not a walk, with the GIL; see _REFREEZE): CPython collects the
# oldest generation whenever it has grown by a quarter since the last full
# collection, and after a freeze a quarter of almost nothing comes soon
# (measured with a single freeze: full collections of ~100 ms in the burst,
# over what the teardowns had allocated). Garbage made during the burst is
# still freed by reference counting; cycles among it wait for the thaw. When
# the last teardown of the burst ends it is unfrozen (gc.unfreeze()), and
# the collector sees the whole heap again. The freeze is bounded: held for
# FREEZE_MAX it is released at the next teardown to start or end, and not
# taken again until the process has had no teardown under way (a service
# that always has a few hundred in flight does not keep its old heap out of
# reach for good). A program that froze its own heap (gc.get_freeze_count()
# > 0 before we froze: a pre-fork server, say) is left alone: we then
# neither freeze nor unfreeze. That is asked once per busy period, not per
# teardown: gc.get_freeze_count() counts the frozen heap object by object
# (CPython walks the list), so with the heap of a program holding 500 live
# commands frozen, asking it at each of the 500 stops and 500 teardowns
# held the loop for 4-9 s (measured).
#
# A stop is counted from when it is asked for (requested()), before its
# teardown's task gets to run: when 2,000 blocks are cancelled together,
# their owners' exits all run in one batch of the loop and allocate enough
# to set off a full collection there, before a single teardown has begun
# (measured: a 153 ms gen-2 collection in that batch). A requested stop
# counts towards the freeze only: signals are sent inline or by the thread
# according to the teardowns actually under way.
#
# Pacing. A mass cancel wakes every teardown in one batch of the loop (the
# cancel reaches them all at once; the signaller thread's reports wake the
# waiters of many actions at once), and each then runs a step of ~0.3 ms
# before its next checkpoint: 2,000 of them held the loop for 0.4-0.7 s,
# and every other task of the program waited that long. So in a burst a
# teardown takes its turn (pace()) before such a step: the turns are handed
# out PACE_CHUNK per batch of the loop by one system task of the run, in the
# order they were asked for. A turn is waited for inside the teardown's
# bound (its deadline, counted from the stop request, still holds). Beyond
# WAKE_CHUNK stops, a stop request's own wakeup of its teardown (a cancel
# of a scope, ~15 us) is put off to the same pump (wake_soon), WAKE_CHUNK
# per batch: in the cancel's batch, 2,000 of them were 30 ms of it. Smaller
# chunks, and turns for the woken teardowns and the drains, cut the stall
# further but started the teardowns so spread out that their census
# missed the shared scan, and up to a fifth of them forced after their
# grace (docs/chaos.md, "Turns", has the figures).
#
# A crowd. A program with hundreds of live commands holds their objects
# (~29 KiB each: receipts' steps, drains, scopes) in the oldest generation,
# and every full collection walks them, while they run and when they are
# cancelled together: with 2,000 live cgroup commands, a 173 ms gen-2
# collection inside trio's own cancel delivery, before a single stop was
# asked for (measured). So when the live commands of the process first
# reach CROWD_MIN, the heap is frozen as it is then, and frozen again each
# time the crowd reaches a new height a quarter above the last freeze (a
# splice, as above). The freeze holds while the crowd does: it is released
# when the crowd falls below CROWD_MIN / 2, or when a burst that began
# inside it ends (the burst's garbage is released then; the crowd freezes
# again only once it grows a quarter above its size then). What a crowd
# freeze can hold back is bounded by size, not time: the cycles that were
# garbage at the moments of its freezes (at most one per quarter of growth,
# each at a new height), never garbage made later, which the collector
# still sees. A program that froze its own heap is left alone here too.
#
# The counts span every trio run of the process (one per thread, say), so
# they are kept under a lock.

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable

import trio

from . import _FROZEN_AT_IMPORT

# At most this many teardowns under way: signals go from the loop (see above).
INLINE_MAX = 8
# In a burst, how many teardowns pace() lets go on per batch of the loop.
PACE_CHUNK = 32
# Beyond this many stops under way or asked for, their wakeups go this many
# per batch of the loop (wake_soon).
WAKE_CHUNK = 96
# The longest a burst keeps the old heap frozen (seconds): a few times the
# default teardown bound (grace 2 + kill_wait 1 + drain_wait 0.5 s).
FREEZE_MAX = 10.0
# Live commands in the process at which the heap is frozen for the crowd.
CROWD_MIN = 256

_lock = threading.Lock()
_active = 0  # teardowns under way, in every trio run of the process
_asked = 0  # stops requested whose teardown has not begun yet
_frozen_at: float | None = None  # time.monotonic() of our gc.freeze(), while it holds
_spent = False  # this busy period already held a freeze for FREEZE_MAX
_foreign: bool | None = None  # the program froze its own heap (asked once per busy period)
_live: weakref.WeakSet[object] = weakref.WeakSet()  # the live commands' teardowns (born, not gone)
_crowd_frozen = False  # the heap is frozen for the crowd (see above)
_crowd_next = CROWD_MIN  # the crowd's size at which it is frozen (again)


def under_way() -> int:
    """How many teardowns are under way in this process."""
    return _active


def expected() -> int:
    """Teardowns under way plus stops asked for whose teardown has not begun."""
    return _active + _asked


def in_burst() -> bool:
    """Are more than INLINE_MAX teardowns under way or about to begin?"""
    return _active + _asked > INLINE_MAX


def live() -> int:
    """How many commands of this process are live (spawned, their teardown not over)."""
    return len(_live)


def born(teardown: object) -> None:
    """A command is live and set up (its owner calls this from the
    supervisor's first step, once the command's nursery, tasks and scopes
    exist, so that a freeze at this height holds them); `teardown` is its
    teardown, which calls gone() once it is over (one that never runs is
    forgotten when collected). Counting twice is harmless."""
    global _crowd_frozen, _crowd_next
    with _lock:
        _live.add(teardown)
        size = len(_live)
        if size < _crowd_next or not _REFREEZE:
            return
        _crowd_next = size + size // 4
        if _crowd_frozen or _frozen_at is not None:
            gc.freeze()  # what the crowd grew by joins the frozen heap
            _crowd_frozen = True
        else:
            _crowd_frozen = _freeze_unless_foreign()


def gone(teardown: object) -> None:
    """The teardown of a command born() is over."""
    global _crowd_frozen, _crowd_next, _foreign
    with _lock:
        _live.discard(teardown)
        if _crowd_frozen and _frozen_at is None and len(_live) < CROWD_MIN // 2:
            _release()
            _crowd_next = CROWD_MIN
            _foreign = None


def requested() -> None:
    """A stop was asked for; its teardown will begin with enter(asked=True)."""
    global _asked
    with _lock:
        _asked += 1
        _expire()
        _maybe_freeze()


def enter(*, asked: bool = False) -> None:
    """A teardown begins (`asked`: its stop was counted by requested())."""
    global _active, _asked
    with _lock:
        _active += 1
        if asked:
            _asked = max(0, _asked - 1)
        if _frozen_at is not None or _active + _asked > INLINE_MAX:  # (else both are no-ops)
            _expire()
            _maybe_freeze()


# Where gc.freeze() is a splice of lists (CPython with the GIL), a burst
# freezes again what survived (see above); on a free-threaded build it
# stops the world and walks the heap, so there the first freeze is the only one.
# (The build's ABI flags say which: "t" is free-threaded.)
_REFREEZE = "t" not in getattr(sys, "abiflags", "")


def _maybe_freeze() -> None:
    global _frozen_at
    if _frozen_at is not None:
        if _REFREEZE:
            gc.freeze()  # what survived since the last one joins the frozen heap
    elif _active + _asked > INLINE_MAX and not _spent:
        if _crowd_frozen:  # ours already: the burst holds it from now
            gc.freeze()
            _frozen_at = time.monotonic()
        elif _freeze_unless_foreign():
            _frozen_at = time.monotonic()


# CPython 3.12's collector itself moves the interpreter's immortal objects
# into the permanent generation (its update_refs() does so for each one it
# meets: 375 tuples on 3.12.1, there from start-up on, and back after each
# full collection following a gc.unfreeze()), so there the freeze count is
# never 0 and a burst would always take the heap for the program's. What
# was frozen when the package was first imported (trio_procown's
# __init__) is counted as the interpreter's: a program that freezes its heap
# later (a pre-fork server, after its imports) is seen, as elsewhere; one
# that froze it before importing us is taken for the interpreter, and its
# freeze ends with our burst's (a cost of memory shared with its forks,
# never of correctness). Other versions start with none frozen, and there
# anything frozen is the program's.
_INTERPRETERS = _FROZEN_AT_IMPORT


def _freeze_unless_foreign() -> bool:
    """gc.freeze(), unless the program froze its heap itself; True if frozen.
    Called only while we hold no freeze: the program is asked once per busy
    period (gc.get_freeze_count() walks the frozen heap)."""
    global _foreign
    if _foreign is None:
        _foreign = gc.get_freeze_count() > _INTERPRETERS
    if _foreign:
        return False
    gc.freeze()
    return True


def leave() -> None:
    """A teardown ended (however it ended)."""
    global _active, _asked, _spent, _foreign
    with _lock:
        _active -= 1
        if _frozen_at is not None:
            _expire()
        if _frozen_at is not None and _active > 0 and _REFREEZE:
            gc.freeze()
        if _active <= 0:
            # Idle: asks not begun yet are forgotten too (one whose teardown
            # never ran must not count for ever; the others, still to
            # begin, enter() again from zero).
            _active = 0
            _asked = 0
            _spent = False
            _thaw()
            _foreign = None  # the program may freeze (or thaw) its heap before the next burst


def frozen() -> bool:
    """Is the heap frozen by a burst of teardowns or a crowd of commands now?"""
    return _frozen_at is not None or _crowd_frozen


def _expire() -> None:
    global _spent
    if _frozen_at is not None and time.monotonic() - _frozen_at >= FREEZE_MAX:
        _spent = True
        _thaw()


def _thaw() -> None:
    """The burst's freeze ends (and with it a crowd's it held)."""
    global _crowd_next
    if _frozen_at is None:
        return
    if _crowd_frozen:
        size = len(_live)
        _crowd_next = max(CROWD_MIN, size + size // 4)
    _release()


def _release() -> None:
    """Unfreeze what we froze, for a burst or for a crowd."""
    global _frozen_at, _crowd_frozen
    if _frozen_at is not None or _crowd_frozen:
        gc.unfreeze()
    _frozen_at = None
    _crowd_frozen = False


class _Turns:
    """The turns of one trio run: a queue, the wakeups put off (wake_soon),
    and the system task that, per batch of the loop, makes WAKE_CHUNK of
    the wakeups and lets PACE_CHUNK of the queue go on, while there are any."""

    def __init__(self) -> None:
        self.queue = trio.lowlevel.ParkingLot()
        self.wakes: collections.deque[Callable[[], object]] = collections.deque()
        self.pumping = False

    async def pump(self) -> None:
        # Shielded: when the run ends, trio cancels its system tasks, and
        # teardowns still running then (background commands, say) must go on
        # getting their turns. The pump runs only while someone waits, and
        # each waiter's own deadline bounds that.
        try:
            with trio.CancelScope(shield=True):
                while self.queue or self.wakes:
                    for _ in range(min(WAKE_CHUNK, len(self.wakes))):
                        self.wakes.popleft()()
                    self.queue.unpark(count=PACE_CHUNK)
                    await trio.lowlevel.checkpoint()
        finally:
            self.pumping = False
            while self.wakes:
                self.wakes.popleft()()
            self.queue.unpark_all()


_TURNS: trio.lowlevel.RunVar[_Turns] = trio.lowlevel.RunVar("trio_procown_turns")


def _turns() -> _Turns | None:
    """This run's turns, their pump running; None if the run is ending."""
    try:
        turns = _TURNS.get()
    except LookupError:
        turns = _Turns()
        _TURNS.set(turns)
    if not turns.pumping:
        try:
            trio.lowlevel.spawn_system_task(turns.pump, name="trio_procown teardown turns")
        except RuntimeError:
            return None
        turns.pumping = True
    return turns


async def pace() -> None:
    """In a burst (more than INLINE_MAX teardowns under way), wait for this
    teardown's turn (see above); otherwise return at once, without a
    checkpoint."""
    if _active <= INLINE_MAX:
        return
    turns = _turns()
    if turns is None:
        return  # the run is ending: nobody to hand out turns, go on
    await turns.queue.park()


def wake_soon(wake: Callable[[], object]) -> None:
    """Call `wake` (a stop's wakeup of its teardown's task) now or, with
    more than WAKE_CHUNK stops under way or asked for, from the pump,
    WAKE_CHUNK per batch of the loop: a mass cancel reaches every block in
    one batch, and waking each teardown there (a cancel of its scope,
    ~15 us) added 2,000 of them to that batch. A few commands stopped
    together behave as before (each wakes in the stop's own batch)."""
    turns = _turns() if _active + _asked > WAKE_CHUNK else None
    if turns is None:
        wake()
    else:
        turns.wakes.append(wake)


def after_fork() -> None:
    # A forked child runs none of the parent's teardowns: it starts with
    # none under way, and a heap we froze for them is thawed in it.
    global _active, _asked, _spent, _lock, _foreign, _live, _crowd_next
    _lock = threading.Lock()
    _active = 0
    _asked = 0
    _spent = False
    _foreign = None
    _live = weakref.WeakSet()
    _release()
    _crowd_next = CROWD_MIN


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=after_fork)
