"""The pid-mark proof (ranges_since), without processes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from conftest import MARKER
from trio_procown import _mass, _procfs
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


# -- the shared process table (issue 16: many teardowns at once) ---------------------------

KEY = b"TRIO_PROCOWN_COOKIE="


def _row(pid: int, pgrp: int, start: int, state: str = "S") -> _procfs.ProcInfo:
    return _procfs.ProcInfo(pid, 1, pgrp, state, start)


class FakeEnvirons:
    """Environments by pid (None: unreadable) and the pids whose environment was read."""

    def __init__(self) -> None:
        self.by_pid: dict[int, bytes | None] = {}
        self.reads: list[int] = []

    def entry(self, pid: int, key: bytes, unreadable: set[int] | None = None) -> bytes | None:
        self.reads.append(pid)
        value = self.by_pid.get(pid, b"")
        if value is None and unreadable is not None:
            unreadable.add(pid)
        return value or None


@pytest.fixture
def environs(monkeypatch: pytest.MonkeyPatch) -> FakeEnvirons:
    """Fake environment reads (no processes)."""
    fake = FakeEnvirons()
    monkeypatch.setattr(_procfs, "environ_entry", fake.entry)
    return fake


def test_rows_index_by_process_group() -> None:
    """Rows.in_group answers from an index built once, in table order."""
    rows = _procfs.Rows([_row(10, 10, 1), _row(11, 10, 2), _row(20, 20, 3)])
    assert [r.pid for r in rows.in_group(10)] == [10, 11]
    assert rows.in_group(99) == []
    assert [r.pid for r in rows.in_group(20)] == [20]


def test_census_index_reads_each_environment_once(environs: FakeEnvirons) -> None:
    """Many census questions on one table read each environment at most once, and only
    as far back as the oldest start time asked about."""
    environs.by_pid[101] = KEY + b"outer:aaa"
    environs.by_pid[102] = KEY + b"bbb"
    environs.by_pid[103] = KEY + b"aaa"
    table = _procfs.ProcessTable(
        [_row(101, 101, 50), _row(102, 102, 60), _row(103, 900, 70), _row(104, 104, 10)]
    )
    assert [r.pid for r in table.carrying(KEY, b"aaa", started_since=50)] == [103, 101]
    assert [r.pid for r in table.carrying(KEY, b"bbb", started_since=55)] == [102]
    assert [r.pid for r in table.carrying(KEY, b"outer", started_since=50)] == [101]
    assert sorted(environs.reads) == [101, 102, 103]  # 104 started before anything asked about
    assert table.carrying(KEY, b"aaa", started_since=60) == [_row(103, 900, 70)]  # 101 is older
    assert table.carrying(KEY, b"aaa", started_since=50, skip=900) == [_row(101, 101, 50)]


def test_census_index_skips_zombies_and_reports_unreadable(environs: FakeEnvirons) -> None:
    """Zombies are never read; an unreadable environment is reported to the questions it concerns."""
    environs.by_pid[201] = None
    environs.by_pid[202] = KEY + b"tok"
    table = _procfs.ProcessTable([_row(201, 201, 80), _row(202, 202, 80, "Z"), _row(203, 203, 80)])
    unreadable: set[int] = set()
    assert table.carrying(KEY, b"tok", 0, -1, unreadable) == []
    assert unreadable == {201}
    unreadable.clear()
    table.carrying(KEY, b"tok", 0, 201, unreadable)  # that group is the caller's own: not asked about
    assert unreadable == set()
    assert 202 not in environs.reads


async def test_read_environs_then_carrying_reads_nothing_more(environs: FakeEnvirons) -> None:
    """read_environs (the shared scan's prefetch, in slices) leaves carrying nothing to read."""
    environs.by_pid[301] = KEY + b"x"
    table = _procfs.ProcessTable([_row(300 + i, 300 + i, 100 + i) for i in range(50)])
    await table.read_environs(KEY, 100)
    before = len(environs.reads)
    assert [r.pid for r in table.carrying(KEY, b"x", 100)] == [301]
    assert len(environs.reads) == before == 50


async def test_one_scan_serves_every_request_made_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests of one scheduling batch share one scan; a request made while a scan runs gets the
    next one, which begins after that request (a table is never older than its question)."""
    import trio

    scans: list[float] = []
    gate = trio.Event()

    async def slow_scan(urgent: object = None) -> _procfs.Rows:
        scans.append(trio.current_time())
        await gate.wait()
        return _procfs.Rows()

    monkeypatch.setattr(_procfs, "NATIVE_SCAN", False)  # the Python scan, replaced above
    monkeypatch.setattr(_procfs, "_snapshot_in_slices", slow_scan)
    monkeypatch.setattr(_procfs, "ranges_since", lambda mark: None)
    tables: dict[str, _procfs.ProcessTable] = {}
    asked: dict[str, float] = {}

    async def ask(name: str) -> None:
        asked[name] = trio.current_time()
        tables[name] = await _procfs.table_for(None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "a")
        nursery.start_soon(ask, "b")
        with trio.fail_after(10):
            while not scans:
                await trio.sleep(0)
        nursery.start_soon(ask, "late")
        await trio.sleep(0.01)
        gate.set()
    assert tables["a"] is tables["b"]
    assert tables["late"] is not tables["a"]
    assert len(scans) == 2
    assert tables["late"].started >= asked["late"]
    assert tables["a"].started >= max(asked["a"], asked["b"])


async def test_table_since_reuses_only_a_table_begun_after_the_question(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """table_since (for teardowns past their deadline) shares a full scan that began at or after
    the question, and scans anew otherwise."""
    import trio

    calls: list[None] = []

    def scan(ranges: object) -> _procfs.Rows:
        calls.append(None)
        return _procfs.Rows()

    monkeypatch.setattr(_procfs, "_snapshot", scan)
    monkeypatch.setattr(_procfs, "ranges_since", lambda mark: None)
    asked = trio.current_time()
    first = _procfs.table_since(None, asked)
    assert _procfs.table_since(None, asked) is first
    await trio.sleep(0.01)
    later = trio.current_time()
    third = _procfs.table_since(None, later)
    assert third is not first
    assert len(calls) == 2


async def test_the_newest_mark_sends_a_wide_range_to_the_shared_scan_without_a_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the newest mark read already shows more clones since a command's mark than a narrow
    range holds, table_for goes to the shared scan without reading /proc/stat again; a command
    whose mark is recent still gets its narrow, private probe."""
    monkeypatch.setattr(_procfs, "_NEWEST", [PidMark(last_pid=9000, forks=5000, tasks=100)])
    old = PidMark(last_pid=100, forks=5000 - _procfs.DIRECT_PROBE_MAX - 1, tasks=100)
    recent = PidMark(last_pid=8990, forks=4990, tasks=100)
    assert _procfs.surely_wide(old)
    assert not _procfs.surely_wide(recent)
    assert not _procfs.surely_wide(None)

    reads: list[PidMark | None] = []
    shared: list[None] = []

    def ranges_since(mark: PidMark | None) -> list[tuple[int, int]]:
        reads.append(mark)
        return [(8991, 9000)]

    async def slow_scan(urgent: object = None) -> _procfs.Rows:
        shared.append(None)
        return _procfs.Rows()

    monkeypatch.setattr(_procfs, "ranges_since", ranges_since)
    monkeypatch.setattr(_procfs, "NATIVE_SCAN", False)  # the Python scan, replaced below
    monkeypatch.setattr(_procfs, "_snapshot", lambda ranges, census=False: _procfs.Rows())
    monkeypatch.setattr(_procfs, "_snapshot_in_slices", slow_scan)

    await _procfs.table_for(old)
    assert reads == []
    assert len(shared) == 1
    await _procfs.table_for(recent)
    assert reads == [recent]
    assert len(shared) == 1


def test_pid_mark_remembers_the_newest_mark() -> None:
    """Every mark read becomes the newest one surely_wide compares against."""
    if not _procfs.IS_LINUX:
        pytest.skip("marks are read from /proc")
    mark = _procfs.pid_mark()
    assert mark is not None
    assert [mark] == _procfs._NEWEST


def test_counters_are_read_through_kept_descriptors_that_survive_being_closed_or_replaced() -> None:
    """The pid and clone counters are read through descriptors kept open. One closed behind
    our back is opened anew; one whose number now holds another file (here a pipe, which a
    pread refuses, and a regular file, whose contents fail the parse) is left to its new
    owner, untouched and open, while the counters are read through a fresh descriptor."""
    if not _procfs.IS_LINUX:
        pytest.skip("counters are read from /proc")
    assert _procfs.pid_mark() is not None
    kept = _procfs._KEPT["/proc/loadavg"]
    assert _procfs.pid_mark() is not None
    assert _procfs._KEPT["/proc/loadavg"] == kept  # the same descriptor, read again

    os.close(kept)  # closed by someone else
    mark = _procfs.pid_mark()
    assert mark is not None
    assert mark.last_pid > 0
    assert os.readlink(f"/proc/self/fd/{_procfs._KEPT['/proc/loadavg']}") == "/proc/loadavg"

    read_end, write_end = os.pipe()
    given_up: list[int] = []  # the numbers the library no longer counts as its own
    with open(os.devnull, "rb") as devnull, open(__file__, "rb") as source:
        try:
            for other in (read_end, source.fileno()):
                kept = _procfs._KEPT["/proc/loadavg"]
                given_up.append(kept)
                os.dup2(other, kept)  # the number now holds someone else's file
                os.write(write_end, b"theirs")
                assert _procfs.pid_mark() is not None
                fresh = _procfs._KEPT["/proc/loadavg"]
                assert fresh != kept
                assert os.readlink(f"/proc/self/fd/{fresh}") == "/proc/loadavg"
                assert os.fstat(kept).st_ino == os.fstat(other).st_ino  # still theirs, open
                os.dup2(devnull.fileno(), kept)  # (give the number back to something inert)
            assert os.read(read_end, 100) == b"theirstheirs"  # nothing of theirs was consumed
        finally:
            for fd in (read_end, write_end, *given_up):
                os.close(fd)


def test_a_spawn_reads_nothing_while_the_clone_count_is_recent(monkeypatch: pytest.MonkeyPatch) -> None:
    """spawn_mark gives the newest mark read, without reading anything, while its clone
    count is at most FORKS_REUSE old (read earlier, it only widens the bound); past that,
    or with no mark at all, it reads a fresh one. mark_of then puts the mark just below the
    leader, with the basis's clone and task counts."""
    newest = PidMark(last_pid=500, forks=400, tasks=90)
    fresh = PidMark(last_pid=510, forks=410, tasks=91)
    reads: list[None] = []

    def pid_mark() -> PidMark:
        reads.append(None)
        return fresh

    clock = [100.0]
    monkeypatch.setattr(_procfs, "pid_mark", pid_mark)
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(_procfs, "_NEWEST", [newest])
    monkeypatch.setattr(_procfs, "_FORKS_AT", [clock[0]])
    counters = _loadavg(monkeypatch, last_pid=505, tasks=95)
    assert _procfs.spawn_mark() is newest
    clock[0] += _procfs.FORKS_REUSE  # (at most FORKS_REUSE old: still kept)
    assert _procfs.spawn_mark() is newest
    assert reads == []
    assert counters == []
    assert _procfs.mark_of(newest, 733) == PidMark(last_pid=732, forks=400, tasks=90)

    clock[0] += 0.001
    assert _procfs.spawn_mark() is fresh
    assert reads == [None]
    monkeypatch.setattr(_procfs, "_NEWEST", [])
    assert _procfs.spawn_mark() is fresh
    assert reads == [None, None]
    assert _procfs.mark_of(None, 733) is None


def test_a_spawn_mark_is_read_whole_after_forks_reuse() -> None:
    """With the real counters: a mark read whole stamps its clone count; later spawns reuse
    it, and the mark of one sits just below its leader's pid, holding it and every later
    pid in its range; once the count is FORKS_REUSE old, both are read again."""
    if not _procfs.IS_LINUX:
        pytest.skip("marks are read from /proc")
    whole = _procfs.pid_mark()
    assert whole is not None
    later = _procfs.spawn_mark()
    assert later is whole
    child = subprocess.Popen(["true"])  # a pid allocated since
    try:
        mark = _procfs.mark_of(later, child.pid)
        assert mark is not None
        assert mark.forks == whole.forks
        ranges = _procfs.ranges_since(mark)
        assert ranges is not None
        assert any(lo <= child.pid <= hi for lo, hi in ranges)
    finally:
        assert child.wait(timeout=10) == 0
    _procfs._FORKS_AT[0] -= 2 * _procfs.FORKS_REUSE
    again = _procfs.spawn_mark()
    assert again is not None
    assert again.forks > whole.forks


def test_every_pid_of_a_narrow_range_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a narrow range, each pid is probed for being a process (not a thread), and only
    the processes are listed."""
    probed: list[int] = []

    def is_process(pid: int) -> bool:
        probed.append(pid)
        return pid == 12

    monkeypatch.setattr(_procfs, "is_process", is_process)
    assert list(_procfs.candidate_pids([(10, 13)])) == [12]
    assert probed == [10, 11, 12, 13]
    probed.clear()
    assert list(_procfs.candidate_pids([(10, 13)], census=True)) == [12]  # nothing held there
    assert probed == [10, 11, 12, 13]


async def _gather_with(
    monkeypatch: pytest.MonkeyPatch, waiting: int, expected: int, burst: bool, signals_queued: bool = False
) -> float:
    """How long _gather holds a round back with `waiting` of `expected` teardowns parked
    (`signals_queued`: actions still queued for the signaller thread)."""
    import time

    import trio
    import trio.testing

    from trio_procown import _signaller

    monkeypatch.setattr(_signaller, "pending", lambda: signals_queued)
    monkeypatch.setattr(_mass, "in_burst", lambda: burst)
    monkeypatch.setattr(_mass, "expected", lambda: expected)
    this = _procfs._Round()
    async with trio.open_nursery() as nursery:
        for _ in range(waiting):
            nursery.start_soon(this.waiting.park)
        await trio.testing.wait_all_tasks_blocked()
        started = time.perf_counter()
        await _procfs._gather(this)
        took = time.perf_counter() - started
        this.waiting.unpark_all()
    return took


async def test_a_round_in_a_burst_waits_for_the_teardowns_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a burst a round waits to start while teardowns are still expected to ask, at most
    GATHER_MAX; it starts at once when every teardown expected waits, or outside a burst."""
    monkeypatch.setattr(_procfs, "GATHER_MAX", 0.05)
    monkeypatch.setattr(_procfs, "GATHER_QUIET", 1.0)  # (see the test below)
    assert await _gather_with(monkeypatch, 1, 3, burst=True) >= 0.05
    assert await _gather_with(monkeypatch, 3, 3, burst=True) < 0.05
    assert await _gather_with(monkeypatch, 1, 3, burst=False) < 0.05


async def test_a_round_in_a_burst_waits_while_its_signals_are_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the burst's signals still wait for the signaller thread (their processes have not
    died yet: a scan then runs through the kill storm) a round holds back past GATHER_MAX, at
    most GATHER_SIGNALS_MAX; it still starts at once when every teardown expected waits."""
    monkeypatch.setattr(_procfs, "GATHER_MAX", 0.05)
    monkeypatch.setattr(_procfs, "GATHER_SIGNALS_MAX", 0.3)
    monkeypatch.setattr(_procfs, "GATHER_QUIET", 0.3)  # no early start for a quiet round here
    assert await _gather_with(monkeypatch, 1, 3, burst=True, signals_queued=True) >= 0.3
    assert await _gather_with(monkeypatch, 1, 3, burst=True) < 0.3
    assert await _gather_with(monkeypatch, 3, 3, burst=True, signals_queued=True) < 0.05
    assert await _gather_with(monkeypatch, 1, 3, burst=False, signals_queued=True) < 0.05


async def test_a_round_with_no_signal_queued_starts_once_nobody_has_joined_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Late in a burst most teardowns under way never ask again: with no signal queued, a
    round starts once nobody has joined it for GATHER_QUIET, before GATHER_MAX; while
    signals are queued, quiet does not start it."""
    monkeypatch.setattr(_procfs, "GATHER_MAX", 0.5)
    monkeypatch.setattr(_procfs, "GATHER_SIGNALS_MAX", 0.5)
    monkeypatch.setattr(_procfs, "GATHER_QUIET", 0.05)
    quiet = await _gather_with(monkeypatch, 1, 3, burst=True)
    assert 0.05 <= quiet < 0.5
    assert await _gather_with(monkeypatch, 1, 3, burst=True, signals_queued=True) >= 0.5


