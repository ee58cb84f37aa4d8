"""Every action of the teardown can fail (EPERM, ENOSPC, EBUSY): the failure
becomes evidence, the next stage still runs, the bounds hold, and the
receipt claims no emptiness it could not prove."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import trio_procown
from conftest import py
from helpers import Budgets, alive, domains, kill_and_wait, read_ready
from trio_procown import _stale

DOMAINS = domains()
SLEEPER = py("import time; print('ready', flush=True); time.sleep(30)")


BUDGETS: Budgets = {"grace": 0.3, "kill_wait": 0.3, "drain_wait": 0.3}
# The budgets, the allowance, and scheduling slack.
BOUND = BUDGETS["grace"] + BUDGETS["kill_wait"] + BUDGETS["drain_wait"] + 2.0


def _pid_of_pidfd(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    return -1


@pytest.fixture
def refuse() -> Iterator[set[int]]:
    """Pids (and process groups) that every signal to is refused with EPERM,
    as for a setuid helper that became root, run by an unprivileged owner."""
    refused: set[int] = set()
    real_killpg, real_pidfd_send, real_kill = os.killpg, signal.pidfd_send_signal, os.kill

    def killpg(pgid: int, sig: int) -> None:
        if pgid in refused and sig != 0:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_killpg(pgid, sig)

    def pidfd_send(fd: int, sig: int, *args: object) -> None:
        if _pid_of_pidfd(fd) in refused and sig != 0:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_pidfd_send(fd, sig)

    def kill(pid: int, sig: int) -> None:
        if pid in refused and sig != 0:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_kill(pid, sig)

    mp = pytest.MonkeyPatch()
    mp.setattr(os, "killpg", killpg)
    mp.setattr(signal, "pidfd_send_signal", pidfd_send)
    mp.setattr(os, "kill", kill)
    try:
        yield refused
    finally:
        mp.undo()
        for pid in refused:
            kill_and_wait(pid)


@pytest.mark.timeout(30)
async def test_eperm_under_process_group_is_bounded_and_not_claimed_empty(refuse: set[int]) -> None:
    """EPERM on every signal: the teardown still reaches SIGKILL, stays within its bound, writes a
    receipt that says the domain was NOT proven empty, and the body's exception propagates as itself."""
    start = trio.current_time()
    with pytest.raises(ValueError, match="body failed") as caught:
        async with trio_procown.open_owned_command(SLEEPER, domain="process-group", **BUDGETS) as run:
            refuse.add(run.pid)
            await read_ready(run)
            raise ValueError("body failed")
    assert type(caught.value) is ValueError
    elapsed = trio.current_time() - start
    r = run.receipt
    assert r is not None
    assert elapsed < BOUND, r.steps
    assert alive(run.pid)
    assert (r.cause, r.forced, r.domain_empty) == ("error", True, False)
    refused = [s for s in r.steps if s.action is trio_procown.Action.SIGNAL and "EPERM" in s.outcome]
    assert [("SIGKILL" in s.detail) for s in refused] == [False, True], r.steps
    assert r.still_seen
    assert r.still_seen[0].pid == run.pid
    claims = " ".join(r.claims())
    assert "refused" in claims
    assert "EPERM" in claims
    assert "NOT proven empty" in claims
    assert "No live process" not in claims


@pytest.mark.timeout(30)
async def test_eperm_under_an_outer_deadline_returns_at_the_bound(refuse: set[int]) -> None:
    """An outer move_on_after is obeyed (after the bounded teardown) even when no signal is allowed."""
    start = trio.current_time()
    with trio.move_on_after(0.2) as scope:
        async with trio_procown.open_owned_command(SLEEPER, domain="process-group", **BUDGETS) as run:
            refuse.add(run.pid)
            await run.wait()
    assert scope.cancelled_caught
    assert trio.current_time() - start < BOUND + 0.2
    assert run.receipt is not None
    assert run.receipt.cause == "cancelled"
    assert not run.receipt.domain_empty


@pytest.mark.skipif("cgroup" not in DOMAINS, reason="the cgroup domain is unavailable here")
@pytest.mark.timeout(30)
async def test_eperm_under_cgroup_still_reaches_cgroup_kill(refuse: set[int]) -> None:
    """Under the cgroup domain, refused signals do not stop the teardown: cgroup.kill is reached and
    the domain is proven empty by the kernel."""
    async with trio_procown.open_owned_command(SLEEPER, domain="cgroup", timeout=0.2, **BUDGETS) as run:
        refuse.add(run.pid)
        await run.wait()
    r = run.receipt
    assert r is not None
    assert (r.cause, r.forced, r.domain_empty, r.returncode) == ("timed_out", True, True, -signal.SIGKILL)
    assert any("cgroup.kill" in s.detail for s in r.steps)
    assert any("EPERM" in s.outcome for s in r.steps)
    assert not alive(run.pid)


@pytest.mark.skipif("cgroup" not in DOMAINS, reason="the cgroup domain is unavailable here")
@pytest.mark.timeout(30)
async def test_inotify_failure_falls_back_to_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """No inotify watch could be added (ENOSPC): the wait for 'populated 0' still ends, by polling."""
    from trio_procown import _inotify

    def no_watch(self: object, path: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_inotify.Inotify, "add", no_watch)
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\ntime.sleep(30)\n"
    result = await trio_procown.run_owned(py(code), domain="cgroup", timeout=0.3, **BUDGETS)
    r = result.receipt
    assert r.domain_empty, r.steps
    assert not r.forced


