"""Ownership domains: cgroup v2, the census of escapees, and domain selection."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
import trio
import trio.testing

import trio_procown
from conftest import py
from helpers import ESCAPEE, alive, domains, kill_and_wait, pids_in
from trio_procown import _cgroup

HAS_CGROUP = "cgroup" in domains()
needs_cgroup = pytest.mark.skipif(not HAS_CGROUP, reason="no writable cgroup v2 here")

# A setsid escapee (it has left the group when "pid N" is printed), then the
# leader sleeps.
SETSID_ESCAPEE = py(ESCAPEE + "time.sleep(30)\n")

# A classic double-forked daemon: fork, setsid, fork again, parent exits.
DAEMON = (
    "import os, sys, time\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.write(w, b'%d\\n' % os.getpid())\n"
    "        devnull = os.open(os.devnull, os.O_RDWR)\n"
    "        for fd in (0, 1, 2): os.dup2(devnull, fd)\n"
    "        time.sleep(30)\n"
    "    os._exit(0)\n"
    "daemon = int(os.read(r, 64))\n"
    "os.write(1, b'pid %d\\n' % daemon)\n"
)


def _cleanup(pids: list[int]) -> None:
    """Kill processes this test started and deliberately left (report mode)."""
    for pid in pids:
        if alive(pid):
            kill_and_wait(pid)


def _our_cgroups() -> list[str]:
    root = _cgroup.default_root()
    if root is None:
        return []
    prefix = f"procown-{os.getpid()}-"
    return [n for n in os.listdir(root) if n.startswith(prefix)]


async def test_setsid_escapee_is_caught_by_census_under_process_group() -> None:
    """Under the process group a setsid member leaves the domain; the census finds and terminates it."""
    result = await trio_procown.run_owned(SETSID_ESCAPEE, timeout=1.0, domain="process-group")
    (escapee,) = pids_in(result.stdout)
    r = result.receipt
    assert not alive(escapee)
    assert [p.pid for p in r.census] == [escapee]
    assert r.escaped == ()
    assert any("left the domain" in c and "terminated" in c for c in r.claims())


async def test_setsid_escapee_reported_only_under_report_policy() -> None:
    """escapees="report" lists a live escapee in receipt.escaped and does not signal it."""
    result = await trio_procown.run_owned(
        SETSID_ESCAPEE, timeout=0.5, domain="process-group", escapees="report"
    )
    (escapee,) = pids_in(result.stdout)
    try:
        assert alive(escapee)
        assert [p.pid for p in result.receipt.escaped] == [escapee]
        assert sys.executable in result.receipt.escaped[0].cmdline
        assert any("still alive at the end" in c for c in result.receipt.claims())
    finally:
        _cleanup([escapee])


async def test_double_forked_daemon_after_exit_process_group() -> None:
    """A double-forked daemon outlives a clean exit: the census terminates it."""
    result = await trio_procown.run_owned(py(DAEMON), domain="process-group")
    (daemon,) = pids_in(result.stdout)
    assert result.receipt.cause == "exited"
    assert not alive(daemon)
    assert [p.pid for p in result.receipt.census] == [daemon]


async def _held_sleeper(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A command that runs until cancelled; started: its leader's pid."""
    sleeper = py("import time; time.sleep(30)")
    async with trio_procown.open_owned_command(sleeper, domain="process-group") as run:
        task_status.started(run.pid)
        await run.wait()


async def test_census_finds_a_daemon_among_other_commands_leaders(probed: list[int]) -> None:
    """Other commands spawned while this one runs hold their leaders' pids in its census range:
    those are not probed (each leads its own session, without this command's cookie), and
    the daemon the command left among them is still found and terminated."""
    send, receive = trio.testing.memory_stream_one_way_pair()
    gated = py("import sys; sys.stdin.readline()\n" + DAEMON)
    async with trio.open_nursery() as nursery:
        async with trio_procown.open_owned_command(gated, stdin=receive, domain="process-group") as run:
            others = [await nursery.start(_held_sleeper) for _ in range(3)]
            await send.send_all(b"go\n")
            await send.aclose()
            receipt = await run.wait()
            seen = list(probed)  # (the others' own teardowns probe too, later)
        nursery.cancel_scope.cancel()
    (daemon,) = pids_in(run.stdout)
    assert receipt.cause == "exited"
    assert not alive(daemon)
    assert [p.pid for p in receipt.census] == [daemon]
    assert daemon in seen
    assert not set(others) & set(seen)


