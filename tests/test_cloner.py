"""Spawns after an idle gap, cloned by a worker thread (_cloner.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

import trio_procown
from trio_procown import _cloner, _placement

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the spawner is Linux-only"),
    pytest.mark.timeout(30),
]


class FakeClock:
    """time.monotonic and time.thread_time of the calling thread, set by the test."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 1.0

    def monotonic(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_cloner, "time", fake)
    monkeypatch.setattr(_cloner, "_last", _cloner._Last())
    return fake


def test_idle_means_a_long_gap_spent_asleep(clock: FakeClock) -> None:
    """The first spawn of a thread does not count as after idle (nothing says it was); after
    it, a gap of IDLE_GAP or more in which the thread ran for at most BUSY_SHARE of the time
    does."""
    assert not _cloner.after_idle()  # nothing before it
    clock.wall += _cloner.IDLE_GAP / 2
    assert not _cloner.after_idle()  # right after the previous spawn
    clock.wall += 0.05
    clock.cpu += 0.05 * _cloner.BUSY_SHARE / 2
    assert _cloner.after_idle()  # asleep most of 50 ms
    clock.wall += 0.05
    clock.cpu += 0.05 * 0.5
    assert not _cloner.after_idle()  # busy half of it: the CPU stayed warm


def test_each_thread_has_its_own_history(clock: FakeClock) -> None:
    """A spawn in another thread (another trio run) does not make this thread's next spawn
    look back to back."""
    _cloner.after_idle()
    clock.wall += 0.05
    seen: list[bool] = []

    def other() -> None:
        seen.append(_cloner.after_idle())
        clock.wall += 0.001
        seen.append(_cloner.after_idle())

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert seen == [False, False]  # its first spawn, then one right after it
    assert _cloner.after_idle()  # 51 ms since this thread's own previous spawn


def _blocked_in(status: str) -> set[int]:
    """The signals blocked (SigBlk of /proc/PID/status)."""
    for line in status.splitlines():
        if line.startswith("SigBlk:"):
            bits = int(line.split()[1], 16)
            return {n for n in range(1, 65) if bits >> (n - 1) & 1}
    raise AssertionError(status)


async def test_a_clone_by_the_worker_gives_the_child_the_callers_signal_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cloned by the worker thread, the command starts with the signal mask of the thread
    that asked for it (as a clone by that thread would), whatever it was at the previous
    spawn; and it runs, captured and owned as any other."""
    if _placement.compiled_spawner() is None:
        pytest.skip("no spawner here (no C compiler): spawns go through Popen")
    monkeypatch.setattr(_cloner, "after_idle", lambda: True)
    calls: list[str] = []
    real_call = _cloner._CLONER.call

    def counted(fn: object, *args: object) -> object:
        calls.append(threading.current_thread().name)
        return real_call(fn, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_cloner._CLONER, "call", counted)
    command = ["/bin/cat", "/proc/self/status"]  # exec'd directly: a shell may reset its mask
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        blocked = await trio_procown.run_owned(command, domain="process-group")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    unblocked = await trio_procown.run_owned(command, domain="process-group")
    assert len(calls) == 2
    assert blocked.returncode == unblocked.returncode == 0
    assert signal.SIGUSR2 in _blocked_in(blocked.stdout.decode())
    assert signal.SIGUSR2 not in _blocked_in(unblocked.stdout.decode())
    assert blocked.receipt.domain_empty


async def test_an_exec_failure_in_the_worker_is_the_callers_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    """A program the kernel refuses to exec (a file without the execute bit) raises the
    exec's PermissionError in the caller, through the worker as inline, and leaves nothing."""
    if _placement.compiled_spawner() is None:
        pytest.skip("no spawner here (no C compiler): spawns go through Popen")
    monkeypatch.setattr(_cloner, "after_idle", lambda: True)
    script = os.path.join(os.fspath(tmp_path), "not-executable")
    with open(script, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)
    with pytest.raises(PermissionError):
        await trio_procown.run_owned([script], domain="process-group")


def test_the_worker_ends_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker thread ends after IDLE_EXIT without a clone to make, and a later call
    starts another."""
    monkeypatch.setattr(_cloner, "IDLE_EXIT", 0.05)
    cloner = _cloner._Cloner()
    assert cloner.call(threading.get_ident) != threading.get_ident()
    first = cloner._thread
    assert first is not None
    first.join(timeout=10)
    assert not first.is_alive()
    assert cloner._thread is None
    assert cloner.call(lambda: 7) == 7
    second = cloner._thread
    assert second is not None
    assert second is not first
    second.join(timeout=10)


def test_an_error_in_the_worker_is_raised_in_the_caller() -> None:
    """What the call raises in the worker is raised in the caller, and the worker goes on."""
    cloner = _cloner._Cloner()

    def fail() -> None:
        raise OSError(5, "boom")

    with pytest.raises(OSError, match="boom"):
        cloner.call(fail)
    assert cloner.call(lambda: 3) == 3


async def test_spawns_one_after_another_stay_on_the_calling_thread() -> None:
    """Commands run one after another by a busy loop are cloned by the loop's own thread
    (the handoff would cost more than it saves there): at most the first goes to the worker."""
    if _placement.compiled_spawner() is None:
        pytest.skip("no spawner here (no C compiler): spawns go through Popen")
    decisions: list[bool] = []
    real = _cloner.after_idle

    def recorded() -> bool:
        decisions.append(real())
        return decisions[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cloner, "after_idle", recorded)
        for _ in range(5):
            await trio_procown.run_owned(["/bin/true"], domain="process-group")
    assert len(decisions) == 5
    assert not any(decisions[1:])