@pytest.mark.skipif("cgroup" not in DOMAINS, reason="the cgroup domain is unavailable here")
@pytest.mark.timeout(30)
async def test_rmdir_failure_is_said_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cgroup that cannot be removed (EBUSY) is reported as NOT removed, with the reason, in claims()."""
    real_rmdir = os.rmdir
    refused: list[str] = []

    def rmdir(path: str, *args: object, **kwargs: object) -> None:
        if os.path.basename(os.fspath(path)).startswith("procown-") and not refused:
            refused.append(os.fspath(path))
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_rmdir(path)

    monkeypatch.setattr(os, "rmdir", rmdir)
    result = await trio_procown.run_owned(["true"], domain="cgroup")
    monkeypatch.undo()
    try:
        claims = " ".join(result.receipt.claims())
        assert "NOT fully released" in claims, claims
        assert "still populated" in claims, claims
    finally:
        for path in refused:
            os.rmdir(path)


def _refuse_first_rmdir(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """os.rmdir refuses the first command cgroup with EBUSY, as for one
    still populated when the teardown's bound ran out; the paths refused."""
    real_rmdir = os.rmdir
    refused: list[str] = []

    def rmdir(path: str, *args: object, **kwargs: object) -> None:
        name = _stale.parse(os.path.basename(os.fspath(path)))
        ours = name is not None and name[:2] == ("command domain", os.getpid())  # (not a stale one swept)
        if ours and os.path.isdir(path) and not refused:
            refused.append(os.fspath(path))
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_rmdir(path)

    monkeypatch.setattr(os, "rmdir", rmdir)
    return refused


@pytest.mark.skipif("cgroup" not in DOMAINS, reason="the cgroup domain is unavailable here")
@pytest.mark.timeout(30)
async def test_a_cgroup_still_populated_at_release_is_removed_at_the_next_spawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cgroup the teardown could not remove (EBUSY) is not left for good:
    the receipt says when it goes, and the next cgroup command removes it."""
    refused = _refuse_first_rmdir(monkeypatch)
    first = await trio_procown.run_owned(["true"], domain="cgroup")
    (path,) = refused
    try:
        assert os.path.isdir(path)
        claims = " ".join(first.receipt.claims())
        assert "removed once empty, at this process's next cgroup command or its exit" in claims, claims
        await trio_procown.run_owned(["true"], domain="cgroup")
        assert not os.path.exists(path)
    finally:
        if os.path.isdir(path):
            os.rmdir(path)


@pytest.mark.skipif("cgroup" not in DOMAINS, reason="the cgroup domain is unavailable here")
@pytest.mark.timeout(30)
def test_a_cgroup_still_populated_at_release_is_removed_at_exit(tmp_path: Path) -> None:
    """The same cgroup, when no later command comes: the owner's exit removes it."""
    script = tmp_path / "owner.py"
    script.write_text(
        "import errno, functools, os, trio, trio_procown\n"
        "from trio_procown import _stale\n"
        "real, refused = os.rmdir, []\n"
        "def rmdir(path, *a, **k):\n"
        "    name = _stale.parse(os.path.basename(path)) or ('', 0)\n"
        "    if name[:2] == ('command domain', os.getpid()) and not refused:\n"
        "        refused.append(path)\n"
        "        raise OSError(errno.EBUSY, 'busy')\n"
        "    real(path)\n"
        "os.rmdir = rmdir\n"
        "trio.run(functools.partial(trio_procown.run_owned, ['true'], domain='cgroup'))\n"
        "os.rmdir = real\n"
        "print(refused[0], os.path.isdir(refused[0]), flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=20, check=True
    )
    path, there = done.stdout.split()
    try:
        assert there == "True", done.stdout
        assert not os.path.exists(path)
    finally:
        if os.path.isdir(path):
            os.rmdir(path)


@pytest.mark.timeout(30)
async def test_a_failing_scan_is_recorded_and_the_teardown_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unforeseen failure inside a stage (here the process-table scan) is a step in the receipt;
    the later stages still run and the receipt does not claim emptiness it could not prove."""
    from trio_procown import _procfs

    async def broken(*args: object) -> object:
        raise OSError(errno.EMFILE, "Too many open files")

    async with trio_procown.open_owned_command(
        SLEEPER, domain="process-group", timeout=0.1, **BUDGETS
    ) as run:
        monkeypatch.setattr(_procfs, "table_for", broken)
        await run.wait()
    monkeypatch.undo()
    r = run.receipt
    assert r is not None
    errors = [s for s in r.steps if s.action is trio_procown.Action.ERROR]
    assert errors, r.steps
    assert "Too many open files" in errors[0].detail
    assert r.forced  # the stage that failed counted as expired: SIGKILL followed
    assert not alive(run.pid)
    assert any("an action of the teardown failed" in c for c in r.claims())


@pytest.mark.skipif("cgroup" not in DOMAINS, reason="the cgroup domain is unavailable here")
@pytest.mark.timeout(30)
async def test_unreadable_cgroup_events_prove_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """cgroup.events cannot be read (EACCES): the teardown still ends within its bound, the domain is
    NOT claimed empty, and the failed read is a step of the receipt."""
    from trio_procown import _cgroup

    def unreadable(*where: object) -> bool:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_cgroup, "populated", unreadable)
    monkeypatch.setattr(_cgroup, "populated_at", unreadable)  # through the descriptor kept open
    start = trio.current_time()
    result = await trio_procown.run_owned(SLEEPER, domain="cgroup", timeout=0.1, **BUDGETS)
    monkeypatch.undo()
    r = result.receipt
    assert trio.current_time() - start < BOUND
    assert not r.domain_empty
    errors = [s for s in r.steps if s.action is trio_procown.Action.ERROR and s.target == "domain"]
    assert errors, r.steps
    assert "cgroup.events" in errors[0].detail
    assert not alive(result.receipt.pid)  # cgroup.kill still ended it