@needs_cgroup
@pytest.mark.parametrize("command", ["setsid", "daemon"])
async def test_cgroup_holds_setsid_and_daemons(command: str) -> None:
    """Under the cgroup domain setsid members and daemons never leave: no census hit, none alive."""
    cmd = py(DAEMON) if command == "daemon" else SETSID_ESCAPEE
    result = await trio_procown.run_owned(cmd, timeout=None if command == "daemon" else 1.0, domain="cgroup")
    (pid,) = pids_in(result.stdout)
    r = result.receipt
    assert not alive(pid)
    assert r.census == ()
    assert r.escaped == ()
    assert r.domain_empty
    assert r.domain_id.startswith(_cgroup.default_root() or "")


@needs_cgroup
async def test_cgroup_spawn_race_command_that_forks_at_once() -> None:
    """A command that forks immediately: its children are always inside the cgroup (never census hits)."""
    for _ in range(20):
        result = await trio_procown.run_owned(
            "sleep 30 & sleep 30 & echo ready; sleep 30", timeout=0.05, grace=1.0, domain="cgroup"
        )
        r = result.receipt
        assert r.census == (), r.claims()
        assert r.domain_empty
        assert not r.forced


@needs_cgroup
async def test_cgroup_directories_are_removed_on_every_way_out() -> None:
    """No cgroup directory is left after a natural exit, a timeout, a cancel and an error."""
    before = _our_cgroups()
    await trio_procown.run_owned("true", domain="cgroup")
    await trio_procown.run_owned("sleep 30", timeout=0.1, domain="cgroup")
    with trio.move_on_after(0.1):
        await trio_procown.run_owned("sleep 30", domain="cgroup")
    with pytest.raises(RuntimeError):
        async with trio_procown.open_owned_command("sleep 30", domain="cgroup"):
            raise RuntimeError("body failed")
    assert _our_cgroups() == before


@needs_cgroup
async def test_cgroup_receipt_records_path_and_kill() -> None:
    """A forced cgroup teardown uses cgroup.kill and records the cgroup path."""
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(30)\n"
    result = await trio_procown.run_owned(py(code), timeout=1.0, grace=0.2, domain="cgroup")
    r = result.receipt
    assert r.forced
    assert r.domain_empty
    assert any("cgroup.kill" in s.detail for s in r.steps)
    assert any(s.action is trio_procown.Action.RELEASE and "removed cgroup" in s.detail for s in r.steps)


