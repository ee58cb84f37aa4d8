"""The pid-mark proof (ranges_since), without processes."""

from __future__ import annotations

import pytest

from trio_procown import _procfs
from trio_procown._procfs import PidMark


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A fake pid counter: pid_max and the mark 'now'."""
    state: dict[str, object] = {"pid_max": 32768, "now": None}
    monkeypatch.setattr(_procfs, "_pid_max", lambda: state["pid_max"])
    monkeypatch.setattr(_procfs, "pid_mark", lambda: state["now"])
    return state


def test_no_mark_means_a_full_scan(machine: dict[str, object]) -> None:
    """Without a mark (or without /proc) nothing is proven: None, a full scan."""
    machine["now"] = PidMark(last_pid=10, forks=10, tasks=10)
    assert _procfs.ranges_since(None) is None
    machine["now"] = None
    assert _procfs.ranges_since(PidMark(last_pid=1, forks=1, tasks=1)) is None


def test_counter_moved_forward(machine: dict[str, object]) -> None:
    """A few clones since the mark: exactly the pids allocated after it."""
    machine["now"] = PidMark(last_pid=5010, forks=110, tasks=200)
    assert _procfs.ranges_since(PidMark(last_pid=5000, forks=100, tasks=200)) == [(5001, 5010)]


def test_counter_wrapped_once(machine: dict[str, object]) -> None:
    """The counter wrapped past pid_max: the top of the range and the bottom."""
    machine["now"] = PidMark(last_pid=20, forks=150, tasks=200)
    assert _procfs.ranges_since(PidMark(last_pid=32700, forks=100, tasks=200)) == [(32701, 32767), (1, 20)]


def test_no_pid_allocated(machine: dict[str, object]) -> None:
    """Nothing forked since the mark: an empty range, not a full scan."""
    machine["now"] = PidMark(last_pid=700, forks=100, tasks=50)
    ranges = _procfs.ranges_since(PidMark(last_pid=700, forks=100, tasks=50))
    assert ranges == [(701, 700)]
    assert _procfs.width(ranges) == 0


@pytest.mark.parametrize(
    ("clones", "tasks", "sound"), [(1000, 1000, True), (6000, 1000, False), (10, 11000, False)]
)
def test_too_many_clones_or_tasks_is_not_sound(
    machine: dict[str, object], clones: int, tasks: int, sound: bool
) -> None:
    """4 x clones + 3 x (tasks + clones) must stay below pid_max - 300, else the counter may have lapped."""
    machine["now"] = PidMark(last_pid=900, forks=100 + clones, tasks=tasks)
    result = _procfs.ranges_since(PidMark(last_pid=800, forks=100, tasks=tasks))
    assert (result is not None) is sound