def test_a_scan_most_of_a_burst_waits_for_is_urgent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared scan takes SCAN_SLICE_URGENT slices while at least half the teardowns expected
    wait for it or for the round after it; never outside a burst."""
    import trio.lowlevel

    coalescer = _procfs._Coalescer()
    running, following = _procfs._Round(), _procfs._Round()
    coalescer._running, coalescer._next = running, following
    monkeypatch.setattr(_mass, "expected", lambda: 10)
    monkeypatch.setattr(_mass, "in_burst", lambda: True)
    sizes = {"running": 2, "next": 3}
    monkeypatch.setattr(
        trio.lowlevel.ParkingLot,
        "__len__",
        lambda lot: sizes["running" if lot is running.waiting else "next"],
    )
    assert coalescer._urgent()  # 2 + 3 of 10
    sizes["next"] = 2
    assert not coalescer._urgent()  # 4 of 10
    sizes["next"] = 3
    monkeypatch.setattr(_mass, "in_burst", lambda: False)
    assert not coalescer._urgent()


# -- no pid since the leader (quiet_since) -------------------------------------------------


def _loadavg(monkeypatch: pytest.MonkeyPatch, last_pid: int, tasks: int = 180) -> list[str]:
    """Serve /proc/loadavg with `last_pid`; record every file read."""
    reads: list[str] = []
    real = _procfs._reread

    def reread(path: str, check: Callable[[bytes], Any]) -> Any:
        reads.append(path)
        if path == "/proc/loadavg":
            return check(f"0.10 0.20 0.30 2/{tasks} {last_pid}\n".encode())
        return real(path, check)

    monkeypatch.setattr(_procfs, "_reread", reread)
    return reads


def test_quiet_since_holds_only_while_the_leader_is_the_newest_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's pid still the newest allocated: nothing started since, from one read of
    /proc/loadavg; the newest mark then keeps the command's clone count (read before the leader
    existed, so it can only widen a later bound). Any other newest pid, no mark, no leader or an
    unreadable /proc/loadavg prove nothing."""
    if not _procfs.IS_LINUX:
        pytest.skip("Linux's pid counter")
    mark = PidMark(last_pid=4990, forks=777, tasks=150)
    monkeypatch.setattr(_procfs, "_NEWEST", [])
    reads = _loadavg(monkeypatch, last_pid=5000, tasks=181)
    assert _procfs.quiet_since(mark, 5000)
    assert reads == ["/proc/loadavg"]
    assert [PidMark(last_pid=5000, forks=777, tasks=181)] == _procfs._NEWEST

    monkeypatch.setattr(_procfs, "_NEWEST", [])
    assert not _procfs.quiet_since(mark, 4999)  # a pid was allocated after 4999
    assert not _procfs.quiet_since(None, 5000)
    assert not _procfs.quiet_since(mark, 0)
    assert _procfs._NEWEST == []

    def refused(path: str, check: Callable[[bytes], Any]) -> Any:
        raise PermissionError(13, "refused", path)

    monkeypatch.setattr(_procfs, "_reread", refused)
    assert not _procfs.quiet_since(mark, 5000)


