"""The mass-teardown count and the collector's freeze (_mass.py), without processes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from trio_procown import _mass


@pytest.fixture(autouse=True)
def _clean_slate() -> Iterator[None]:
    """Each test starts with no teardown under way and leaves the heap as it found it."""
    assert _mass.under_way() == 0
    assert not _mass.frozen()
    before = gc.get_freeze_count()
    yield
    while _mass.under_way():
        _mass.leave()
    assert not _mass.frozen()
    assert gc.get_freeze_count() == before


def test_a_few_teardowns_leave_the_collector_alone() -> None:
    """Up to INLINE_MAX teardowns under way: nothing is frozen."""
    for _ in range(_mass.INLINE_MAX):
        _mass.enter()
    assert not _mass.frozen()
    assert gc.get_freeze_count() == 0
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
    monkeypatch.setattr(_mass.time, "monotonic", lambda: now[0])
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
