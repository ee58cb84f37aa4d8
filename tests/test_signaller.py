"""The teardown's signals go through a worker thread (_signaller.py), so a mass
teardown does not stall the event loop; every wait for it stays bounded, and the
teardown's bound counts from the stop request, not from when its task ran."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import trio

import trio_procown
from conftest import py
from helpers import Budgets, domains, read_ready
from trio_procown import _mass, _signaller
from trio_procown._cgroup import CgroupDomain
from trio_procown._choice import DomainName
from trio_procown._domain import Domain, ProcessGroupDomain
from trio_procown._receipt import Action
from trio_procown._teardown import CUT_SHORT_SCAN, CUT_SHORT_WAIT, TEARDOWN_ALLOWANCE

SLEEPER = py("import time; print('ready', flush=True); time.sleep(30)")


BUDGETS: Budgets = {"grace": 0.3, "kill_wait": 0.3, "drain_wait": 0.3}
BUDGET = BUDGETS["grace"] + BUDGETS["kill_wait"] + BUDGETS["drain_wait"] + TEARDOWN_ALLOWANCE


@pytest.fixture
def stuck_worker() -> Iterator[threading.Event]:
    """The signaller's worker busy with an action that does not end until
    the test sets the event (what a worker starved of CPU looks like)."""
    release = threading.Event()
    started = threading.Event()

    def block() -> None:
        started.set()
        release.wait(30)

    async def occupy() -> None:
        _signaller.submit(block)

    trio.run(occupy)
    assert started.wait(5)
    try:
        yield release
    finally:
        release.set()


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every action handed to the signaller thread during the test, in order."""
    handed: list[object] = []
    real_submit = _signaller.submit

    def counting(fn: object) -> object:
        handed.append(fn)
        return real_submit(fn)  # type: ignore[arg-type]

    monkeypatch.setattr(_signaller, "submit", counting)
    return handed


async def test_an_action_runs_in_the_worker_thread() -> None:
    job = _signaller.submit(threading.get_ident)
    with trio.fail_after(5):
        await job.done.wait()
    assert job.error is None
    assert job.result is not None
    assert job.result != threading.get_ident()
    assert not job.running


async def test_an_action_failure_is_handed_back() -> None:
    def fail() -> None:
        raise OSError(1, "refused")

    job = _signaller.submit(fail)
    with trio.fail_after(5):
        await job.done.wait()
    assert isinstance(job.error, OSError)


async def test_a_cancelled_action_never_runs(stuck_worker: threading.Event) -> None:
    ran: list[bool] = []
    job = _signaller.submit(lambda: ran.append(True))
    assert job.cancel()  # queued behind the stuck one: withdrawn
    stuck_worker.set()
    after = _signaller.submit(lambda: None)
    with trio.fail_after(5):
        await after.done.wait()
    assert not ran
    assert not job.done.is_set()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("domain", domains())
