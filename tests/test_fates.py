"""Each process a receipt names gets the fate its own evidence shows, not the
teardown's overall outcome."""

from __future__ import annotations

import pytest

import trio_procown
from conftest import py
from helpers import alive, domains, pids_in
from trio_procown._choice import DomainName
from trio_procown._fates import Fates
from trio_procown._procfs import ProcInfo

# The leader exits at once, leaving two members behind: one obeys SIGTERM,
# the other ignores it (so the teardown is forced).
TWO_LEFTOVERS = """
import os, signal, time
for ignore in (False, True):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if ignore:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(w, b"x")
        time.sleep(30)
        os._exit(0)
    os.read(r, 1)
    print("pid", pid, flush=True)
"""


@pytest.mark.parametrize("domain", domains())
@pytest.mark.timeout(30)
async def test_leftover_ended_by_sigterm_is_terminated_even_when_the_teardown_was_forced(
    domain: DomainName,
) -> None:
    """Forced teardown of two leftovers: the SIGTERM-obeying one is 'terminated', the ignorer 'killed'."""
    result = await trio_procown.run_owned(py(TWO_LEFTOVERS), domain=domain, grace=0.5, kill_wait=1.0)
    obeys, ignores = pids_in(result.stdout)
    r = result.receipt
    assert r.forced
    assert not alive(obeys)
    assert not alive(ignores)
    fates = {p.pid: p.fate for p in r.leftovers}
    assert fates == {obeys: "terminated", ignores: "killed"}, r.claims()


def test_fate_rules_without_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """alive / killed / terminated / exited follow liveness at the graceful signal and the kill."""
    from trio_procown import _procfs

    table: dict[int, ProcInfo] = {}
    monkeypatch.setattr(_procfs, "read_stat", table.get)
    monkeypatch.setattr(_procfs, "cmdline", lambda pid: f"cmd{pid}")
    fates = Fates()
    for pid in (1001, 1002, 1003, 1004):
        table[pid] = ProcInfo(pid, 1, 1000, "S", 7)
        fates.watch(table[pid])
    del table[1004]  # gone before anything was sent
    fates.before_signal(None, kill=False)
    del table[1003]  # ended after SIGTERM
    fates.before_signal(None, kill=True)
    del table[1002]  # ended after SIGKILL
    table[1001] = ProcInfo(1001, 1, 1000, "S", 7)  # survives everything
    assert [fates.fate(p) for p in (1001, 1002, 1003, 1004)] == ["alive", "killed", "terminated", "exited"]
    table[1001] = ProcInfo(1001, 1, 1000, "S", 99)  # same pid, another process: ours is gone
    assert fates.fate(1001) == "killed"
