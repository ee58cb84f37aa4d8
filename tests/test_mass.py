"""The mass-teardown count and the collector's freeze (_mass.py), without processes."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterator

import pytest

from trio_procown import _mass

# CPython 3.12's collector moves the interpreter's immortal objects into the
# permanent generation (375 tuples at start-up on 3.12.1, and again at each
# full collection after a gc.unfreeze()); _mass counts what was frozen at its
# import as the interpreter's. 3.11 and 3.13 start at 0.
IMMORTALS_FROZEN = sys.version_info[:2] == (3, 12)


@pytest.fixture(autouse=True)
def _clean_slate() -> Iterator[None]:
    """Each test starts with no teardown under way and leaves the heap as it found it."""
    assert _mass.under_way() == 0
    assert not _mass.frozen()
    if IMMORTALS_FROZEN:
        gc.collect()  # an earlier test's thaw left them out until the next full collection
    before = gc.get_freeze_count()
    yield
    while _mass.under_way():
        _mass.leave()
    _mass.enter()
    _mass.leave()  # forgets asks left over by a test
    assert not _mass.frozen()
    if IMMORTALS_FROZEN:
        gc.collect()  # a test's gc.unfreeze() thawed them too: the collector puts them back
    assert gc.get_freeze_count() == before


def _burst() -> None:
    """One more teardown under way than INLINE_MAX: a burst."""
    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()


def _end_all() -> None:
    """Every teardown under way ends."""
    while _mass.under_way():
        _mass.leave()


def test_a_few_teardowns_leave_the_collector_alone() -> None:
    """Up to INLINE_MAX teardowns under way: nothing is frozen."""
    before = gc.get_freeze_count()
    for _ in range(_mass.INLINE_MAX):
        _mass.enter()
    assert not _mass.frozen()
    assert gc.get_freeze_count() == before
    assert _mass.under_way() == _mass.INLINE_MAX


def test_a_burst_freezes_the_heap_until_its_last_teardown_ends() -> None:
    """One more than INLINE_MAX freezes what exists; it is thawed when the count is back to 0."""
    keep = [object() for _ in range(10)]
    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()
    assert _mass.frozen()
    assert gc.get_freeze_count() > 0
    for _ in range(_mass.INLINE_MAX):
        _mass.leave()
        assert _mass.frozen()  # still teardowns under way
    _mass.leave()
    assert not _mass.frozen()
    assert gc.get_freeze_count() == 0
    assert len(keep) == 10


def test_the_freeze_is_released_after_freeze_max_and_not_taken_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy period that never drops to 0 holds the freeze at most FREEZE_MAX, then not again until idle."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()
    assert _mass.frozen()
    now[0] += _mass.FREEZE_MAX
    _mass.enter()  # the next teardown to start releases it
    assert not _mass.frozen()
    assert gc.get_freeze_count() == 0
    _mass.leave()
    _mass.enter()
    assert not _mass.frozen()  # spent for this busy period
    while _mass.under_way():
        _mass.leave()
    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()
    assert _mass.frozen()  # a new busy period may freeze again


def test_a_heap_the_program_froze_itself_is_left_alone() -> None:
    """With gc.get_freeze_count() > 0 already, a burst neither freezes nor unfreezes."""
    gc.freeze()
    try:
        frozen_before = gc.get_freeze_count()
        for _ in range(_mass.INLINE_MAX + 1):
            _mass.enter()
        assert not _mass.frozen()
        while _mass.under_way():
            _mass.leave()
        assert gc.get_freeze_count() == frozen_before
    finally:
        gc.unfreeze()


def test_what_was_frozen_when_mass_was_imported_is_the_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A freeze count no higher than at import (CPython 3.12's immortal objects) is not the
    program's: a burst freezes and thaws the heap as if nothing were frozen."""
    gc.freeze()  # stands for what the interpreter had frozen when _mass was imported
    try:
        monkeypatch.setattr(_mass, "_INTERPRETERS", gc.get_freeze_count())
        _burst()
        assert _mass.frozen()
        _end_all()
        assert not _mass.frozen()
        assert gc.get_freeze_count() == 0  # thawed, with what stood for the interpreter's
    finally:
        gc.unfreeze()


