"""The spawner's C scanner (procown_scan): the table the Python scan reads, read off the loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import trio_procown
from conftest import MARKER, MARKER_VAR, py
from helpers import kill_and_wait
from trio_procown import _placement, _procfs, _signaller
from trio_procown._census import COOKIE_KEY, COOKIE_VAR

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


async def _load_scanner() -> Any:
    await trio_procown.run_owned(["true"])  # the spawner is loaded at a spawn, where it works
    scan = _placement.loaded_scanner()
    if scan is None:
        pytest.skip("no spawner here (no C compiler, or neither x86_64 nor aarch64)")
    return scan


@pytest.fixture
def sleepers() -> Iterator[dict[str, Any]]:
    """Three sleeps carrying the token b"tok" in a chain, one carrying none, one zombie."""
    env = {**os.environ, MARKER_VAR: MARKER, COOKIE_VAR: "outer:tok"}
    plain = {k: v for k, v in env.items() if k != COOKIE_VAR}
    marked = [subprocess.Popen(["sleep", "30"], env=env) for _ in range(3)]
    other = subprocess.Popen(["sleep", "30"], env=plain)
    dead = subprocess.Popen(["true"], env=env)
    os.waitid(os.P_PID, dead.pid, os.WEXITED | os.WNOWAIT)  # a zombie until reaped below
    try:
        yield {"marked": {p.pid for p in marked}, "other": other.pid, "zombie": dead.pid}
    finally:
        for p in (*marked, other):
            kill_and_wait(p.pid)
            p.wait()
        dead.wait()


def _python_table(key: bytes, since: int) -> _procfs.ProcessTable:
    rows = [info for info in map(_procfs.read_stat, _procfs._all_pids()) if info is not None]
    table = _procfs.ProcessTable(rows)
    index = table._index(key)
    while not index.covered(since):
        index.read_one()
    return table


async def test_the_native_scan_reads_what_the_python_scan_reads(sleepers: dict[str, Any]) -> None:
    await _load_scanner()
    mine = {*sleepers["marked"], sleepers["other"], sleepers["zombie"]}
    native = _procfs.native_table(COOKIE_KEY, 0)
    python = _python_table(COOKIE_KEY, 0)
    assert native is not None
    by_pid = {r.pid: r for r in native.rows}
    assert {p: by_pid.get(p) for p in mine} == {r.pid: r for r in python.rows if r.pid in mine}
    assert by_pid[sleepers["zombie"]].zombie
    for table in (native, python):
        hits = {r.pid for r in table.carrying(COOKIE_KEY, b"tok")}
        assert hits & mine == sleepers["marked"]  # not the plain one, nor the zombie
        assert {r.pid for r in table.carrying(COOKIE_KEY, b"outer")} & mine == sleepers["marked"]
        assert not table.carrying(COOKIE_KEY, b"to")  # whole tokens only


async def test_environments_older_than_asked_are_left_for_later(sleepers: dict[str, Any]) -> None:
    """Read only back to `started_since` (as read_environs): an older question reads the rest."""
    await _load_scanner()
    newest = max(info.start for info in map(_procfs.read_stat, sleepers["marked"]) if info is not None)
    native = _procfs.native_table(COOKIE_KEY, newest + 10**6)  # after every process here
    assert native is not None
    index = native._index(COOKIE_KEY)
    assert not index.tokens  # nothing was started that late
    assert {r.pid for r in native.carrying(COOKIE_KEY, b"tok", 0)} >= sleepers["marked"]


async def test_a_scan_that_does_not_fit_grows_its_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    await _load_scanner()
    monkeypatch.setattr(_procfs, "_NATIVE_CAP", [64])
    table = _procfs.native_table(None, 0)
    assert table is not None
    assert os.getpid() in {r.pid for r in table.rows}
    assert _procfs._NATIVE_CAP[0] > 64


def test_the_output_is_parsed_record_by_record() -> None:
    raw = b"10 1 10 S 500 e\0" + COOKIE_KEY + b"a:b\0" + b"11 10 10 Z 501 n\0" + b"12 1 12 R 502 u\0"
    table = _procfs._parse_native(raw, COOKIE_KEY, 0, 5.0)
    assert [(r.pid, r.ppid, r.pgrp, r.state, r.start) for r in table.rows] == [
        (10, 1, 10, "S", 500),
        (11, 10, 10, "Z", 501),
        (12, 1, 12, "R", 502),
    ]
    assert table.started == 5.0
    assert [r.pid for r in table.carrying(COOKIE_KEY, b"b")] == [10]
    unreadable: set[int] = set()
    table.carrying(COOKIE_KEY, b"zz", 0, unreadable=unreadable)
    assert unreadable == {12}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become another user")
@pytest.mark.timeout(60)
def test_an_environment_we_may_not_read_is_said_to_be_unreadable() -> None:
    """As another user, PID 1's environment cannot be read: the scan says so (the census then
    reports what it could not see) instead of treating it as carrying no cookie."""
    code = (
        "import json, os, trio, trio_procown\n"
        "from trio_procown import _placement, _procfs\n"
        "from trio_procown._census import COOKIE_KEY\n"
        "trio.run(trio_procown.run_owned, ['true'])\n"
        "if _placement.loaded_scanner() is None:\n"
        "    print(json.dumps(None)); raise SystemExit\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "table = _procfs.native_table(COOKIE_KEY, 0)\n"
        "unreadable = set()\n"
        "table.carrying(COOKIE_KEY, b'x', 0, unreadable=unreadable)\n"
        "print(json.dumps(sorted(unreadable)))\n"
    )
    out = subprocess.run(py(code), capture_output=True, timeout=50, check=True).stdout
    unreadable = json.loads(out)
    if unreadable is None:
        pytest.skip("no spawner here")
    assert 1 in unreadable


async def test_a_shared_round_is_read_by_the_native_scan_in_a_thread(
    monkeypatch: pytest.MonkeyPatch, sleepers: dict[str, Any]
) -> None:
    """The coalescer's round: a native scan in the scanner's worker thread, with the cookie
    read; the Python readers are never called (they would hold the loop)."""
    await _load_scanner()
    threads: list[str] = []
    real = _procfs.native_table

    def recorded(*args: Any) -> _procfs.ProcessTable | None:
        threads.append(threading.current_thread().name)
        return real(*args)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Python scan ran")

    monkeypatch.setattr(_procfs, "native_table", recorded)
    monkeypatch.setattr(_procfs, "_snapshot_in_slices", forbidden)
    monkeypatch.setattr(_procfs, "environ_entry", forbidden)
    monkeypatch.setattr(_procfs, "ranges_since", lambda mark: None)
    asked = trio.current_time()
    table = await _procfs.table_for(None, COOKIE_KEY, 0)
    assert table.started >= asked
    assert threads == [_signaller.SCANNER_NAME]  # a worker of ours, never the loop's thread
    assert {r.pid for r in table.carrying(COOKIE_KEY, b"tok")} >= sleepers["marked"]


def _python_round(monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """Replace the Python scan of a round by one row (ours); the list records each scan."""
    scanned: list[None] = []

    async def slices(urgent: object = None) -> _procfs.Rows:
        scanned.append(None)
        return _procfs.Rows([_procfs.ProcInfo(os.getpid(), 1, 1, "R", 1)])

    monkeypatch.setattr(_procfs, "_snapshot_in_slices", slices)
    monkeypatch.setattr(_procfs, "ranges_since", lambda mark: None)
    return scanned


async def test_without_the_native_scan_a_round_scans_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    await _load_scanner()
    scanned = _python_round(monkeypatch)
    monkeypatch.setattr(_procfs, "NATIVE_SCAN", False)
    table = await _procfs.table_for(None)
    assert scanned == [None]
    assert [r.pid for r in table.rows] == [os.getpid()]


async def test_a_native_scan_that_fails_leaves_the_round_to_the_python_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _load_scanner()
    scanned = _python_round(monkeypatch)

    def broken(*args: object) -> None:
        raise MemoryError

    monkeypatch.setattr(_procfs, "native_table", broken)
    table = await _procfs.table_for(None)
    assert scanned == [None]
    assert [r.pid for r in table.rows] == [os.getpid()]
