"""The census: escapees found by the token chain, never the leader, and an
honest word when environments could not be read."""

from __future__ import annotations

import os
import sys

import pytest
import trio

import trio_procown
from conftest import py
from helpers import ESCAPEE, alive, domains, kill_and_wait, pids_in
from trio_procown import _procfs
from trio_procown._census import COOKIE_VAR, Census

DOMAINS = domains()

# An inner program that owns `sleep` with trio_procown, ignores SIGTERM, and
# prints the sleep's pid: the inner owner's cookie must not hide the sleep
# from the outer owner.
INNER_OWNER = """
import signal, sys, trio, trio_procown
signal.signal(signal.SIGTERM, signal.SIG_IGN)
async def main():
    async with trio_procown.open_owned_command(
        ["sleep", "30"], domain="process-group", escapees="report", stdout="devnull"
    ) as run:
        print("pid", run.pid, flush=True)
        await trio.sleep(30)
trio.run(main)
"""


def test_token_chain_keeps_enclosing_owners() -> None:
    """A nested owner appends its token to the chain it inherited instead of replacing it."""
    outer = Census("terminate", Census.inherited({}))
    inner = Census("terminate", Census.inherited({COOKIE_VAR: outer.value}))
    assert inner.value.split(":") == [outer.token, inner.token]
    key = f"{COOKIE_VAR}=".encode()
    entry = key + inner.value.encode()
    assert _procfs.token_in(entry, key, outer.token.encode())
    assert _procfs.token_in(entry, key, inner.token.encode())
    assert not _procfs.token_in(entry, key, b"other")


def test_inherited_merges_environments_without_duplicates() -> None:
    """The chain comes from our environment and the command's env=, each token once, in order."""
    assert Census.inherited({COOKIE_VAR: "a:b"}, {COOKIE_VAR: "b:c"}, None) == "a:b:c"
    assert Census.inherited({}, None) is None


@pytest.mark.timeout(30)
async def test_nested_owner_does_not_hide_descendants_from_the_outer_owner() -> None:
    """An inner trio_procown owner that ignores SIGTERM: the outer owner still finds and ends the
    inner command's sleep (it left the outer process group), instead of claiming escaped=0 while
    it runs on."""
    result = await trio_procown.run_owned(
        [sys.executable, "-c", INNER_OWNER], domain="process-group", timeout=3.0, grace=0.3
    )
    pids = pids_in(result.stdout)
    assert len(pids) == 1, (result.stdout, result.stderr)
    (sleeper,) = pids
    try:
        assert not alive(sleeper), result.receipt.claims()
        assert sleeper in {p.pid for p in result.receipt.census}
    finally:
        kill_and_wait(sleeper)


@pytest.mark.skipif("cgroup" not in DOMAINS, reason="the cgroup domain is unavailable here")
@pytest.mark.timeout(60)
async def test_leader_caught_before_entering_its_cgroup_is_never_an_escapee() -> None:
    """Early cancels under the cgroup domain catch the leader while it is still the placement
    shim: it is the leader, never a process that 'left the domain'."""
    for _ in range(40):
        for timeout in (0.0, None):
            if timeout is None:
                with trio.move_on_after(0):
                    async with trio_procown.open_owned_command("sleep 30 & sleep 30", domain="cgroup") as run:
                        await run.wait()
            else:
                async with trio_procown.open_owned_command(
                    "sleep 30 & sleep 30", domain="cgroup", timeout=timeout
                ) as run:
                    await run.wait()
            r = run.receipt
            assert r is not None
            assert r.pid not in {p.pid for p in (*r.census, *r.escaped)}, r.claims()
            assert not any("left the domain" in c for c in r.claims()), r.claims()
            assert r.domain_empty


@pytest.mark.timeout(30)
async def test_unreadable_environments_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the census cannot read some environments (EACCES, as for a setuid descendant), the
    receipt says census_scanned=False, counts them, and claims() says what it could not see."""
    real = _procfs.read_environ

    def guarded(pid: int, unreadable: set[int] | None = None) -> bytes | None:
        if pid != os.getpid() and unreadable is not None:
            unreadable.add(pid)
            return None
        return real(pid, unreadable)

    monkeypatch.setattr(_procfs, "read_environ", guarded)
    monkeypatch.setattr(_procfs, "NATIVE_SCAN", False)  # a shared scan reads through `guarded` too
    # A setsid member (outside the group, so the census must read it) that
    # the census cannot see: it survives, and the receipt must not pretend.
    result = await trio_procown.run_owned(
        py(ESCAPEE + "import time\ntime.sleep(30)\n"), domain="process-group", timeout=0.3, grace=0.5
    )
    monkeypatch.undo()
    (escapee,) = pids_in(result.stdout)
    try:
        r = result.receipt
        assert r.census_scanned is False
        assert r.census_unreadable >= 1
        assert r.escaped == ()
        assert any("could not read the environment" in c for c in r.claims())
        assert r.to_dict()["census_scanned"] is False
    finally:
        kill_and_wait(escapee)
