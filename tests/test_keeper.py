"""The keeper: nothing an owned command starts outlives its owner.

An owner killed with SIGKILL (a child interpreter running one owned command
whose tree has a grandchild and a setsid escapee) has its tree ended by its
keeper within 3 s, on every domain; a keeper that is itself killed is
replaced and the receipts say which commands were unguarded; an owner that
opted out leaves its tree, and `procown doctor --clean` ends a stale cgroup;
the keeper never signals what it was not told about; receipts say what the
census cannot see (escape_evidence). Every test ends what it started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

import trio_procown
from conftest import MARKER, MARKER_VAR
from helpers import domains, kill_and_wait
from trio_procown import _cgroup, _keeper, _stale
from trio_procown._census import COOKIE_VAR

pytest_plugins = ["pytester"]

TAG_VAR = "PROCOWN_KEEPER_TEST_TAG"
TREE = "sleep 30 & setsid sleep 30 & echo up; wait"  # a grandchild and a setsid escapee
WITHIN = 3.0  # the acceptance bound: nothing of the tree alive, no cgroup, after the owner's SIGKILL

# The owner: one owned command, tagged (argv: DOMAIN KEEPER TAG); prints
# "ready PID DOMAIN_ID KEEPER_PID" once the tree is up, then waits forever.
OWNER = f"""
import os, sys, trio, trio_procown
from trio_procown import _keeper

async def main():
    env = dict(os.environ, {TAG_VAR}=sys.argv[3])
    async with trio_procown.open_owned_command(
        {TREE!r}, domain=sys.argv[1], keeper=sys.argv[2] == "1", env=env
    ) as run:
        async for _ in run.lines():
            break
        print("ready", run.pid, run.domain_id.replace(" ", "_"), _keeper.current_pid(), flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


# -- process helpers ---------------------------------------------------------------


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _live(pid: int) -> bool:
    row = _keeper.stat(pid)
    return row is not None and not row.zombie


def _is_keeper(pid: int) -> bool:
    """Is `pid` a live keeper (its command line says so)?"""
    try:
        return _live(pid) and b"_keeper.serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def tagged(tag: str) -> list[int]:
    """Live processes carrying the test's tag."""
    entry = f"{TAG_VAR}={tag}".encode()
    return [
        int(n)
        for n in os.listdir("/proc")
        if n.isdigit() and _live(int(n)) and entry in _environ(int(n)).split(b"\0")
    ]


def kill_tagged(tag: str) -> None:
    """SIGKILL what is left of a tagged tree (tag re-checked through a pidfd)."""
    entry = f"{TAG_VAR}={tag}".encode()
    for _ in range(5):
        left = tagged(tag)
        if not left:
            return
        for pid in left:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if entry in _environ(pid).split(b"\0"):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)
        time.sleep(0.05)


def wait_until(predicate: Callable[[], object], bound: float) -> float | None:
    """Seconds until `predicate()` held, or None if not within `bound`."""
    start = time.monotonic()
    while time.monotonic() - start < bound:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.01)
    return None


@contextmanager
def owner(
    domain: str, *, keeper: bool = True, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], list[str], str]]:
    """A child interpreter owning the tagged TREE; yields it, its ready line
    and the tag. Whatever it leaves is killed at the end."""
    tag = secrets.token_hex(8)
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, domain, "1" if keeper else "0", tag],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **(env or {})),
        start_new_session=True,  # a group of its own, killed whole below
    )
    keeper_pid = 0
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        keeper_pid = int(ready[3])
        # The shell, its sleep and the setsid sleep (echo may run before they exec).
        assert wait_until(lambda: len(tagged(tag)) == 3, 5) is not None, tagged(tag)
        yield proc, ready, tag
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        kill_tagged(tag)
        if keeper_pid and _is_keeper(keeper_pid):
            kill_and_wait(keeper_pid)


def _cgroup_of_ready(ready: list[str]) -> str | None:
    return ready[2] if ready[2].startswith("/") else None