async def test_a_stuck_signaller_still_ends_the_command_within_the_bound(
    domain: DomainName, stuck_worker: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graceful signal waits in the queue past the teardown's deadline:
    it is recorded as not sent and never sent, the forced fallback (on the
    loop) ends the command, and the block returns within its bound."""
    monkeypatch.setattr(_mass, "INLINE_MAX", 0)  # every teardown through the thread
    async with trio_procown.open_owned_command(SLEEPER, domain=domain, **BUDGETS) as run:
        await read_ready(run)
        start = trio.current_time()
        receipt = await run.terminate()
    elapsed = trio.current_time() - start
    assert elapsed <= run.teardown_bound + 0.5, elapsed
    steps = [s for s in receipt.steps if s.action is Action.SIGNAL]
    assert steps[0].outcome == "not sent", receipt.steps
    assert "SIGKILL" in steps[1].signals, receipt.steps
    assert "deadline" in steps[1].outcome, receipt.steps
    assert receipt.forced
    assert receipt.domain_empty


@pytest.mark.timeout(30)
async def test_the_bound_counts_from_the_stop_request() -> None:
    """A teardown whose task runs only after its whole bound has passed (the
    loop was starved) goes straight to the forced fallback, and its receipt
    dates the stop at the request."""
    async with trio_procown.open_owned_command(SLEEPER, domain="process-group", **BUDGETS) as run:
        await read_ready(run)
        asked = trio.current_time()
        run.request_stop("stopped")
        time.sleep(BUDGET + 0.2)  # starve the loop: the teardown's task has not run yet
        receipt = await run.wait()
    stop = next(s for s in receipt.steps if s.action is Action.STOP)
    assert abs(run.started_at + stop.at - asked) < 0.05, (stop, asked)
    signals = [s for s in receipt.steps if s.action is Action.SIGNAL]
    assert len(signals) == 1, receipt.steps  # no graceful stage: its time had passed
    assert "deadline" in signals[0].outcome, receipt.steps
    assert receipt.forced
    # Nothing more than the fallback's own waits after the starvation.
    assert receipt.duration - stop.at <= BUDGET + 0.2 + CUT_SHORT_WAIT + CUT_SHORT_SCAN + 0.3


async def test_an_idle_worker_ends_and_a_new_one_takes_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker with nothing to do ends after IDLE_EXIT (no thread is kept
    for the life of the program); the next action starts a new one."""
    monkeypatch.setattr(_signaller, "IDLE_EXIT", 0.05)
    first = _signaller.submit(threading.get_ident)
    with trio.fail_after(5):
        await first.done.wait()

    def workers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == _signaller.THREAD_NAME]

    with trio.fail_after(5):
        while workers():
            await trio.sleep(0.01)
    second = _signaller.submit(threading.get_ident)
    with trio.fail_after(5):
        await second.done.wait()
    assert second.error is None
    assert second.result not in (None, threading.get_ident())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("domain", domains())
async def test_few_teardowns_signal_from_the_loop_many_through_the_thread(
    domain: DomainName, submitted: list[object]
) -> None:
    """One command torn down alone is signalled from the loop (no thread
    handoff on its deadline's path); more than INLINE_MAX torn down
    together are signalled through the worker, and all end."""

    async def one(ready: trio.Event) -> None:
        async with trio_procown.open_owned_command(SLEEPER, domain=domain, **BUDGETS) as run:
            async for _ in run.lines():
                break
            ready.set()
            await trio.sleep_forever()

    with trio.move_on_after(5):
        async with trio_procown.open_owned_command(SLEEPER, domain=domain, **BUDGETS) as run:
            async for _ in run.lines():
                break
            alone = await run.terminate()
    assert alone.domain_empty
    assert not alone.forced
    assert submitted == []

    count = _mass.INLINE_MAX + 4
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            readies = [trio.Event() for _ in range(count)]
            for ready in readies:
                nursery.start_soon(one, ready)
            for ready in readies:
                await ready.wait()
            nursery.cancel_scope.cancel()
    assert len(submitted) >= count - _mass.INLINE_MAX


SETSID_MEMBER = py(
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    print('member', os.getpid(), flush=True)\n"
    "    time.sleep(30)\n"
    "    os._exit(0)\n"
    "time.sleep(30)\n"
)


@pytest.mark.skipif("cgroup" not in domains(), reason="no writable cgroup v2 here")
@pytest.mark.timeout(30)
async def test_through_the_thread_a_cgroup_member_outside_the_group_is_signalled(
    monkeypatch: pytest.MonkeyPatch, submitted: list[object]
) -> None:
    """The cgroup's graceful signal in two stages: the process group from the
    worker thread, then on the loop a member that left the group (setsid) but
    not the cgroup; it gets SIGTERM within the grace (no force needed)."""
    monkeypatch.setattr(_mass, "INLINE_MAX", 0)  # every teardown through the thread
    async with trio_procown.open_owned_command(SETSID_MEMBER, domain="cgroup", grace=10.0) as run:
        async for line in run.lines():
            assert line.startswith("member ")
            break
        receipt = await run.terminate()
    assert submitted
    assert receipt.domain_empty
    assert not receipt.forced, receipt.claims()
    (graceful,) = [s for s in receipt.steps if s.action is Action.SIGNAL and s.target == "domain"]
    assert "and to 1 other member(s) of cgroup" in graceful.detail, graceful