def test_a_heap_the_program_froze_is_asked_about_once_a_busy_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """get_freeze_count() walks the frozen heap: a burst asks it once, not at each stop and teardown."""
    asked = 0
    real = gc.get_freeze_count

    def counting() -> int:
        nonlocal asked
        asked += 1
        return real()

    gc.freeze()
    try:
        monkeypatch.setattr(gc, "get_freeze_count", counting)
        for _ in range(3 * _mass.INLINE_MAX):
            _mass.requested()
        for _ in range(3 * _mass.INLINE_MAX):
            _mass.enter(asked=True)
        assert asked == 1
        assert not _mass.frozen()
        while _mass.under_way():
            _mass.leave()
        # A new busy period asks again: the program may have thawed its heap meanwhile.
        gc.unfreeze()
        for _ in range(_mass.INLINE_MAX + 1):
            _mass.enter()
        assert asked == 2
        assert _mass.frozen()
        while _mass.under_way():
            _mass.leave()
    finally:
        gc.unfreeze()


def test_stops_asked_for_freeze_before_their_teardowns_begin() -> None:
    """A burst of requested stops freezes the heap at once (their owners' exits allocate before a
    single teardown runs); the teardowns that begin then count once each, not twice."""
    for _ in range(_mass.INLINE_MAX):
        _mass.requested()
    assert not _mass.frozen()
    _mass.requested()
    assert _mass.frozen()
    assert _mass.under_way() == 0  # asked for, not under way: signals still go from the loop
    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter(asked=True)
    assert _mass.under_way() == _mass.INLINE_MAX + 1
    while _mass.under_way():
        _mass.leave()
    assert not _mass.frozen()
    # Nothing asked is left over: one more teardown alone freezes nothing.
    _mass.enter()
    assert not _mass.frozen()
    _mass.leave()


def test_asks_whose_teardown_never_began_are_forgotten_when_idle() -> None:
    """Asks are forgotten once no teardown is under way, so a stop whose teardown never ran does
    not make later, smaller groups count as bursts."""
    for _ in range(_mass.INLINE_MAX):
        _mass.requested()
    _mass.enter()
    assert _mass.frozen()  # INLINE_MAX asked + 1 under way
    _mass.leave()
    assert not _mass.frozen()
    for _ in range(_mass.INLINE_MAX):
        _mass.enter()
    assert not _mass.frozen()


def test_leave_never_counts_below_zero() -> None:
    """An unmatched leave() (a bug elsewhere) cannot make the count negative."""
    _mass.leave()
    assert _mass.under_way() == 0


def test_a_forked_child_starts_with_no_teardown_and_a_thawed_heap() -> None:
    """A child forked during a burst counts no teardown and has nothing frozen by us."""
    import os

    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()
    assert _mass.frozen()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        ok = _mass.under_way() == 0 and not _mass.frozen() and gc.get_freeze_count() == 0
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)


# -- pacing (pace): turns in a burst ------------------------------------------------------


async def test_pace_outside_a_burst_returns_without_a_checkpoint() -> None:
    """A few teardowns under way: pace() neither waits nor checkpoints (a cancelled scope around it
    does not fire)."""
    import trio

    for _ in range(_mass.INLINE_MAX):
        _mass.enter()
    with trio.CancelScope() as scope:
        scope.cancel()
        await _mass.pace()
    assert not scope.cancelled_caught


