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
# INLINE_MAX under way) the heap as it is then is frozen: gc.freeze() moves
# it to the permanent generation, which collections skip; everything
# allocated since is collected as usual. When the last teardown of the burst
# ends it is unfrozen (gc.unfreeze()), and the collector sees the whole heap
# again. The freeze is bounded: held for FREEZE_MAX it is released at the
# next teardown to start or end, and not taken again until the process has
# had no teardown under way (a service that always has a few hundred in
# flight does not keep its old heap out of reach for good). A program that
# froze its own heap (gc.get_freeze_count() > 0 before we froze: a pre-fork
# server, say) is left alone: we then neither freeze nor unfreeze.
#
# The count spans every trio run of the process (one per thread, say), so it
# is kept under a lock.

from __future__ import annotations

import gc
import os
import threading
import time

# At most this many teardowns under way: signals go from the loop (see above).
INLINE_MAX = 8
# The longest a burst keeps the old heap frozen (seconds): a few times the
# default teardown bound (grace 2 + kill_wait 1 + drain_wait 0.5 s).
FREEZE_MAX = 10.0

_lock = threading.Lock()
_active = 0  # teardowns under way, in every trio run of the process
_frozen_at: float | None = None  # time.monotonic() of our gc.freeze(), while it holds
_spent = False  # this busy period already held a freeze for FREEZE_MAX


def under_way() -> int:
    """How many teardowns are under way in this process."""
    return _active


def enter() -> None:
    """A teardown begins."""
    global _active, _frozen_at
    with _lock:
        _active += 1
        _expire()
        if _active > INLINE_MAX and _frozen_at is None and not _spent and gc.get_freeze_count() == 0:
            gc.freeze()
            _frozen_at = time.monotonic()


def leave() -> None:
    """A teardown ended (however it ended)."""
    global _active, _spent
    with _lock:
        _active -= 1
        _expire()
        if _active <= 0:
            _active = 0
            _spent = False
            _thaw()


def frozen() -> bool:
    """Is the heap frozen by a burst of teardowns now?"""
    return _frozen_at is not None


def _expire() -> None:
    global _spent
    if _frozen_at is not None and time.monotonic() - _frozen_at >= FREEZE_MAX:
        _spent = True
        _thaw()


def _thaw() -> None:
    global _frozen_at
    if _frozen_at is not None:
        _frozen_at = None
        gc.unfreeze()


def after_fork() -> None:
    # A forked child runs none of the parent's teardowns: it starts with
    # none under way, and a heap we froze for them is thawed in it.
    global _active, _spent, _lock
    _lock = threading.Lock()
    _active = 0
    _spent = False
    _thaw()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=after_fork)