def _remove_cgroup(path: str | None) -> None:
    if path and os.path.isdir(path):
        _keeper.end_domains([_keeper.Entry(0.0, cgroup=path)], kill_wait=1.0)


# -- the owner dies -------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("domain", domains())
def test_owner_sigkilled_its_tree_and_cgroup_are_gone_within_the_bound(domain: str) -> None:
    """SIGKILL of the owner's whole process group: the keeper (in its own session) survives it,
    ends the shell, its grandchild and the setsid escapee (census token) within 3 s, removes the
    cgroup, and exits."""
    with owner(domain) as (proc, ready, tag):
        cgroup = _cgroup_of_ready(ready)
        keeper_pid = int(ready[3])
        assert keeper_pid > 0
        assert _live(keeper_pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        took = wait_until(lambda: not tagged(tag) and not (cgroup and os.path.isdir(cgroup)), WITHIN)
        try:
            assert took is not None, f"left after {WITHIN}s: {tagged(tag)}, cgroup {cgroup}"
            assert wait_until(lambda: not _live(keeper_pid), WITHIN) is not None, "the keeper did not exit"
        finally:
            _remove_cgroup(cgroup)


# An owner that dies the moment its first command's spawn returns (as one
# whose command kills it at once would: `sh -c 'kill -9 $PPID'`), before the
# library has done anything after the clone. argv: DOMAIN TAG.
DIES_AT_SPAWN = f"""
import os, signal, sys, trio, trio_procown
from trio_procown import _leader

spawn = _leader.Leader.spawn.__func__

def spawn_then_die(cls, *args, **kwargs):
    leader = spawn(cls, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
    return leader

_leader.Leader.spawn = classmethod(spawn_then_die)

async def main():
    env = dict(os.environ, {TAG_VAR}=sys.argv[2])
    await trio_procown.run_owned({TREE!r}, domain=sys.argv[1], env=env)

trio.run(main)
"""


def _keepers_of(owner_pid: int) -> list[int]:
    """Live keepers serving `owner_pid` (their command line names it)."""
    serving = f"_keeper.serve({owner_pid})".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _live(int(name)):
            with contextlib.suppress(OSError):
                if serving in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
    return found


@pytest.mark.timeout(30)
@pytest.mark.parametrize("domain", domains())
def test_owner_killed_as_the_spawn_returns_leaves_nothing(domain: str) -> None:
    """The keeper is told of a domain before its spawn (its cgroup and census token), so an owner
    SIGKILLed before anything after the clone ran still has its command ended, and its cgroup
    removed, within the bound."""
    tag = secrets.token_hex(8)
    with contextlib.ExitStack() as stack:
        env = dict(os.environ)
        if domain == "cgroup":
            env[_cgroup.ROOT_ENV] = root = stack.enter_context(private_cgroup_root())
        proc = subprocess.Popen(
            [sys.executable, "-c", DIES_AT_SPAWN, domain, tag],
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            assert proc.wait(10) == -signal.SIGKILL
            took = wait_until(lambda: not tagged(tag) and not _keepers_of(proc.pid), WITHIN)
            assert took is not None, f"left after {WITHIN}s: {tagged(tag)}, keeper {_keepers_of(proc.pid)}"
            if domain == "cgroup":
                assert not [n for n in os.listdir(root) if n.startswith(f"procown-{proc.pid}-")]
        finally:
            kill_tagged(tag)
            for pid in _keepers_of(proc.pid):
                kill_and_wait(pid)


def test_lines_told_before_and_after_the_spawn_make_one_entry() -> None:
    """The "open" line told before the spawn (no leader yet) and the "lead" line told after it
    make one entry with the leader; a "lead" for a domain never opened, or already closed, is
    ignored; "bye" ends the reading."""
    domains: dict[bytes, list[bytes]] = {}
    pending = _keeper.Entry(2.0, 0, 0, "tok", "/sys/fs/cgroup/x").line(7).rstrip(b"\n")
    assert _keeper.take_line(domains, pending)
    assert _keeper.take_line(domains, b"lead\t7\t4242\t99")
    assert _keeper.take_line(domains, b"lead\t8\t5151\t1")
    entry = _keeper.Entry.parse(domains[b"7"])
    assert entry is not None
    assert (entry.grace, entry.leader, entry.start, entry.token, entry.cgroup) == (
        2.0,
        4242,
        99,
        "tok",
        "/sys/fs/cgroup/x",
    )
    assert list(domains) == [b"7"]
    assert _keeper.take_line(domains, b"close\t7")
    assert _keeper.take_line(domains, b"lead\t7\t4242\t99")
    assert domains == {}
    assert not _keeper.take_line(domains, b"bye")


@contextmanager
def private_cgroup_root() -> Iterator[str]:
    """A cgroup root of this test's own, under a name no sweep judges (so
    no other process's first-use sweep ends what is in it); removed at the end."""
    root = _cgroup.default_root()
    assert root is not None
    path = os.path.join(os.path.realpath(root), f"keeper-test-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(path)
    try:
        yield path
    finally:
        _keeper.end_domains([_keeper.Entry(0.0, cgroup=path)], kill_wait=1.0)


@pytest.fixture
def private_root() -> Iterator[str]:
    if "cgroup" not in domains():
        pytest.skip("no cgroup domain here")
    with private_cgroup_root() as path:
        yield path


@pytest.mark.timeout(30)
@pytest.mark.parametrize("domain", domains())
def test_opted_out_owner_leaves_its_tree(domain: str) -> None:
    """An owner that opted out (TRIO_PROCOWN_NO_KEEPER=1) starts no keeper: SIGKILLed, its tree runs on."""
    with contextlib.ExitStack() as stack:
        env = {_keeper.NO_KEEPER_ENV: "1"}
        if domain == "cgroup":
            env[_cgroup.ROOT_ENV] = stack.enter_context(private_cgroup_root())
        proc, ready, tag = stack.enter_context(owner(domain, env=env))
        assert ready[3] == "0", "no keeper"
        proc.kill()
        proc.wait(5)
        time.sleep(0.3)
        assert len(tagged(tag)) == 3


def doctor(root: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_procown", "doctor", *args],
        env=dict(os.environ, **{_cgroup.ROOT_ENV: root}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@pytest.mark.timeout(60)
def test_stale_cgroup_of_a_dead_owner_is_listed_and_cleaned_by_doctor(private_root: str) -> None:
    """An opted-out owner SIGKILLed leaves a stale cgroup: `procown doctor` lists it (owner gone),
    `procown doctor --clean` ends its processes and removes it."""
    env = {_keeper.NO_KEEPER_ENV: "1", _cgroup.ROOT_ENV: private_root}
    with owner("cgroup", env=env) as (proc, ready, tag):
        cgroup = _cgroup_of_ready(ready)
        assert cgroup is not None
        assert os.path.dirname(cgroup) == private_root
        owner_pid = proc.pid
        proc.kill()
        proc.wait(5)
        listed = doctor(private_root)
        assert listed.returncode == 0, listed.stderr
        assert f"stale domains: 1 under {private_root}" in listed.stdout
        assert f"{cgroup}: command domain of pid {owner_pid} started at tick" in listed.stdout
        assert "3 process(es) still in it" in listed.stdout
        assert len(tagged(tag)) == 3, "listing ends nothing"
        cleaned = doctor(private_root, "--clean")
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert f"  {cgroup}: removed" in cleaned.stdout
        assert tagged(tag) == []
        assert not os.path.isdir(cgroup)
        assert f"stale domains: none under {private_root}" in doctor(private_root).stdout


@pytest.mark.timeout(30)
def test_first_use_sweeps_stale_cgroups_of_its_root(private_root: str) -> None:
    """A process's first command in a root ends and removes the stale cgroups found there (bounded)."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = os.path.join(private_root, f"procown-{int(dead.stdout)}-0-abcdef-s1")
    os.mkdir(stale)
    sleeper = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        _cgroup.move(sleeper.pid, stale)
        done = subprocess.run(
            [sys.executable, "-c", "import trio, trio_procown; trio.run(trio_procown.run_owned, ['true'])"],
            env=dict(os.environ, **{_cgroup.ROOT_ENV: private_root}),
            stdin=subprocess.DEVNULL,
            timeout=20,
            check=True,
        )
        assert done.returncode == 0
        assert sleeper.wait(5) == -signal.SIGTERM
        assert not os.path.isdir(stale)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


# -- the keeper's own failures ----------------------------------------------------------


async def test_keeper_killed_is_replaced_and_receipts_say_which_were_unguarded() -> None:
    """A keeper SIGKILLed while a command runs: the next spawn starts another, told every open
    domain; the running command's receipt says "replaced", the new one's "guarded"."""
    async with trio_procown.open_owned_command(["sleep", "30"]) as first:
        old = _keeper.current_pid()
        assert old > 0
        kill_and_wait(old)
        async with trio_procown.open_owned_command(["sleep", "30"]) as second:
            new = _keeper.current_pid()
            assert new not in (0, old)
            await second.terminate()
        await first.terminate()
    assert second.receipt is not None
    assert first.receipt is not None
    assert second.receipt.keeper == "guarded"
    assert first.receipt.keeper == "replaced"
    assert any("a new keeper was told of the domain" in c for c in first.receipt.claims())
    assert not any("keeper" in c for c in second.receipt.claims())


async def test_keeper_killed_before_the_release_is_lost() -> None:
    """A keeper SIGKILLed and not replaced before the command's release: the receipt says "lost"."""
    async with trio_procown.open_owned_command(["sleep", "30"]) as run:
        kill_and_wait(_keeper.current_pid())
        await run.terminate()
    assert run.receipt is not None
    assert run.receipt.keeper == "lost"
    assert any("was gone before the domain was released" in c for c in run.receipt.claims())
    assert run.receipt.to_dict()["keeper"] == "lost"


async def test_keeper_that_cannot_start_is_said_in_the_receipt(monkeypatch: pytest.MonkeyPatch) -> None:
    """No keeper could be started: the command runs, and its receipt says no keeper was running, and why."""
    assert _keeper.retire(), "no command of this process is open"
    monkeypatch.setattr(_keeper, "argv", lambda owner: ["/nonexistent/procown-keeper", str(owner)])
    result = await trio_procown.run_owned(["true"])
    r = result.receipt
    assert (r.cause, r.keeper) == ("exited", "unavailable")
    assert "FileNotFoundError" in r.extras["keeper_note"]
    assert any(
        c.startswith("No keeper was running for this command (the keeper could not") for c in r.claims()
    )
    monkeypatch.undo()
    assert (await trio_procown.run_owned(["true"])).receipt.keeper == "guarded"


async def test_opting_out_by_argument_and_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """keeper=False and TRIO_PROCOWN_NO_KEEPER=1 each opt out; the receipt says so."""
    by_argument = (await trio_procown.run_owned(["true"], keeper=False)).receipt
    monkeypatch.setenv(_keeper.NO_KEEPER_ENV, "1")
    by_environment = (await trio_procown.run_owned(["true"])).receipt
    for r, why in ((by_argument, "keeper=False"), (by_environment, _keeper.NO_KEEPER_ENV)):
        assert r.keeper == "opted out"
        assert why in r.extras["keeper_note"]
        assert any(
            c.startswith("No keeper was running for this command (opted out")
            and "nothing would have ended the domain" in c
            for c in r.claims()
        )


async def test_forked_child_never_speaks_for_the_owner() -> None:
    """A child forked by the owner has no keeper of its parent's (its copy of the pipe is closed);
    the owner's keeper is untouched by the child's exit."""
    async with trio_procown.open_owned_command(["sleep", "30"]) as run:
        keeper_pid = _keeper.current_pid()
        client = _keeper._client
        assert client is not None
        assert client.fd >= 0
        fd = client.fd
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.fstat(fd)
                ok = False  # still open: it could speak for the parent
            except OSError:
                ok = _keeper.current_pid() == 0
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert _live(keeper_pid)
        await run.terminate()
    assert run.receipt is not None
    assert run.receipt.keeper == "guarded"


def _keeper_fds(pid: int) -> dict[int, str]:
    return {int(n): os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}


async def _set_up(pid: int) -> dict[int, str]:
    """The keeper's descriptors once it has set itself up (cwd "/", a pidfd on the owner: its
    last step before it waits); it may have been started by this test's command."""
    with trio.fail_after(10):
        while True:
            fds = _keeper_fds(pid)
            if os.readlink(f"/proc/{pid}/cwd") == "/" and "anon_inode:[pidfd]" in fds.values():
                return fds
            await trio.sleep(0.01)


async def test_keeper_holds_nothing_of_the_owner() -> None:
    """The keeper runs in its own session, in "/", with stdout/stderr on /dev/null, the lines' pipe
    as stdin, the bell as fd 3, and only the cookies of the environment (no marker of ours)."""
    await trio_procown.run_owned(["true"])
    pid = _keeper.current_pid()
    info = _keeper.stat(pid)
    assert info is not None
    assert info.pgrp == pid
    fds = await _set_up(pid)
    assert fds[0].startswith("pipe:")
    assert fds[_keeper.BELL].startswith("pipe:")
    assert fds[0] != fds[_keeper.BELL]
    assert fds[1] == fds[2] == os.devnull
    assert set(fds) == {0, 1, 2, _keeper.BELL, _keeper.BELL + 1}  # and a pidfd on the owner
    env = _environ(pid)
    assert f"{MARKER_VAR}={MARKER}".encode() not in env
    assert {e.split(b"=")[0].decode() for e in env.split(b"\0") if e} <= set(_keeper.KEPT_ENV)


def _ignored(pid: int) -> set[int]:
    """The signals `pid` ignores, from its SigIgn mask."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


async def test_keeper_ignores_every_signal_an_enclosing_teardown_may_begin_with() -> None:
    """An enclosing owner signals its whole domain, the keeper with it, with its own first signal
    (GNU-style `timeout -s ALRM` around a nested procown ended the nested keeper): the keeper
    ignores each signal whose default ends a process and that another process sends, and keeps
    the defaults of its own faults."""
    await trio_procown.run_owned(["true"])
    pid = _keeper.current_pid()
    await _set_up(pid)
    ignored = _ignored(pid)
    sent: set[int] = {signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1}
    sent |= {signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGPOLL, signal.SIGPWR}
    sent |= set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    assert sent <= ignored
    faults = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGSYS}
    assert not faults & ignored


def _wakeups(pid: int) -> int:
    """How many times `pid` has gone to sleep and been woken (voluntary context switches)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


async def test_keeper_sleeps_through_its_owners_commands() -> None:
    """The keeper is not woken by the lines of each command (a wakeup takes CPU from the spawn):
    commands told and released one by one, apart, leave it asleep; the owner rings the bell once
    RING_AT bytes are unread, and that wakes it (that the lines then reach it is proven by the
    tests that kill the owner)."""
    await trio_procown.run_owned(["true"])
    pid = _keeper.current_pid()
    await _set_up(pid)
    before = _wakeups(pid)
    client = _keeper._client
    assert client is not None
    for _ in range(5):
        await trio.sleep(0.06)  # apart: an earlier keeper read in 50 ms batches, woken by the first line
        await trio_procown.run_owned(["true"])
        assert 0 < client.unread < _keeper.RING_AT
    assert _wakeups(pid) == before
    async with trio_procown.open_owned_command(["sleep", "30"]) as run:
        with trio.fail_after(30):
            while True:  # until the bell rings: the lines of commands spawned meanwhile
                unread = client.unread
                await trio_procown.run_owned(["true"])
                if client.unread < unread:  # rung: back to 0 (then this command's later lines)
                    break
        with trio.fail_after(10):
            while _wakeups(pid) == before:
                await trio.sleep(0.01)
        await run.terminate()
    assert run.receipt is not None
    assert run.receipt.keeper == "guarded"


# -- the ladder never signals what it was not told about ----------------------------


@pytest.mark.timeout(30)
def test_ladder_spares_a_group_it_cannot_prove_is_the_commands() -> None:
    """A group whose leader's start time differs from the one told, with no member carrying the
    token, is not signalled; with a member carrying the token it is, and a TERM-ignorer gets SIGKILL."""
    token = secrets.token_hex(12)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True, stdin=subprocess.DEVNULL)
    env = dict(os.environ, **{COOKIE_VAR: f"outer:{token}"})
    ignorer = "trap '' TERM; echo up; while :; do sleep 0.05; done"
    ours = subprocess.Popen(
        ["sh", "-c", ignorer],
        start_new_session=True,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    try:
        assert ours.stdout is not None
        assert ours.stdout.readline() == b"up\n"
        start = time.monotonic()
        outcome = _keeper.end_domains(
            [
                _keeper.Entry(0.2, stranger.pid, 1, secrets.token_hex(12)),  # wrong start, another token
                _keeper.Entry(0.3, ours.pid, 1, token),  # wrong start, but its members carry the token
            ],
            kill_wait=1.0,
        )
        assert outcome == ["", ""]
        assert time.monotonic() - start < 0.3 + 1.0 + 0.5
        assert stranger.poll() is None
        assert ours.wait(2) == -signal.SIGKILL
    finally:
        for p in (stranger, ours):
            if p.poll() is None:
                p.kill()
            p.wait()
        if ours.stdout is not None:
            ours.stdout.close()


# -- what the census cannot see ----------------------------------------------------------


async def test_escape_evidence_names_what_the_census_cannot_see() -> None:
    """Process-group receipts say escape_evidence "census" and that a setsid + cleared-environment
    descendant is invisible (measured: it runs on while the domain is seen empty); cgroup receipts
    say "kernel" without that sentence."""
    # The shell exits once its child has left the group (pgrp, field 5 of stat, no longer ours).
    hide = (
        "env -i setsid sleep 30 & while [ $(cut -d' ' -f5 /proc/$!/stat) = $$ ]; do sleep 0.01; done; echo $!"
    )
    result = await trio_procown.run_owned(hide, domain="process-group", timeout=5)
    hidden = int(result.stdout.split()[0])
    try:
        r = result.receipt
        assert (r.escape_evidence, r.domain_empty, r.census) == ("census", True, ())
        assert _live(hidden), "invisible to the census: it runs on"
        assert any("called setsid() and cleared its environment is invisible" in c for c in r.claims())
        assert r.to_dict()["escape_evidence"] == "census"
    finally:
        if _live(hidden) and b"sleep" in Path(f"/proc/{hidden}/cmdline").read_bytes():
            kill_and_wait(hidden)
    if "cgroup" in domains():
        k = (await trio_procown.run_owned(["true"], domain="cgroup")).receipt
        assert k.escape_evidence == "kernel"
        assert not any("census, through the environment cookie" in c for c in k.claims())


def test_escape_evidence_defaults_to_the_weaker_claim() -> None:
    """A receipt built without the field claims the census's evidence, never the kernel's."""
    r = trio_procown.Receipt(
        cause="exited", returncode=0, domain="x", forced=False, domain_empty=True, output="complete"
    )
    assert r.escape_evidence == "census"
    assert r.keeper == "unknown"
    assert not any("keeper" in c for c in r.claims())
    other = trio_procown.Receipt(
        cause="exited",
        returncode=0,
        domain="slurm",
        forced=False,
        domain_empty=True,
        output="complete",
        escape_evidence="slurm-step",
    )
    assert any("are known by slurm-step, not by the kernel" in c for c in other.claims())


# -- names of stale domains (no processes) ---------------------------------------------------


def test_cgroup_names_record_the_owner_and_its_start_time() -> None:
    """A command cgroup's name carries the owner's pid and start time; parse() reads it back."""
    name = _stale.cgroup_name(7)
    what, pid, start = _stale.parse(name) or ("", 0, 0)
    assert (what, pid) == ("command domain", os.getpid())
    assert start == _keeper.process_start(os.getpid()) > 0
    assert not _stale.owner_gone(pid, start)
    assert _stale.owner_gone(pid, start + 1), "same pid, another start: not our owner"


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("procown-123-4-abcdef-s99", ("command domain", 123, 99)),
        ("procown-123-4-abcdef", ("command domain", 123, 0)),  # from before start times
        ("procown-test-123-0123456789abcdef", ("leak-check window", 123, 0)),
        ("procown-pytest-probe-123-0a1b2c3d", ("probe", 123, 0)),
        ("procown-test-placement-a1b2c3", None),
        ("procownx-1-2-3", None),
        ("user.slice", None),
    ],
)
def test_stale_names(name: str, parsed: tuple[str, int, int] | None) -> None:
    """Only the library's own name formats are judged; others are left alone."""
    assert _stale.parse(name) == parsed


def test_owner_without_start_time_is_gone_only_without_its_pid() -> None:
    """An old name (no start time) is stale only when no process has its pid."""
    assert not _stale.owner_gone(os.getpid(), 0)
    assert not _stale.owner_gone(1, 0)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert _stale.owner_gone(int(dead.stdout), 0)


def test_keeper_is_never_a_tests_leak_and_is_retired_at_session_end(pytester: pytest.Pytester) -> None:
    """Under the leak check, a test whose owned command starts the keeper passes (the keeper is
    spared), and the session's end tells it goodbye: it has exited when the run returns."""
    record = pytester.path / "keeper.txt"
    pytester.makepyfile(
        test_inner=f"""
import trio, trio_procown
from trio_procown import _keeper

def test_owned():
    trio.run(trio_procown.run_owned, ["true"])
    with open({str(record)!r}, "w") as f:
        f.write(str(_keeper.current_pid()))
"""
    )
    result = pytester.runpytest("--procown-leaks=fail", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    assert "left behind" not in result.stdout.str()
    pid = int(record.read_text())
    assert pid > 0
    assert not _live(pid)
    assert _keeper.current_pid() == 0


# A nested owner that ignores SIGTERM, running in a cgroup a command that
# ignores it too; it prints the command's cgroup once the command is up.
NESTED_OWNER = """
import signal, sys, trio, trio_procown
signal.signal(signal.SIGTERM, signal.SIG_IGN)
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)
async def main():
    command = [sys.executable, "-c", STUBBORN, sys.argv[1]]
    async with trio_procown.open_owned_command(command, domain="cgroup") as run:
        async for _line in run.lines():
            break
        print(run.domain_id, flush=True)
        await trio.sleep(60)
trio.run(main)
"""


@pytest.mark.timeout(30)
async def test_nested_owner_killed_with_its_keeper_leaves_no_cgroup(
    private_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outer owner on the process-group domain forces a nested owner
    (SIGTERM ignored) and, through the census, the nested owner's keeper,
    before that keeper could remove the nested command's cgroup: the outer
    teardown removes the cgroup, empty by then, and its receipt says so."""
    monkeypatch.setenv(_cgroup.ROOT_ENV, private_root)
    outer = [sys.executable, "-c", NESTED_OWNER, MARKER]
    async with trio_procown.open_owned_command(
        outer, domain="process-group", grace=0.3, kill_wait=1.0, drain_wait=0.5
    ) as run:
        async for line in run.lines():
            inner = line.strip()
            break
        await run.terminate()
    receipt = run.receipt
    assert receipt is not None
    assert receipt.forced, receipt.steps
    assert os.path.dirname(inner) == private_root
    assert not os.path.exists(inner), receipt.steps
    (tidied,) = [step for step in receipt.steps if step.target == "stale domains"]
    assert tidied.outcome == "removed"
    assert inner in tidied.detail