async def test_a_burst_goes_on_pace_chunk_at_a_time_in_the_order_it_asked() -> None:
    """In a burst, at most PACE_CHUNK teardowns go on per batch of the loop, first come first
    served, and every one of them gets its turn."""
    import trio

    batches = [0]

    class Batches(trio.abc.Instrument):
        def after_io_wait(self, timeout: float) -> None:
            batches[0] += 1

    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()
    n = 3 * _mass.PACE_CHUNK + 5
    asked: list[int] = []
    went: list[tuple[int, int]] = []  # (who, batch)

    async def one(who: int) -> None:
        asked.append(who)
        await _mass.pace()
        went.append((who, batches[0]))

    trio.lowlevel.add_instrument(Batches())
    async with trio.open_nursery() as nursery:
        for who in range(n):
            nursery.start_soon(one, who)  # all ask in the same batch
    assert len(asked) == n
    assert sorted(who for who, _ in went) == list(range(n))
    batch_of = dict(went)
    in_order = [batch_of[who] for who in asked]
    assert in_order == sorted(in_order)  # first asked, first to go (within a batch, trio's order)
    per_batch: dict[int, int] = {}
    for _, batch in went:
        per_batch[batch] = per_batch.get(batch, 0) + 1
    assert max(per_batch.values()) <= _mass.PACE_CHUNK
    assert len(per_batch) >= 4


async def test_a_turn_is_waited_for_within_the_caller_s_deadline() -> None:
    """A teardown whose bound expires while it waits for its turn is cancelled there (its bound
    holds); the others still get theirs."""
    import trio

    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()
    went: list[int] = []

    async def one(who: int, deadline: float) -> None:
        with trio.move_on_at(deadline):
            await _mass.pace()
            went.append(who)

    async with trio.open_nursery() as nursery:
        now = trio.current_time()
        nursery.start_soon(one, 0, now - 1)  # already past its bound
        for who in range(1, 2 * _mass.PACE_CHUNK):
            nursery.start_soon(one, who, now + 30)
    assert sorted(went) == list(range(1, 2 * _mass.PACE_CHUNK))


def test_turns_go_on_while_the_run_ends() -> None:
    """Teardowns still running when the run ends (background commands, torn down in system tasks
    that trio cancels at the end) keep getting turns: none waits out its deadline in the queue."""
    import trio

    for _ in range(_mass.INLINE_MAX + 1):
        _mass.enter()
    outcomes: list[bool] = []  # per teardown: did its deadline expire while it took turns?

    async def teardown() -> None:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 30) as scope:
            for _ in range(3):
                await _mass.pace()
        outcomes.append(scope.cancelled_caught)

    async def main() -> None:
        for _ in range(3 * _mass.PACE_CHUNK):
            trio.lowlevel.spawn_system_task(teardown)
        # main returns at once: trio cancels the system tasks, the pump's among them

    trio.run(main)
    assert outcomes == [False] * (3 * _mass.PACE_CHUNK)


async def test_wake_soon_wakes_at_once_for_up_to_a_chunk_of_stops() -> None:
    """With up to WAKE_CHUNK stops under way or asked for (a burst among
    them), a stop's wakeup is called at once."""
    for _ in range(_mass.WAKE_CHUNK):
        _mass.requested()
    assert _mass.in_burst()
    woken: list[int] = []
    _mass.wake_soon(lambda: woken.append(1))
    assert woken == [1]


async def test_in_a_burst_wakeups_go_pace_chunk_per_batch_and_all_of_them() -> None:
    """Beyond WAKE_CHUNK stops, wakeups are put off to the pump: none in the asking batch,
    at most WAKE_CHUNK per batch after it, in the order asked, every one."""
    import trio

    batches = [0]

    class Batches(trio.abc.Instrument):
        def after_io_wait(self, timeout: float) -> None:
            batches[0] += 1

    for _ in range(_mass.WAKE_CHUNK + 1):
        _mass.requested()
    n = 2 * _mass.WAKE_CHUNK + 3
    woken: list[tuple[int, int]] = []
    trio.lowlevel.add_instrument(Batches())
    asked_in = batches[0]
    for who in range(n):

        def wake(who: int = who) -> None:
            woken.append((who, batches[0]))

        _mass.wake_soon(wake)
    assert woken == []
    with trio.fail_after(10):
        while len(woken) < n:
            await trio.sleep(0)
    assert [who for who, _ in woken] == list(range(n))
    per_batch: dict[int, int] = {}
    for _, batch in woken:
        per_batch[batch] = per_batch.get(batch, 0) + 1
    assert asked_in not in per_batch
    assert max(per_batch.values()) <= _mass.WAKE_CHUNK


