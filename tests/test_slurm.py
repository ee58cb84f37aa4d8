"""The Slurm ownership domain, against a reachable (one-host) Slurm cluster.

Locally these tests skip, naming the reason, when no cluster answers; under
CI=true (or PROCOWN_REQUIRE_SLURM=1) they fail instead (CI starts one with scripts/slurm-local). Every
command carries the suite's marker plus a per-test tag in its argv, so the
test can count what is left of it on this node (the cluster is this host).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import trio_procown
from conftest import MARKER
from trio_procown._slurm import Answer, SlurmDomain, SlurmJobDomain, cluster_status, limit_minutes
from trio_procown._teardown import TEARDOWN_ALLOWANCE

# Set by .ci/run once its cluster is up: skipping would then hide a failure.
REQUIRE_ENV = "PROCOWN_REQUIRE_SLURM"

GRACE = 0.5
KILL_WAIT = 1.0
DRAIN_WAIT = 0.5
# A teardown may also spend a few Slurm calls (squeue/scancel, milliseconds
# each on a healthy controller) beyond its local allowance.
SLACK = 1.0


@pytest.fixture(scope="module", autouse=True)
def cluster() -> str:
    """Skip (fail under CI=true) when no Slurm cluster is reachable."""
    usable, what = cluster_status()
    if not usable:
        why = f"no usable Slurm cluster: {what} (start one with `scripts/slurm-local start`)"
        if os.environ.get("CI", "").lower() == "true" or os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"CI=true or {REQUIRE_ENV}=1 requires the Slurm tests to run: {why}")
        pytest.skip(why)
    return what


def tagged() -> str:
    return f"slurm-{uuid.uuid4().hex[:12]}"


def processes_with(tag: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes on this host whose argv holds `tag`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read()
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in argv and state != "Z":
            found.append((int(name), argv.replace(b"\0", b" ").decode(errors="replace")))
    return found


def job_listed(name_or_id: str, *, by_name: bool = True) -> str:
    """The job's state in squeue ("" when it is not listed)."""
    which = ["-n", name_or_id] if by_name else ["-j", name_or_id]
    out = subprocess.run(["squeue", "-h", *which, "-o", "%T"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def job_fields(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=10
    ).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


@pytest.fixture
def tag() -> Iterator[str]:
    """A per-test tag; no process carrying it may outlive the test."""
    value = tagged()
    yield value
    left = processes_with(value)
    for pid, _ in left:
        # Checked to carry the tag and the marker: never a stranger.
        os.kill(pid, signal.SIGKILL)
    assert not left, f"survivors on the node: {left}"


def prog(tag: str, code: str) -> list[str]:
    return [sys.executable, "-c", code, MARKER, tag]


async def test_output_status_and_receipt_name_the_job(tag: str) -> None:
    """A job's stdout/stderr and exit status come back as locally, and the
    receipt names the job, its node and Slurm's final state."""
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    result = await trio_procown.run_owned(prog(tag, code), domain=SlurmDomain(), timeout=30)
    assert result.stdout == b"out\n"
    # srun adds its own report of a failed task to the task's stderr, as
    # its own line, but not always after the task's last byte: it was seen
    # between "err" and its newline. Without srun's lines, the task's
    # stderr is all there, in order.
    assert b"exit code 3" in result.stderr
    assert re.sub(rb"srun: error: [^\n]*\n", b"", result.stderr) == b"err\n"
    assert result.returncode == 3
    receipt = result.receipt
    assert receipt.cause == "exited"
    assert receipt.domain == "slurm"
    assert receipt.domain_id.startswith("slurm job ")
    job_id = receipt.domain_id.removeprefix("slurm job ")
    assert job_id.isdigit()
    assert receipt.domain_empty
    claims = " ".join(receipt.claims())
    assert f"slurm job {job_id}" in claims
    assert "JobState=FAILED" in claims
    assert "ExitCode=3:0" in claims
    assert "accounting" in claims  # proven by sacct, or said not to be


async def test_a_job_still_completing_after_srun_exited_is_awaited(
    tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """srun exits when the job's step ends, and Slurm lists the job as
    COMPLETING a moment longer: the teardown waits (within the grace it did
    not use) for the job to end before it calls the domain empty. Before, a
    job seen COMPLETING then gave domain_empty False with nothing of it
    left (1 of 3 quick jobs here; it failed a fresh-clone CI run)."""
    real = SlurmJobDomain._take_squeue
    shown: list[str | None] = []

    def completing_once(self: SlurmJobDomain, answer: Answer) -> str | None:
        state = real(self, answer)
        if not shown and self.leader is not None and self.leader.poll() is not None:
            shown.append(state)
            return self._seen("COMPLETING")
        return state

    monkeypatch.setattr(SlurmJobDomain, "_take_squeue", completing_once)
    result = await trio_procown.run_owned(prog(tag, "print('out')"), domain=SlurmDomain(), timeout=30)
    assert shown, "the job's state was never read after srun exited"
    assert (result.receipt.cause, result.returncode, result.stdout) == ("exited", 0, b"out\n")
    assert result.receipt.domain_empty
    assert not any("NOT removed" in c for c in result.receipt.claims())


async def test_lines_stream_before_the_job_ends(tag: str) -> None:
    """run.lines() sees each line as the task writes it (srun --unbuffered)."""
    code = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.4)\n"
    seen: list[tuple[str, float]] = []
    async with trio_procown.open_owned_command(prog(tag, code), domain="slurm", timeout=30) as run:
        async for line in run.lines():
            seen.append((line, trio.current_time()))
        await run.wait()
    assert [line.strip() for line, _ in seen] == ["0", "1", "2"]
    assert seen[-1][1] - seen[0][1] > 0.5  # not all at the end


async def test_max_output_truncates_as_locally(tag: str) -> None:
    """max_output bounds what is kept of a job's output, and counts the rest."""
    code = "import sys; sys.stdout.write('x' * 200000)"
    result = await trio_procown.run_owned(prog(tag, code), domain="slurm", timeout=30, max_output=1000)
    assert result.receipt.output == "truncated"
    assert len(result.stdout) <= 1000


def _time_option(domain: SlurmDomain) -> str:
    options = domain.srun_options("x")
    return next((o for o in options if o.startswith("--time=")), "")


def test_extra_args_as_one_string_is_refused() -> None:
    """A str is a sequence of characters: refused, not split into one option per character."""
    with pytest.raises(TypeError, match="one string"):
        SlurmDomain(extra_args="--mem=1G")
    assert SlurmDomain(extra_args=["--mem=1G"]).extra_args == ("--mem=1G",)


def test_time_limit_from_the_deadline() -> None:
    """The job's --time covers timeout plus the teardown budgets, in whole
    minutes rounded up; an explicit time_limit caps it."""
    assert limit_minutes(0.5) == 1
    assert limit_minutes(60) == 1
    assert limit_minutes(61) == 2
    assert _time_option(SlurmDomain().bound(100, 3.5)) == "--time=2"
    assert _time_option(SlurmDomain(time_limit=30).bound(100, 3.5)) == "--time=1"
    assert _time_option(SlurmDomain().bound(None, 3.5)) == ""
    with pytest.raises(ValueError, match="time_limit"):
        SlurmDomain(time_limit=-1)


# -- chaos: misbehaving trees, every way out, 0 survivors on the node --------

TREES = {
    # A child that forks a grandchild; both sleep.
    "grandchild": "if os.fork() == 0:\n    os.fork(); time.sleep(300)\n",
    # A child that ignores SIGTERM (its parent dies first: Slurm's linuxproc
    # tracking then loses it, the census finds it).
    "term-ignorer": (
        "if os.fork() == 0:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)\n"
    ),
    # The task itself ignores SIGTERM: only the kill stage ends it (a SIGKILL
    # to the whole job is a cancel to Slurm, with its own KillWait ladder).
    "task-ignores-term": "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n",
    # A child that stops itself: SIGCONT lets it act on SIGTERM.
    "stopped": "if os.fork() == 0:\n    os.kill(os.getpid(), signal.SIGSTOP); time.sleep(300)\n",
    # A child that leaves the session (setsid) and forks again.
    "setsid-escapee": "if os.fork() == 0:\n    os.setsid()\n    os.fork(); time.sleep(300)\n",
    # A grandchild that keeps the output pipe open after its parent exits.
    "pipe-holder": "if os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(300)\n    os._exit(0)\n",
}
HEADER = "import os, signal, sys, time\n"
FOOTER = "time.sleep(0.3)\nprint('ready', flush=True)\ntime.sleep(300)\n"


class Boom(Exception):
    pass


async def _way_out(argv: list[str], way: str) -> tuple[trio_procown.Receipt, float]:
    """Run `argv` until it printed "ready", then leave the block `way`;
    return the receipt and how long the exit took after its trigger."""
    triggered = 0.0
    run: Any = None
    budgets: dict[str, Any] = {"grace": GRACE, "kill_wait": KILL_WAIT, "drain_wait": DRAIN_WAIT}
    # Under "timeout" the command's own deadline comes after "ready".
    try:
        with trio.move_on_after(60) as outer:
            async with trio_procown.open_owned_command(
                argv, domain="slurm", timeout=None if way != "timeout" else 2.0, **budgets
            ) as run:
                async for line in run.lines():
                    if "ready" in line:
                        break
                triggered = trio.current_time()
                if way == "cancel":
                    outer.cancel()
                    await trio.sleep_forever()
                if way == "error":
                    raise Boom
                await run.wait()
    except Boom:
        pass
    receipt = run.receipt
    assert receipt is not None
    if way == "timeout":
        stop = next(s for s in receipt.steps if s.action is trio_procown.Action.STOP)
        return receipt, receipt.duration - stop.at
    return receipt, trio.current_time() - triggered


@pytest.mark.parametrize("way", ["timeout", "cancel", "error"])
@pytest.mark.parametrize("tree", sorted(TREES))
async def test_chaos_on_slurm(tree: str, way: str, tag: str) -> None:
    """Each misbehaving tree, left by each way out: bounded teardown, the
    job ended in Slurm, and no process of it left on the node."""
    argv = prog(tag, HEADER + TREES[tree] + FOOTER)
    receipt, took = await _way_out(argv, way)
    expected = {"timeout": "timed_out", "cancel": "cancelled", "error": "error"}[way]
    assert receipt.cause == expected
    bound = GRACE + KILL_WAIT + DRAIN_WAIT + TEARDOWN_ALLOWANCE + SLACK
    assert took < bound, receipt.steps
    assert processes_with(tag) == [], receipt.claims()
    assert receipt.domain_empty, receipt.claims()
    job_id = receipt.domain_id.removeprefix("slurm job ")
    assert job_id.isdigit()
    assert job_listed(job_id, by_name=False) in ("", "COMPLETING"), receipt.claims()


async def test_pending_job_is_cancelled_without_starting(tag: str) -> None:
    """A job still pending at the deadline is cancelled and never starts."""
    domain = SlurmDomain(extra_args=["--begin=now+1hour"])
    argv = prog(tag, "print('ran', flush=True)")
    result = await trio_procown.run_owned(argv, domain=domain, timeout=1.5, grace=GRACE, kill_wait=KILL_WAIT)
    receipt = result.receipt
    assert receipt.cause == "timed_out"
    assert b"ran" not in result.stdout
    claims = " ".join(receipt.claims())
    assert "JobState=CANCELLED" in claims, claims
    assert "it never started" in claims, claims
    assert "cancelled while PENDING, before it started" in claims, claims
    job_id = receipt.domain_id.removeprefix("slurm job ")
    assert job_id.isdigit(), receipt.domain_id
    assert job_listed(job_id, by_name=False) == ""
    fields = job_fields(job_id)
    assert fields.get("JobState") == "CANCELLED"
    assert fields.get("StartTime") in ("None", "Unknown", fields.get("EndTime")), fields


# -- bad input, bad clusters: refused before anything runs --------------------


def _nothing_queued(tag: str) -> None:
    out = subprocess.run(["squeue", "-h", "-o", "%j %o"], capture_output=True, text=True, timeout=10).stdout
    assert tag not in out


async def test_unknown_partition_is_refused(tag: str) -> None:
    """An unknown partition raises DomainUnavailable naming it; nothing queued."""
    with pytest.raises(trio_procown.DomainUnavailable, match=r"(?i)partition"):
        await trio_procown.run_owned(prog(tag, "pass"), domain=SlurmDomain(partition="no-such-partition"))
    _nothing_queued(tag)


async def test_a_rejected_option_is_named(tag: str) -> None:
    """An option srun does not know is named in the refusal (srun's last
    line only points to its help)."""
    with pytest.raises(trio_procown.DomainUnavailable, match="no-such-option"):
        await trio_procown.run_owned(prog(tag, "pass"), domain=SlurmDomain(extra_args=["--no-such-option"]))
    _nothing_queued(tag)


async def test_rejected_job_is_refused(tag: str) -> None:
    """A job the controller rejects (more CPUs per task than a node has) is
    refused before anything runs."""
    with pytest.raises(trio_procown.DomainUnavailable, match="would not take the job"):
        domain = SlurmDomain(extra_args=["--cpus-per-task=4096"])
        await trio_procown.run_owned(prog(tag, "pass"), domain=domain)
    _nothing_queued(tag)


async def test_no_slurm_on_path(tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Slurm's clients on PATH the domain is unavailable, saying so."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(trio_procown.DomainUnavailable, match="srun was not found"):
        await trio_procown.run_owned(prog(tag, "pass"), domain="slurm")


async def test_controller_down_is_refused(tag: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that does not answer is reported within the call bound."""
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    with open(conf) as f:
        text = f.read()
    bad = tmp_path / "slurm.conf"
    bad.write_text(text + "\nSlurmctldPort=1\n")
    monkeypatch.setenv("SLURM_CONF", str(bad))
    monkeypatch.setattr("trio_procown._slurm.CALL_TIMEOUT", 2.0)
    start = time.monotonic()
    with pytest.raises(trio_procown.DomainUnavailable, match=r"(?i)controller"):
        await trio_procown.run_owned(prog(tag, "pass"), domain="slurm")
    assert time.monotonic() - start < 10


# -- the command line ----------------------------------------------------------


def test_cli_run_and_doctor(tag: str) -> None:
    """`procown run --domain slurm` runs the job; `procown doctor` reports
    the cluster."""
    argv = [sys.executable, "-m", "trio_procown", "run", "--domain", "slurm", "--json", "--timeout", "30"]
    argv.append("--")
    done = subprocess.run(
        [*argv, *prog(tag, "print('via slurm')")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "via slurm" in done.stdout
    assert '"domain": "slurm"' in done.stdout + done.stderr
    doctor = subprocess.run(
        [sys.executable, "-m", "trio_procown", "doctor"], capture_output=True, text=True, timeout=60
    )
    assert "slurm (--domain slurm, never picked by auto): reachable" in doctor.stdout


# -- the engine as the backstop --------------------------------------------------

OWNER = """
import sys, trio, trio_procown
async def main():
    async with trio_procown.open_owned_command(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)", *sys.argv[1:]],
        domain="slurm", timeout=5, grace=1, kill_wait=1, keeper=sys.argv[-1] == "keeper",
    ) as run:
        async for line in run.lines():
            break
        print(run._spawned.domain.job_name, flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


def _owner_then_sigkill(tag: str, keeper: str) -> tuple[str, float, int]:
    """Start an owner process, SIGKILL it once its job runs; the job's name,
    when the owner died, and its pid."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, MARKER, tag, keeper], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert owner.stdout is not None
        name = owner.stdout.readline().decode().strip()
        assert name.startswith("procown-"), name
        assert job_listed(name) == "RUNNING"
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    return name, time.monotonic(), owner.pid


def _keepers_of(owner: int) -> list[int]:
    """Live keepers serving the owner `owner` (by their command line)."""
    needle = f"_keeper.serve({owner})".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _wait_job_gone(name: str, bound: float) -> float:
    start = time.monotonic()
    while job_listed(name) not in ("", "COMPLETING"):
        assert time.monotonic() - start < bound, f"job {name} still listed after {bound}s"
        time.sleep(0.5)
    return time.monotonic() - start


@pytest.mark.timeout(240)
def test_job_ends_by_its_time_limit_when_the_owner_is_sigkilled(tag: str) -> None:
    """SIGKILL the owner (no keeper): the job still ends by itself, at its
    --time (timeout 5 s + budgets -> 1 minute), with nothing left on the node."""
    name, died, _ = _owner_then_sigkill(tag, "no-keeper")
    time.sleep(1)
    assert job_listed(name) == "RUNNING"  # nobody ended it: only the engine will
    waited = _wait_job_gone(name, bound=200)
    # Ended by the time limit (60 s from the start), not before.
    assert waited > 30, waited
    deadline = time.monotonic() + 15
    while processes_with(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(tag) == []
    print(f"job ended {time.monotonic() - died:.1f}s after the owner was SIGKILLed")


def test_keeper_ends_the_job_when_the_owner_is_sigkilled(tag: str) -> None:
    """SIGKILL the owner with its keeper on: the keeper ends srun, and
    Slurm aborts the job's step at once (no waiting for --time)."""
    name, _, owner = _owner_then_sigkill(tag, "keeper")
    waited = _wait_job_gone(name, bound=30)
    assert waited < 15, waited
    deadline = time.monotonic() + 10
    while (processes_with(tag) or _keepers_of(owner)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(tag) == []
    assert _keepers_of(owner) == []  # its ladder done, the keeper exits too (within its bound)