async def test_no_thread_to_be_had_queues_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """When no worker runs and none can start (the thread limit), submit raises RuntimeError and
    leaves nothing queued; the next submit, once threads can start again, works."""

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    # First let the worker end: one more action, after which it idles for IDLE_EXIT only.
    monkeypatch.setattr(_signaller, "IDLE_EXIT", 0.05)
    with trio.fail_after(10):
        await _signaller.submit(lambda: None).done.wait()
        while [t for t in threading.enumerate() if t.name == _signaller.THREAD_NAME]:
            await trio.sleep(0.01)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError):
        _signaller.submit(lambda: None)
    assert not _signaller.pending()
    monkeypatch.undo()
    job = _signaller.submit(threading.get_ident)
    with trio.fail_after(5):
        await job.done.wait()
    assert job.result not in (None, threading.get_ident())


@pytest.mark.timeout(30)
async def test_a_teardown_without_a_thread_signals_from_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A teardown in a burst whose signals cannot go to the thread sends them itself: the command
    ends gracefully, without an error step."""

    def refused(fn: object) -> object:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_mass, "INLINE_MAX", 0)  # every teardown through the thread
    monkeypatch.setattr(_signaller, "submit", refused)
    async with trio_procown.open_owned_command(SLEEPER, domain="process-group", **BUDGETS) as run:
        await read_ready(run)
        receipt = await run.terminate()
    assert receipt.domain_empty
    assert not receipt.forced
    assert not [s for s in receipt.steps if s.action is Action.ERROR], receipt.steps
    assert "SIGTERM" in next(s for s in receipt.steps if s.action is Action.SIGNAL).signals


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> list[_signaller.Job[object]]:
    """Every job queued for the signaller thread during the test, in order."""
    queued: list[_signaller.Job[object]] = []
    real_submit = _signaller.submit

    def recording(fn: Callable[[], object]) -> _signaller.Job[object]:
        job = real_submit(fn)
        queued.append(job)
        return job

    monkeypatch.setattr(_signaller, "submit", recording)
    return queued


def _exited(pid: int) -> None:
    """Block until the child `pid` has exited, without reaping it (the
    teardown holds its leader unreaped)."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("domain", domains())
async def test_in_a_burst_the_graceful_signal_is_queued_with_the_stop_request(
    domain: DomainName, monkeypatch: pytest.MonkeyPatch, jobs: list[_signaller.Job[object]]
) -> None:
    """In a burst a stop request queues the graceful signal for the thread at
    once, before its teardown's task runs (with 2,000 cancelled together the
    tasks get their turns over a second or more); the teardown then awaits
    that action: one graceful signal, recorded once, and the command ends
    without force."""
    monkeypatch.setattr(_mass, "INLINE_MAX", 0)  # a burst of one
    async with trio_procown.open_owned_command(SLEEPER, domain=domain, **BUDGETS) as run:
        await read_ready(run)
        run.request_stop("stopped")
        assert len(jobs) == 1  # queued by the request itself, no checkpoint since
        receipt = await run.wait()
    assert receipt.cause == "stopped"
    assert receipt.domain_empty
    assert not receipt.forced, receipt.claims()
    graceful = [s for s in receipt.steps if s.action is Action.SIGNAL and "SIGTERM" in s.signals]
    assert len(graceful) == 1, receipt.steps
    assert len(jobs) == 1, receipt.steps


@pytest.mark.timeout(30)
@pytest.mark.parametrize("domain", domains())
async def test_a_leader_ended_by_the_early_signal_counts_as_stopped(
    domain: DomainName, monkeypatch: pytest.MonkeyPatch, jobs: list[_signaller.Job[object]]
) -> None:
    """The leader dies of the queued signal before the stop's wakeup reaches
    its supervisor (beyond WAKE_CHUNK stops, wakeups are put off to later
    batches of the loop): the supervisor sees the leader exit, and the
    receipt still says it was stopped (and by SIGTERM), never that it exited
    by itself; the signal's step is there."""
    monkeypatch.setattr(_mass, "INLINE_MAX", 0)
    put_off: list[Callable[[], object]] = []
    async with trio_procown.open_owned_command(SLEEPER, domain=domain, **BUDGETS) as run:
        await read_ready(run)
        monkeypatch.setattr(_mass, "wake_soon", put_off.append)
        run.request_stop("stopped")
        _exited(run.pid)  # the loop does not run meanwhile
        receipt = await run.wait()  # the supervisor is woken by the leader's exit only
    assert put_off  # the stop's own wakeup never came first
    for wake in put_off:
        wake()
    assert receipt.cause == "stopped", receipt.claims()
    assert receipt.returncode == -signal.SIGTERM
    assert [s for s in receipt.steps if s.action is Action.SIGNAL and "SIGTERM" in s.signals], receipt.steps
    assert receipt.domain_empty