async def test_a_quiet_table_holds_the_leader_alone_without_a_range_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """table_for with a quiet counter reads nothing more: no mark, no probe of the range since
    the command's mark, an empty table (the leader's own row is never asked for); a counter that
    moved takes the range as before (the child here is no command's held leader: it is listed)."""
    if not _procfs.IS_LINUX:
        pytest.skip("Linux's pid counter")
    import subprocess

    from conftest import py

    child = subprocess.Popen(py("import time; time.sleep(30)"))
    try:
        mark = PidMark(last_pid=child.pid - 1, forks=10, tasks=100)
        ranges: list[PidMark | None] = []

        def ranges_since(m: PidMark | None) -> list[tuple[int, int]]:
            ranges.append(m)
            return [(child.pid, child.pid + 5)]

        monkeypatch.setattr(_procfs, "ranges_since", ranges_since)
        monkeypatch.setattr(_procfs, "surely_wide", lambda m: False)
        _loadavg(monkeypatch, last_pid=child.pid)
        table = await _procfs.table_for(mark, known=child.pid)
        assert list(table.rows) == []
        assert ranges == []

        _loadavg(monkeypatch, last_pid=child.pid + 5)
        table = await _procfs.table_for(mark, known=child.pid)
        assert ranges == [mark]
        assert child.pid in [row.pid for row in table.rows]
    finally:
        child.kill()
        child.wait()