async def test_auto_falls_back_when_cgroups_are_not_usable(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pointed at a location that cannot hold cgroups, auto falls back to the process group."""
    monkeypatch.setenv(_cgroup.ROOT_ENV, str(tmp_path))
    options = {o.name: o for o in trio_procown.available_domains()}
    assert not options["cgroup"].available
    assert "not a cgroup v2 directory" in options["cgroup"].reason
    assert trio_procown.auto_choice().name == "process-group"
    result = await trio_procown.run_owned("echo hi")
    assert result.receipt.domain == "process-group"


async def test_auto_falls_back_on_a_read_only_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only cgroup-like location (here /proc/self) is refused with a reason."""
    monkeypatch.setenv(_cgroup.ROOT_ENV, "/proc/self")
    reason = _cgroup.unavailable_reason()
    assert reason is not None
    assert trio_procown.auto_choice().name == "process-group"


async def test_asking_for_an_unavailable_domain_raises_with_reason(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """domain="cgroup" never falls back: it raises DomainUnavailable saying why."""
    monkeypatch.setenv(_cgroup.ROOT_ENV, str(tmp_path))
    with pytest.raises(trio_procown.DomainUnavailable, match="not a cgroup v2 directory"):
        await trio_procown.run_owned("true", domain="cgroup")


async def test_unknown_domain_name_is_a_value_error() -> None:
    """A misspelt domain is a ValueError."""
    with pytest.raises(ValueError, match="domain must be"):
        await trio_procown.run_owned("true", domain="cgroups")  # type: ignore[arg-type]


async def test_bad_escapee_policy_is_a_value_error() -> None:
    """An unknown escapees policy is a ValueError."""
    with pytest.raises(ValueError, match="escapees"):
        await trio_procown.run_owned("true", escapees="ignore")  # type: ignore[arg-type]


def test_subreaper_mode_reaps_orphans() -> None:
    """With subreaper mode, zombies of the domain are reaped by us and the receipt says so."""
    script = (
        "import trio, trio_procown\n"
        "async def main():\n"
        "    r = await trio_procown.run_owned('sleep 30 & sleep 30', timeout=0.3,"
        " domain='process-group', subreaper=True)\n"
        "    print(r.receipt.unreaped == (), r.receipt.extras.get('reaped_orphans', 0))\n"
        "trio.run(main)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30, check=True)
    unreaped_none, reaped = out.stdout.decode().split()
    assert unreaped_none == "True"
    assert int(reaped) >= 1


async def test_process_group_domain_on_a_non_posix_platform_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a non-POSIX platform the process-group domain raises DomainUnavailable, nothing is spawned."""
    from trio_procown import _choice

    monkeypatch.setattr(_choice, "is_posix", lambda: False)
    with pytest.raises(trio_procown.DomainUnavailable, match="POSIX"):
        await trio_procown.run_owned("true", domain="process-group")


# A command that makes a child cgroup under its own and moves a forked member
# there in a session of its own (as container runtimes, systemd-run or a
# nested owner do); it prints
# the member's pid and the child cgroup's path, then waits.
NESTED_CGROUP = """
import os, time
mount = os.environ["CG_MOUNT"]
own = open("/proc/self/cgroup").read().split("0::", 1)[1].split()[0]
child = os.path.join(mount, own.lstrip("/"), "inner")
os.mkdir(child)
r, w = os.pipe()
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()  # its own session too, as a container's init would be
    os.write(w2, b"s")  # in its own session now: outside the command's group
    os.read(r, 1)
    time.sleep(30)
    os._exit(0)
os.read(r2, 1)
with open(os.path.join(child, "cgroup.procs"), "w") as f:
    f.write(str(pid))
os.write(w, b"x")
print("pid", pid, flush=True)
print("cgroup", child, flush=True)
time.sleep(30)
"""


@needs_cgroup
@pytest.mark.timeout(30)
async def test_members_of_descendant_cgroups_are_members() -> None:
    """A member moved into a child cgroup the command created gets the graceful signal (no force),
    is never an escapee, and the tree is released bottom-up with a sentence saying so."""
    env = dict(os.environ, CG_MOUNT=_cgroup.cgroup2_mount() or "")
    async with trio_procown.open_owned_command(py(NESTED_CGROUP), domain="cgroup", env=env, grace=2.0) as run:
        async for line in run.lines():
            if line.startswith("cgroup "):
                break
        receipt = await run.terminate()
    (member,) = pids_in(run.stdout)
    child = run.stdout.decode().split("cgroup ", 1)[1].split()[0]
    assert not alive(member)
    assert not os.path.exists(child)
    assert not os.path.exists(receipt.domain_id)
    assert (receipt.forced, receipt.domain_empty, receipt.census, receipt.escaped) == (False, True, (), ())
    assert any("1 other member" in s.detail for s in receipt.steps), receipt.steps
    assert any("1 child cgroup" in c for c in receipt.claims()), receipt.claims()


@needs_cgroup
@pytest.mark.timeout(30)
async def test_a_leader_that_never_entered_its_cgroup_is_said_and_judged_by_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A placement shim that does not enter the cgroup: the receipt says placement FAILED and falls
    back to process-group evidence instead of claiming the (empty) cgroup proves anything."""
    monkeypatch.setattr(_cgroup, "spawns_into", lambda root: False)  # the shim's path, not clone3's
    monkeypatch.setattr(_cgroup, "shim_argv", lambda procs, argv, name=None: list(argv))
    async with trio_procown.open_owned_command(
        "sleep 30 & echo ready; sleep 30", domain="cgroup", timeout=0.5, grace=1.0
    ) as run:
        await run.wait()
    r = run.receipt
    assert r is not None
    assert r.domain == "process-group"
    assert r.domain_id == f"pgid {r.pid}"
    placement = [s for s in r.steps if s.target == "placement"]
    assert placement
    assert "FAILED" in placement[0].detail
    assert any("placement" in c for c in r.claims())
    assert r.domain_empty
    assert r.returncode is not None


@needs_cgroup
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["spawner", "shim"])
async def test_a_command_forking_at_once_is_inside_its_cgroup(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Created inside the cgroup by clone3 (the spawner), or moved there by
    the shim before its exec: either way a child forked by the command's
    first instruction is a member, and the teardown ends it."""
    if how == "shim":
        monkeypatch.setattr(_cgroup, "spawns_into", lambda root: False)
    else:
        root = os.path.realpath(_cgroup.default_root() or "")
        if not _cgroup.spawns_into(root):
            pytest.skip("the spawner is not available here (no C compiler, or clone3 refused)")
    async with trio_procown.open_owned_command(
        "sleep 30 & echo $!; wait", domain="cgroup", timeout=10, grace=1.0
    ) as run:
        async for line in run.lines("stdout"):
            child = int(line)
            break
        with open(f"/proc/{child}/cgroup") as f:
            where = f.read()
        assert where.strip().endswith("/" + os.path.basename(run.domain_id)), where
        await run.terminate()
    receipt = run.receipt
    assert receipt is not None
    assert receipt.domain_empty
    assert not alive(child)
    assert receipt.escape_evidence == "kernel"


@needs_cgroup
@pytest.mark.timeout(60)
async def test_a_kernel_refusing_clone3_falls_back_to_the_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where clone3 is refused (an old kernel, a container's seccomp filter),
    the probe finds that the spawner cannot place commands and the shim does,
    so commands still start inside their cgroup."""
    from trio_procown import _placement

    def refused(*args: object, **kwargs: object) -> tuple[int, int]:
        raise _placement.CloneRefused(38, "clone3 refused: Function not implemented")

    monkeypatch.setattr(_placement, "_spawn_with", refused)  # every clone3 the spawner makes
    monkeypatch.setattr(_placement, "_PLAIN_REFUSED", [])  # process-group spawns fall back to Popen here
    monkeypatch.setattr(_cgroup, "_SPAWNS_INTO", set())
    _cgroup._probe.cache_clear()
    _cgroup._usable_root_cached.cache_clear()
    try:
        root = os.path.realpath(_cgroup.default_root() or "")
        assert _cgroup.unavailable_reason(root) is None
        assert not _cgroup.spawns_into(root)
        assert "shim" in _cgroup.placement_method()
        result = await trio_procown.run_owned(["sh", "-c", "cat /proc/self/cgroup"], domain="cgroup")
        assert result.stdout.decode().strip().endswith(os.path.basename(result.receipt.domain_id))
        assert result.receipt.domain_empty
    finally:
        _cgroup._probe.cache_clear()
        _cgroup._usable_root_cached.cache_clear()


@needs_cgroup
@pytest.mark.timeout(30)
async def test_a_refused_clone_at_spawn_time_raises_what_fork_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """clone3 refused for one command (EAGAIN: the process limit) raises the
    OSError subclass subprocess would raise, and leaves no cgroup behind."""
    from trio_procown import _placement

    root = os.path.realpath(_cgroup.default_root() or "")
    if _cgroup.unavailable_reason(root) is not None or not _cgroup.spawns_into(root):
        pytest.skip("the spawner is not available here")

    def refused(*args: object, **kwargs: object) -> tuple[int, int]:
        raise _placement.CloneRefused(11, "clone3 refused: Resource temporarily unavailable")

    monkeypatch.setattr(_placement, "spawn_into", refused)
    before = set(os.listdir(root))
    with pytest.raises(BlockingIOError):
        await trio_procown.run_owned(["true"], domain="cgroup")
    assert {n for n in set(os.listdir(root)) - before if n.startswith("procown-")} == set()


@pytest.mark.timeout(30)
async def test_process_group_commands_start_by_the_spawner_or_popen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process-group command starts through the spawner where clone3
    works (no Popen behind the leader), and through Popen where clone3 is
    refused (ENOSYS: an old kernel or a seccomp filter): the same argv[0],
    session, environment and receipt either way."""
    from trio_procown import _leader, _placement

    made: list[_leader.Leader] = []
    real_init = _leader.Leader.__init__

    def recording(self: _leader.Leader, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(_leader.Leader, "__init__", recording)
    monkeypatch.setattr(_placement, "_PLAIN_REFUSED", [])
    script = 'echo "$0 $FOO"; cut -d" " -f6 /proc/$$/stat; echo $$'

    async def once() -> tuple[list[str], int | None]:
        result = await trio_procown.run_owned(
            ["sh", "-c", script], domain="process-group", env={"FOO": "bar", "PATH": os.defpath}
        )
        assert result.receipt.cause == "exited"
        assert result.receipt.domain_empty
        assert not result.receipt.forced
        return result.stdout.decode().split(), result.receipt.pid

    words, pid = await once()
    assert words[:2] == ["sh", "bar"]
    assert words[2] == words[3] == str(pid)  # its own session
    if _placement.compiled_spawner() is not None:
        assert made[-1].popen is None

    def refused(*args: object, **kwargs: object) -> tuple[int, int]:
        raise _placement.CloneRefused(38, "clone3 refused: Function not implemented")

    monkeypatch.setattr(_placement, "spawn_into", refused)
    words, pid = await once()
    assert words[:2] == ["sh", "bar"]
    assert words[2] == words[3] == str(pid)
    assert made[-1].popen is not None
    assert _placement._PLAIN_REFUSED == [38]


@pytest.mark.timeout(30)
async def test_a_refused_plain_clone_raises_what_fork_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """clone3 refused at the process limit (EAGAIN) for a process-group
    command raises BlockingIOError, as Popen's fork would, and does not turn
    later commands away from the spawner."""
    from trio_procown import _placement

    def refused(*args: object, **kwargs: object) -> tuple[int, int]:
        raise _placement.CloneRefused(11, "clone3 refused: Resource temporarily unavailable")

    monkeypatch.setattr(_placement, "_PLAIN_REFUSED", [])
    monkeypatch.setattr(_placement, "spawn_into", refused)
    with pytest.raises(BlockingIOError):
        await trio_procown.run_owned(["true"], domain="process-group")
    assert _placement._PLAIN_REFUSED == []


@pytest.mark.parametrize(
    ("env", "argv"),
    [({"A=B": "1"}, ["true"]), ({"A": "x\0y"}, ["true"]), (None, ["echo", "a\0b"]), ({"": "x"}, ["true"])],
)
@pytest.mark.parametrize("domain", domains())
async def test_an_unpassable_environment_or_argument_is_refused(
    env: dict[str, str] | None, argv: list[str], domain: str
) -> None:
    """A variable name with '=', or a NUL inside a name, value or argument,
    cannot reach a program intact: ValueError before anything starts, as
    subprocess gives."""
    before = set(_our_cgroups())
    with pytest.raises(ValueError, match=r"environment variable name|null byte"):
        await trio_procown.run_owned(argv, env=env, domain=domain)  # type: ignore[arg-type]
    assert set(_our_cgroups()) == before


async def test_the_inherited_environment_is_read_at_each_spawn() -> None:
    """A variable set or removed between two commands is seen by the next
    one (the encoded environment is reused only while it is unchanged)."""
    first = await trio_procown.run_owned(["sh", "-c", 'echo "${PROCOWN_T_VAR-unset}"'])
    os.environ["PROCOWN_T_VAR"] = "set"
    try:
        second = await trio_procown.run_owned(["sh", "-c", 'echo "${PROCOWN_T_VAR-unset}"'])
    finally:
        del os.environ["PROCOWN_T_VAR"]
    third = await trio_procown.run_owned(["sh", "-c", 'echo "${PROCOWN_T_VAR-unset}"'])
    assert [first.stdout, second.stdout, third.stdout] == [b"unset\n", b"set\n", b"unset\n"]


@pytest.mark.timeout(60)
def test_spawn_costs_measure_each_figure_and_leave_no_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `procown doctor` measures: three positive figures where the spawner creates
    commands inside their cgroup (None where it does not), and no cgroup left behind."""
    root = os.path.realpath(_cgroup.default_root() or "")
    if _cgroup.unavailable_reason(root) is not None or not _cgroup.spawns_into(root):
        pytest.skip("the spawner is not available here")
    monkeypatch.setattr(_cgroup, "COST_SAMPLES", 2)
    monkeypatch.setattr(_cgroup, "COST_IDLE", 0.01)
    before = set(os.listdir(root))
    costs = _cgroup.spawn_costs()
    assert costs is not None
    assert set(costs) == {"into a cgroup", "into a cgroup after idle", "own cgroup after idle"}
    assert all(0 < taken < _cgroup._COST_WAIT for taken in costs.values()), costs
    ours = f"procown-{os.getpid()}-"  # not another test process's commands (pytest -n)
    assert {n for n in set(os.listdir(root)) - before if n.startswith(ours)} == set()
    monkeypatch.setattr(_cgroup, "spawns_into", lambda root: False)
    assert _cgroup.spawn_costs() is None


# A child that leaves the command's session and moves itself out of its
# cgroup into CG_TARGET's (a root-only escape), prints its pid once outside,
# then waits: only the census can find it.
LEAVES_ITS_CGROUP = """
import os, time
pid = os.fork()
if pid == 0:
    os.setsid()
    with open(os.environ["CG_TARGET"], "w") as f:
        f.write("0")
    print("pid", os.getpid(), flush=True)
    time.sleep(30)
    os._exit(0)
time.sleep(30)
"""


@needs_cgroup
@pytest.mark.skipif(os.geteuid() != 0, reason="leaving a cgroup for another takes privilege")
@pytest.mark.timeout(30)
async def test_in_a_burst_a_cgroup_escapee_is_still_found_and_terminated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a burst a verified cgroup's teardown waits for the cgroup to empty before its census
    (one scan instead of two); a member that left the cgroup is still found there, gets the
    graceful signal and is waited for: terminated, not reported as alive."""
    from trio_procown import _mass

    own = _cgroup.own_cgroup_dir()
    assert own is not None
    monkeypatch.setattr(_mass, "in_burst", lambda: True)
    env = dict(os.environ, CG_TARGET=os.path.join(own, "cgroup.procs"))
    async with trio_procown.open_owned_command(
        py(LEAVES_ITS_CGROUP), domain="cgroup", env=env, grace=2.0
    ) as run:
        async for line in run.lines():
            if line.startswith("pid "):
                break
        receipt = await run.terminate()
    (escapee,) = pids_in(run.stdout)
    assert not alive(escapee)
    assert receipt.escaped == ()
    assert [c.pid for c in receipt.census] == [escapee], receipt.census
    assert not receipt.forced
    signalled = [s for s in receipt.steps if s.target == "escapees"]
    assert signalled, receipt.steps
    assert "SIGTERM" in signalled[0].signals, receipt.steps


# The leader moves itself out of its cgroup into CG_TARGET's, then waits.
LEADER_LEAVES = """
import os, time
with open(os.environ["CG_TARGET"], "w") as f:
    f.write("0")
print("out", flush=True)
time.sleep(30)
"""


@needs_cgroup
@pytest.mark.skipif(os.geteuid() != 0, reason="leaving a cgroup for another takes privilege")
@pytest.mark.timeout(30)
async def test_a_leader_that_left_its_cgroup_costs_the_kernels_evidence() -> None:
    """A leader verified in its cgroup that then moves itself out (a write to a cgroup.procs
    file) is seen where it went at the teardown: the receipt says so, and what it started
    after that is claimed only as the census sees it, not as the kernel's evidence."""
    own = _cgroup.own_cgroup_dir()
    assert own is not None
    env = dict(os.environ, CG_TARGET=os.path.join(own, "cgroup.procs"))
    async with trio_procown.open_owned_command(py(LEADER_LEAVES), domain="cgroup", env=env) as run:
        async for line in run.lines():
            if line.startswith("out"):
                break
        receipt = await run.terminate()
    assert receipt.escape_evidence == "census", receipt.steps
    (moved,) = [s for s in receipt.steps if s.target == "placement"]
    assert moved.outcome == "left"
    assert f"left cgroup {run.domain_id} for {own}" in moved.detail
    assert any("seen only by the census" in claim for claim in receipt.claims())


def test_only_a_verified_cgroup_empties_without_a_scan() -> None:
    """The kernel's cgroup.events says a verified cgroup is empty; a process group (or a cgroup
    whose placement is unproven, judged by its group too) needs the process table."""
    from trio_procown._domain import ProcessGroupDomain

    assert not ProcessGroupDomain().empties_without_scan()
    if HAS_CGROUP:
        domain = _cgroup.CgroupDomain()
        assert not domain.empties_without_scan()  # pending until the leader is seen inside
        domain.placement = "verified"
        assert domain.empties_without_scan()


@needs_cgroup
async def test_cgroup_events_are_read_through_one_descriptor_closed_at_release() -> None:
    """The teardown's emptiness checks read cgroup.events through a descriptor opened at the
    first check (no path lookup each time) and closed when the cgroup is removed."""
    async with trio_procown.open_owned_command("sleep 30", domain="cgroup", stdout="devnull") as run:
        domain = run._spawned.domain
        assert isinstance(domain, _cgroup.CgroupDomain)
        assert domain._events_fd is None  # nothing held while the command runs
        assert not domain._unpopulated()  # the check reads "populated 1"
        assert domain._events_fd is not None
        await run.terminate()
    assert run.receipt is not None
    assert run.receipt.domain_empty
    assert domain._events_fd is None
    assert not os.path.exists(domain.path)


@needs_cgroup
def test_a_removed_cgroup_reads_as_empty_through_its_descriptor() -> None:
    from trio_procown._cgroup import populated_at

    path = os.path.join(_cgroup.CgroupDomain().root, f"procown-test-events-{os.getpid()}")
    os.mkdir(path)
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
        assert populated_at(fd, path) is False  # made empty
    finally:
        os.rmdir(path)
    try:
        assert populated_at(fd, path) is False  # its files read ENODEV once it is gone
    finally:
        os.close(fd)


@needs_cgroup
@pytest.mark.parametrize("native", [True, False], ids=["listed-in-c", "listed-in-python"])
async def test_a_member_outside_the_process_group_gets_the_graceful_signal(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """The graceful stage's second half: a setsid member (still in the cgroup, out of the
    leader's group) gets SIGTERM from the listing, not SIGKILL after the grace."""
    monkeypatch.setattr(_cgroup, "NATIVE_LISTING", native)
    result = await trio_procown.run_owned(SETSID_ESCAPEE, timeout=0.5, grace=10.0, domain="cgroup")
    (pid,) = pids_in(result.stdout)
    r = result.receipt
    assert not alive(pid)
    assert not r.forced, r.claims()
    assert r.domain_empty
    signals = [s for s in r.steps if s.action is trio_procown.Action.SIGNAL and s.target == "domain"]
    assert "and to 1 other member(s) of cgroup" in signals[0].detail, signals


def _spawn_marked_sleep() -> subprocess.Popen[bytes]:
    from conftest import MARKER, MARKER_VAR

    return subprocess.Popen(["sleep", "30"], env={**os.environ, MARKER_VAR: MARKER})


@needs_cgroup
@pytest.mark.skipif(os.geteuid() != 0, reason="moving a process into a cgroup we made takes privilege")
async def test_the_c_lister_reads_the_cgroup_tree_as_the_python_listing_does() -> None:
    from trio_procown import _placement, _procfs

    await trio_procown.run_owned(["true"])  # loads the spawner where it works
    if _placement.loaded_lister() is None:
        pytest.skip("no spawner here")
    top = os.path.join(_cgroup.CgroupDomain().root, f"procown-test-list-{os.getpid()}")
    child = os.path.join(top, "child")
    os.mkdir(top)
    os.mkdir(child)
    sleeps = [_spawn_marked_sleep(), _spawn_marked_sleep()]
    try:
        for where, proc in zip((top, child), sleeps, strict=True):
            with open(os.path.join(where, "cgroup.procs"), "w") as f:
                f.write(str(proc.pid))
        failures: list[str] = []
        native = _cgroup.native_members(top, failures)
        python = [
            (pid, info.pgrp, info.start)
            for pid in _cgroup.tree_pids(top)
            if (info := _procfs.read_stat(pid)) is not None
        ]
        assert native is not None
        assert sorted(native) == sorted(python)
        assert {pid for pid, _, _ in native} == {p.pid for p in sleeps}
        assert failures == []
    finally:
        for proc in sleeps:
            proc.kill()
            proc.wait()
        os.rmdir(child)
        os.rmdir(top)


@needs_cgroup
async def test_the_c_lister_says_what_it_could_not_read() -> None:
    """A tree nested deeper than the lister goes is a failure in the receipt's sense, not a
    silently shorter listing."""
    from trio_procown import _placement

    await trio_procown.run_owned(["true"])
    if _placement.loaded_lister() is None:
        pytest.skip("no spawner here")
    top = os.path.join(_cgroup.CgroupDomain().root, f"procown-test-deep-{os.getpid()}")
    made = [top]
    os.mkdir(top)
    try:
        for i in range(34):
            made.append(os.path.join(made[-1], f"d{i}"))
            os.mkdir(made[-1])
        failures: list[str] = []
        assert _cgroup.native_members(top, failures) == []
        assert len(failures) == 1
        assert os.strerror(errno.ELOOP) in failures[0]
    finally:
        for where in reversed(made):
            os.rmdir(where)