@pytest.mark.timeout(30)
async def test_an_early_signal_never_awaited_is_withdrawn(
    stuck_worker: threading.Event, monkeypatch: pytest.MonkeyPatch, jobs: list[_signaller.Job[object]]
) -> None:
    """The early signal waits behind a stuck worker and the teardown's task
    runs only after its whole bound: the forced fallback ends the command,
    and the queued graceful signal is withdrawn before the leader is reaped,
    never to be sent to a pid that may be recycled."""
    monkeypatch.setattr(_mass, "INLINE_MAX", 0)
    async with trio_procown.open_owned_command(SLEEPER, domain="process-group", **BUDGETS) as run:
        await read_ready(run)
        run.request_stop("stopped")
        (early,) = jobs
        time.sleep(BUDGET + 0.2)  # starve the loop past the teardown's bound
        receipt = await run.wait()
    assert early.cancel()  # still withdrawn: it never started
    assert not early.done.is_set()
    signals = [s for s in receipt.steps if s.action is Action.SIGNAL]
    assert [s.signals for s in signals] == [("SIGKILL",)], receipt.steps
    assert receipt.forced
    assert receipt.domain_empty


IGNORES_TERM = py(
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


@pytest.mark.timeout(30)
async def test_a_census_table_proves_the_group_empty_only_after_the_leader_died(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The grace stage's census table serves as the proof that the group is
    empty (no second scan) only when the leader was gone before it was asked
    for; a leader alive then (it ignores SIGTERM) is waited for as before."""
    from trio_procown._domain import ProcessGroupDomain

    waits: list[int] = []
    real_wait_empty = ProcessGroupDomain.wait_empty

    async def counting(self: ProcessGroupDomain, hint: object = None) -> object:
        waits.append(self.pgid)
        return await real_wait_empty(self, hint)  # type: ignore[arg-type]

    monkeypatch.setattr(ProcessGroupDomain, "wait_empty", counting)
    monkeypatch.setattr(_mass, "INLINE_MAX", 0)
    async with trio_procown.open_owned_command(SLEEPER, domain="process-group", **BUDGETS) as run:
        async for _ in run.lines():
            break
        run.request_stop("stopped")
        _exited(run.pid)
        died = await run.wait()
    assert died.domain_empty
    assert not died.forced
    assert waits == [], died.steps

    async with trio_procown.open_owned_command(IGNORES_TERM, domain="process-group", **BUDGETS) as run:
        async for _ in run.lines():
            break
        ignored = await run.terminate()
    assert waits, ignored.steps  # the leader was alive when the table was asked for
    assert ignored.forced
    assert ignored.domain_empty


@pytest.mark.skipif("cgroup" not in domains(), reason="no writable cgroup v2 here")
@pytest.mark.timeout(30)
async def test_a_census_table_late_past_the_grace_is_not_charged_to_the_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cgroup empties within its grace, but the census table taken after
    that comes late (in a mass teardown, a shared round): the wait for it is
    ours, bounded by the teardown's deadline, not by the grace, so the stage
    ends "empty" and no SIGKILL is sent to a domain that had emptied."""
    from trio_procown._teardown import Teardown

    real_table = Teardown._table
    calls: list[float] = []

    async def late(self: Teardown) -> object:
        calls.append(trio.current_time())
        if len(calls) > 1:  # the census taken once the cgroup emptied
            await trio.sleep(BUDGETS["grace"] + 0.2)
        return await real_table(self)

    monkeypatch.setattr(Teardown, "_table", late)
    async with trio_procown.open_owned_command(SLEEPER, domain="cgroup", **BUDGETS) as run:
        await read_ready(run)
        receipt = await run.terminate()
    assert len(calls) >= 2, receipt.steps
    assert not receipt.forced, receipt.claims()
    assert receipt.domain_empty
    grace = next(s for s in receipt.steps if s.action is Action.WAIT and "(grace)" in s.detail)
    assert grace.outcome == "empty", receipt.steps


def _domain_class(domain: DomainName) -> type[Domain]:
    return CgroupDomain if domain == "cgroup" else ProcessGroupDomain


@pytest.mark.parametrize("domain", domains())
async def test_a_domain_seen_empty_when_its_grace_runs_out_is_not_forced(
    domain: DomainName, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command obeys SIGTERM within its grace, but its emptying never reaches the wait (a
    starved loop sees the deadline first; a group's proving scan comes late): when the grace runs
    out the domain is asked once more, is empty, and no SIGKILL stage is run for nobody."""

    async def no_notice(self: Domain, hint: object = None) -> None:
        await trio.sleep_forever()

    monkeypatch.setattr(_domain_class(domain), "wait_empty", no_notice)
    # It ends 0.1 s after its SIGTERM (its own clean-up), well within the grace: still alive
    # when the signal step's scan is asked for, so that scan cannot already prove the group empty.
    slow_to_end = py(
        "import os, signal, time\n"
        "def end(*_):\n"
        "    time.sleep(0.1)\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "signal.signal(signal.SIGTERM, end)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)"
    )
    async with trio_procown.open_owned_command(slow_to_end, domain=domain, **BUDGETS) as run:
        await read_ready(run)
        receipt = await run.terminate()
    assert not receipt.forced, receipt.claims()
    assert receipt.domain_empty
    assert receipt.returncode == -signal.SIGTERM
    grace = next(s for s in receipt.steps if s.action is Action.WAIT and "(grace)" in s.detail)
    assert grace.outcome == "empty", receipt.steps
    assert "run out" in grace.detail
    assert not [s for s in receipt.steps if "SIGKILL" in s.signals]
    assert any("when the grace period had run out" in claim for claim in receipt.claims())


def _first_wait_without_notice(monkeypatch: pytest.MonkeyPatch, domain: DomainName) -> None:
    """The domain's first wait_empty never learns anything; later ones are real."""
    cls = _domain_class(domain)
    real_wait_empty = cls.wait_empty
    waits = 0

    async def first_without_notice(self: Domain, hint: object = None) -> object:
        nonlocal waits
        waits += 1
        if waits == 1:
            await trio.sleep_forever()
        return await real_wait_empty(self, hint)  # type: ignore[arg-type]

    monkeypatch.setattr(cls, "wait_empty", first_without_notice)


@pytest.mark.parametrize(
    ("domain", "stubborn"),
    [
        *[(d, "leader") for d in domains()],
        ("process-group", "member"),
    ],
)
async def test_a_domain_still_busy_when_its_grace_runs_out_is_forced(
    domain: DomainName, stubborn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same missing notice, but something ignores SIGTERM (the leader, or a member of a
    group whose leader died of it): the domain is not empty when the grace runs out, so the stage
    expired and SIGKILL follows."""
    _first_wait_without_notice(monkeypatch, domain)
    command: str | list[str]
    if stubborn == "leader":
        command = py(
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(30)"
        )
    else:
        # The member says it is ready once it ignores TERM (a "ready" from the leader could come
        # before the trap: under load the member then died of the signal); the marker: in our
        # environment.
        command = "(trap '' TERM; echo ready; exec sleep 30) & wait"
    async with trio_procown.open_owned_command(command, domain=domain, **BUDGETS) as run:
        await read_ready(run)
        receipt = await run.terminate()
    assert receipt.forced, receipt.claims()
    assert receipt.domain_empty
    grace = next(s for s in receipt.steps if s.action is Action.WAIT and "(grace)" in s.detail)
    assert grace.outcome == "expired", receipt.steps