def test_wakeups_put_off_are_all_made_when_the_run_ends() -> None:
    """Wakeups still queued when the run ends are made by the pump on its
    way out: no stop is left unwoken."""
    import trio

    for _ in range(_mass.WAKE_CHUNK + 1):
        _mass.requested()
    woken: list[int] = []

    async def main() -> None:
        for who in range(3 * _mass.WAKE_CHUNK):

            def wake(who: int = who) -> None:
                woken.append(who)

            _mass.wake_soon(wake)

    trio.run(main)
    assert sorted(woken) == list(range(3 * _mass.WAKE_CHUNK))


class _Command:
    """Stands for a live command's teardown (born() keeps a weak reference)."""


@pytest.fixture
def crowd() -> Iterator[list[_Command]]:
    """Live commands a test makes: each is gone() at the end, whatever the test did."""
    assert _mass.live() == 0
    members: list[_Command] = []
    yield members
    for member in members:
        _mass.gone(member)


def _grow(crowd: list[_Command], size: int) -> None:
    while len(crowd) < size:
        member = _Command()
        crowd.append(member)
        _mass.born(member)


def _shrink(crowd: list[_Command], size: int) -> None:
    while len(crowd) > size:
        _mass.gone(crowd.pop())


def test_a_crowd_of_live_commands_freezes_the_heap_while_it_lasts(
    crowd: list[_Command], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CROWD_MIN live commands freeze the heap; it is frozen again only at a new height a quarter
    above the last freeze, and released once the crowd falls below half of CROWD_MIN."""
    freezes = 0
    real = gc.freeze

    def counting() -> None:
        nonlocal freezes
        freezes += 1
        real()

    monkeypatch.setattr(gc, "freeze", counting)
    _grow(crowd, _mass.CROWD_MIN - 1)
    assert not _mass.frozen()
    assert freezes == 0
    _grow(crowd, _mass.CROWD_MIN)
    assert _mass.frozen()
    assert freezes == 1
    higher = _mass.CROWD_MIN + _mass.CROWD_MIN // 4
    _grow(crowd, higher - 1)
    assert freezes == 1
    _grow(crowd, higher)
    assert freezes == 2
    # Shrinking and growing back to the same height freezes nothing more.
    _shrink(crowd, _mass.CROWD_MIN // 2)
    _grow(crowd, higher)
    assert freezes == 2
    _shrink(crowd, _mass.CROWD_MIN // 2)
    assert _mass.frozen()
    _shrink(crowd, _mass.CROWD_MIN // 2 - 1)
    assert not _mass.frozen()


def test_a_teardown_alone_inside_a_crowd_keeps_its_freeze(crowd: list[_Command]) -> None:
    """One command of a crowd ending by itself (no burst) leaves the crowd's heap frozen."""
    _grow(crowd, _mass.CROWD_MIN)
    assert _mass.frozen()
    _mass.enter()
    _mass.leave()
    assert _mass.frozen()


def test_a_burst_inside_a_crowd_releases_the_heap_when_it_ends(crowd: list[_Command]) -> None:
    """The end of a burst releases what it held (its garbage too); the crowd freezes again once
    it grows a quarter above its size then."""
    _grow(crowd, _mass.CROWD_MIN * 2)
    _burst()
    assert _mass.frozen()
    _end_all()
    assert not _mass.frozen()
    size = len(crowd)
    _grow(crowd, size + size // 4 - 1)
    assert not _mass.frozen()
    _grow(crowd, size + size // 4)
    assert _mass.frozen()


def test_a_crowd_leaves_a_heap_the_program_froze_alone(
    crowd: list[_Command], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program that froze its own heap keeps it as it froze it: the crowd neither freezes nor
    thaws. (Counted by the calls, not by gc.get_freeze_count(): frozen objects that other threads
    of the process release meanwhile, such as a worker thread of an earlier test exiting, lower it.)"""
    calls: list[str] = []
    real_freeze, real_unfreeze = gc.freeze, gc.unfreeze
    real_freeze()
    try:
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        _grow(crowd, _mass.CROWD_MIN * 2)
        assert not _mass.frozen()
        _shrink(crowd, 0)
        assert calls == []
    finally:
        monkeypatch.undo()
        real_unfreeze()