def test_quiet_since_agrees_with_the_kernel_for_real_children() -> None:
    """Two children spawned one after the other: the first is never the newest pid once the
    second exists; the second is, whenever /proc/loadavg (read independently just before and
    after) shows nothing else was allocated meanwhile."""
    if not _procfs.IS_LINUX:
        pytest.skip("Linux's pid counter")
    import subprocess

    from conftest import py

    def newest() -> int:
        return int(_procfs._read_small("/proc/loadavg").split()[4])

    mark = _procfs.pid_mark()
    first = subprocess.Popen(py("import sys; sys.stdin.read()"), stdin=subprocess.PIPE)
    second = subprocess.Popen(py("import sys; sys.stdin.read()"), stdin=subprocess.PIPE)
    try:
        assert not _procfs.quiet_since(mark, first.pid)
        agreed = 0
        for _ in range(50):
            before = newest()
            quiet = _procfs.quiet_since(mark, second.pid)
            after = newest()
            if before == after:
                assert quiet is (after == second.pid)
                agreed += quiet
            if after != second.pid:
                break  # the machine started something: the counter moved on for good
        if newest() == second.pid:
            assert agreed
    finally:
        for child in (first, second):
            child.communicate(b"")


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "status-file"])
def test_is_process_tells_a_process_from_a_thread(pidfds: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process (running, or a zombie) is one; a thread that leads no group,
    and a pid nobody has, are not: by pidfd_open, or by /proc/PID/status
    where no pidfd can be had (EMFILE here)."""
    if not pidfds:

        def no_pidfd(pid: int, flags: int = 0) -> int:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(10,))
    thread.start()
    zombie = subprocess.Popen([sys.executable, "-c", "pass", MARKER])
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        assert _procfs.is_process(os.getpid())
        assert _procfs.is_process(zombie.pid)
        assert thread.native_id is not None
        assert not _procfs.is_process(thread.native_id)
        assert not _procfs.is_process(2**22 + 1)  # above any pid_max
    finally:
        release.set()
        thread.join()
        zombie.wait()


def _held_child() -> tuple[subprocess.Popen[bytes], int]:
    """A child of ours, waiting on its stdin, and a pidfd on it."""
    waiting = [sys.executable, "-c", "import sys; sys.stdin.read()", MARKER]
    child = subprocess.Popen(waiting, stdin=subprocess.PIPE)
    return child, os.pidfd_open(child.pid)


def test_a_held_leader_is_left_out_of_a_census_table(probed: list[int]) -> None:
    """A pid held unreaped as a command's leader is not probed for a census's table (it is
    that command's own leader, whose row is never asked for, or another command's, which
    can be no member and carries no other command's cookie); once released, or once reaped
    by someone else (its pid may be anyone's then), it is probed as any other pid. Other
    callers (the pytest plugin's cookie scan) always probe it."""
    if not _procfs.IS_LINUX or not hasattr(os, "pidfd_open"):
        pytest.skip("pidfds")
    child, fd = _held_child()
    try:
        _procfs.hold(child.pid, fd)
        only = [(child.pid, child.pid)]
        assert list(_procfs.candidate_pids(only, census=True)) == []
        assert probed == []
        assert list(_procfs.candidate_pids(only)) == [child.pid]
        probed.clear()
        child.stdin.close()  # type: ignore[union-attr]
        os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)  # exited, not reaped: still its pid
        assert list(_procfs.candidate_pids(only, census=True)) == []
        child.wait()  # reaped behind the registry's back (a wait for any child, say)
        assert list(_procfs.candidate_pids(only, census=True)) == []
        assert probed == [child.pid]  # probed, and found gone
    finally:
        _procfs.release_held(child.pid)
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(fd)
    assert not _procfs.held(child.pid)


def test_a_held_leader_is_released_before_its_reap() -> None:
    """A leader is held from its spawn until its reap (or its pidfd is handed over)."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("pidfds")
    from trio_procown._leader import Leader

    child = subprocess.Popen([sys.executable, "-c", "pass", MARKER])
    leader = Leader(child.pid, child)
    try:
        assert _procfs.held(child.pid)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert _procfs.held(child.pid)  # a zombie holds its pid
        assert leader.reap()
        assert not _procfs.held(child.pid)
        assert child.pid not in _procfs._HELD
    finally:
        if not leader.reaped:
            child.kill()
            leader.reap()


def test_a_forked_child_reads_the_counters_though_another_thread_held_the_lock_at_the_fork() -> None:
    """The lock that guards the kept descriptors, held (as by another thread) when the process
    forks, does not hang the child when it must open a counter file anew."""
    if not hasattr(os, "fork") or not _procfs.IS_LINUX:
        pytest.skip("fork and /proc")
    assert _procfs.pid_mark() is not None
    kept = _procfs._KEPT["/proc/loadavg"]
    r, w = os.pipe()
    with _procfs._KEPT_LOCK:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the forked child
            signal.alarm(5)  # a hang ends the child, without an answer
            os.close(kept)  # so the read must open the file anew, under the lock
            os.write(w, b"1" if _procfs.pid_mark() is not None else b"0")
            os._exit(0)
    os.close(w)
    try:
        answer = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert answer == b"1"


def test_a_forked_child_holds_none_of_its_parents_leaders() -> None:
    """After a fork the child's table of held leaders is empty (they are not its children)."""
    if not hasattr(os, "pidfd_open") or not hasattr(os, "fork"):
        pytest.skip("pidfds and fork")
    child, fd = _held_child()
    try:
        _procfs.hold(child.pid, fd)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the forked child
            os.write(w, b"1" if not _procfs._HELD and not _procfs.held(child.pid) else b"0")
            os._exit(0)
        os.close(w)
        answer = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        assert answer == b"1"
        assert _procfs.held(child.pid)
    finally:
        _procfs.release_held(child.pid)
        child.stdin.close()  # type: ignore[union-attr]
        child.wait()
        os.close(fd)
