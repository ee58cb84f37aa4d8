# The teardown driver: one owned command's escalation, performed.
#
# Theory of operation. The decisions live in _escalation.py (a pure state
# machine); this module only acts on them and records what it saw. Once the
# leader has exited or a stop was requested, `Teardown.run()` performs the
# machine's actions until it says there is nothing left to do:
#
#   1. SIGTERM + SIGCONT to the domain (and to census escapees, when the
#      policy says they get the ladder)
#   2. wait <= grace for it to be empty
#   3. SIGKILL (forced = True)
#   4. wait <= kill_wait
#   5. wait <= drain_wait for EOF, then close the read ends ("abandoned")
#   6. reap the leader, release the domain, write the receipt
#
# When the leader exited by itself, steps 1-4 run only if the domain still
# holds live processes (owned work that outlived it). The whole runs in a
# shielded cancel scope whose deadline is grace + kill_wait + drain_wait +
# TEARDOWN_ALLOWANCE, counted from the stop request (the owner sets
# `requested`), not from when this task got to run: on a loaded loop the two
# differ, and the receipt must not hide the difference. In a mass teardown
# (more than _mass.INLINE_MAX under way; see _mass.py) the domain's signals
# of steps 1 and 3 are sent by the signaller thread (_signaller.py) while the
# loop goes on; the wait for them is bounded by that same deadline (an
# action still queued then is withdrawn and recorded as not sent; the
# forced fallback below signals from the loop itself); the graceful signal
# is queued by the stop request itself, before the teardown's task runs
# (ask(); the task awaits it at step 1). In a burst a teardown takes its
# turn (_mass.pace) before each action and after each of those signalling
# waits, so that the loop is never held by thousands of steps at once (many
# teardowns' waits end together). If the loop was starved past that
# deadline, the machine is told (DEADLINE): SIGKILL now unless already
# sent, a last wait of at most CUT_SHORT_WAIT, then the receipt from what
# is seen (a process table shared
# with the other starved teardowns, at most CUT_SHORT_SCAN more: when 2,000
# teardowns are starved together, a private scan each would starve the loop
# further, for minutes).
#
# Every action can fail (EPERM, EMFILE, ENOSPC, a vanished file). A refused
# signal is a step with its outcome; an unforeseen failure is an "error"
# step, and the machine goes on as if the stage's wait had expired. A
# receipt is always written: if even that fails, an emergency receipt that
# claims nothing it did not see.

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from typing import Any, Literal

import trio

from . import _clock, _mass, _procfs, _signaller, _stale
from ._census import COOKIE_KEY
from ._domain import Sent, describe_error, signal_names, unchanged
from ._escalation import Do, Escalation, Event, State
from ._fates import Fates
from ._procfs import ProcessTable, ProcInfo
from ._receipt import (
    RAN_OUT,
    STATUS_LOST,
    Action,
    OutputState,
    ProcessRecord,
    Receipt,
    Step,
    StreamRecord,
    output_of,
    signame,
)
from ._spawn import Spawned

# Scheduling slack added to the teardown's deadline on top of its budgets:
# it covers the cost of the actions themselves (scans, signals, reaping).
TEARDOWN_ALLOWANCE = 0.5

# If the event loop was starved past the teardown's deadline (so the bound is
# already exceeded), how long the forced fallback may wait for the domain.
CUT_SHORT_WAIT = 0.25
# ... and how long, after that wait, it may wait for its share of a process
# table scan (many teardowns starved together share one; see run()). The
# two stay within the owner's own wait (OwnedCommand.teardown_bound, one
# more TEARDOWN_ALLOWANCE).
CUT_SHORT_SCAN = 0.2
# A signalling action already under way in the signaller thread when the
# deadline passed (a few system calls): how long to wait for its evidence.
# If it is still running after that, the leader is not reaped (see _finish).
IN_FLIGHT_WAIT = 0.05

_FORCE = (signal.SIGKILL,)


def _names(sigs: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(signame(s) for s in sigs)


class Teardown:
    """The timeline and the teardown of one owned command."""

    def __init__(
        self, spawned: Spawned, machine: Escalation, command: tuple[str, ...], subreaper: bool
    ) -> None:
        self.spawned = spawned
        self.machine = machine
        self.command = command
        self._subreaper = subreaper
        self._leader = spawned.leader
        self._domain = spawned.domain
        self._census = spawned.census
        self._drains = spawned.drains
        self._targets = spawned.targets
        self.steps: list[Step] = []
        self.receipt: Receipt | None = None
        self._fates = Fates()
        self._leftovers: set[int] = set()  # members that outlived a leader that exited
        # A scan taken after the last signal that showed nothing alive; the
        # receipt is written from it instead of scanning once more.
        self._final_table: ProcessTable | None = None
        # Past the deadline: when the question a scan must answer was asked
        # (a shared table begun after it answers it; see table_since).
        self._asked = -math.inf
        # When the stop was asked for (teardown time), set by the owner: the
        # teardown's deadline counts from then, not from when its task got
        # to run (on a loaded loop that can be much later).
        self.requested: float | None = None
        self._asked_stop = False  # counted by _mass.requested() (see ask())
        # A signalling action that started in the signaller thread and had
        # not finished when the teardown stopped waiting for it: the leader
        # must not be reaped while it may still be signalled.
        self._in_flight: _signaller.Job[Sent] | None = None
        # In a burst, the graceful stage's first signal, queued for the
        # signaller thread when the stop was asked for (see ask()): the
        # action, its second stage, when it was queued (teardown time) and its
        # signals.
        self._early: tuple[_signaller.Job[Sent], Callable[[Sent], Sent], float, tuple[int, ...]] | None = None
        self._deadline = math.inf  # the teardown's own (teardown time, _clock.py), once run() has begun
        # Teardown time, read directly (under the system clock the run's
        # clock: trio.current_time() is three Python calls, and every step
        # reads it).
        self._now = _clock.now_function()

    @property
    def budget(self) -> float:
        """The bound of the whole teardown, allowance included."""
        return self.machine.budgets.total + TEARDOWN_ALLOWANCE

    def step(
        self,
        action: Action,
        target: str,
        detail: str = "",
        outcome: str = "",
        signals: tuple[str, ...] = (),
        at: float | None = None,
    ) -> Step:
        """Record a step, at `at` (teardown time) if given, else now."""
        when = self._now() if at is None else at
        step = Step(when - self.spawned.origin, action, target, detail, outcome, signals)
        self.steps.append(step)
        return step

    def _lived(self) -> float:
        return self._now() - self.spawned.origin

    async def _table(self) -> ProcessTable:
        # The census will ask about our cookie in processes started since
        # the leader: a shared scan reads those environments once for all.
        leader = self._leader
        known = 0 if leader.reaped else leader.pid  # an unreaped leader holds its pid
        return await _procfs.table_for(leader.mark, COOKIE_KEY, leader.start, known)

    def _table_since_asked(self) -> ProcessTable:
        """A table begun after self._asked, without waiting (see table_since)."""
        return _procfs.table_since(self._leader.mark, self._asked)

    def ask(self, when: float) -> None:
        """The owner asks for the stop at `when` (teardown time): the bound
        counts from then, and the stop counts towards a burst (_mass.py)
        before this teardown's task gets to run."""
        self.requested = when
        if not self._asked_stop:
            self._asked_stop = True
            _mass.requested()
            self._signal_early()

    def _signal_early(self) -> None:
        """In a burst, queue the graceful stage's first signal for the
        signaller thread now, in the stop request's own batch of the loop,
        rather than when this teardown's task gets its turn: with 2,000
        commands cancelled together the turns are handed out over a second
        or more, and the kill storm (10,000 exits) then ran through the
        shared scans that followed it. The teardown awaits the action at
        SIGNAL_GRACEFUL as if it had queued it there; until then the leader
        stays unreaped (_withdraw_early), as for any signal under way."""
        if not _mass.in_burst() or self.machine.state is not State.RUNNING or self._leader.reaped:
            return
        sigs = self.machine.graceful
        first, then = self._domain.graceful_stages(sigs)
        try:
            job = _signaller.submit(first)
        except RuntimeError:  # no thread can be started: the teardown signals as usual
            return
        self._early = (job, then, self._now(), sigs)

    @property
    def signalled_early(self) -> bool:
        """Is a graceful signal queued at the stop request (see ask()) still
        to be taken up by run()? (False again once run() has taken it.) The
        owner asks before run() begins, and then reports a stop even if the
        leader exited before its task ran: our own signal may be what ended it."""
        return self._early is not None

    def _withdraw_early(self) -> None:
        """An early signal the teardown never awaited (it ended another
        way): withdrawn if it has not started; if it is being sent, the
        leader must stay unreaped (see _signalling); if it was sent, its
        step is recorded."""
        if self._early is None:
            return
        job, _then, submitted, sigs = self._early
        self._early = None
        if job.cancel():
            return
        if job.running:
            self._in_flight = job
        elif job.error is None and job.result is not None:
            self._record_sent(job, submitted, sigs)  # its second stage is moot now

    async def run(self) -> Receipt:
        """Perform the machine's actions, within the teardown's bound; return
        the receipt (always one)."""
        _mass.enter(asked=self._asked_stop)
        try:
            return await self._run_counted()
        finally:
            _mass.leave()
            _mass.gone(self)

    async def _run_counted(self) -> Receipt:
        if self.spawned.feeder is not None:
            self.spawned.feeder.scope.cancel()
        # The bound counts from the stop request when there was one: the
        # delay before this task ran is part of the teardown's time.
        now = self._now()
        deadline = (now if self.requested is None else min(self.requested, now)) + self.budget
        self._deadline = deadline
        if deadline > now:  # else the loop was starved past the whole bound: straight to the fallback
            with _clock.scope(deadline, shield=True):
                await self._run()
        try:
            if self.receipt is None:
                # The loop was starved past the teardown's deadline, or an
                # action failed while writing the receipt.
                self._asked = min(deadline, self._now())
                cut = self._now() + CUT_SHORT_WAIT + CUT_SHORT_SCAN
                with _clock.scope(cut, shield=True):
                    await self._cut_short()
                if self.receipt is None:
                    self._finish(self._table_since_asked())
        except Exception as exc:
            self._emergency_receipt(exc)
        assert self.receipt is not None
        return self.receipt

    async def _run(self) -> None:
        self._verify_placement()
        machine = self.machine
        action = machine.next_action
        while action is not Do.NOTHING:
            try:
                # In a burst, take turns before each action: the waits
                # before them end for many teardowns at once (the first:
                # the cancel that reached them all).
                await _mass.pace()
                action = await self._perform(action)
            except Exception as exc:
                # An action the OS refused in a way no stage foresaw (or a
                # bug): it is evidence, never a reason to skip a stage or a
                # bound. Go on as if the stage's wait had expired.
                self.step(Action.ERROR, "teardown", f"{action.name}: {type(exc).__name__}: {exc}", "failed")
                if action is Do.REAP:
                    return  # _own writes the receipt from what is seen
                if action is Do.ABANDON_DRAIN:
                    action = Do.REAP
                else:
                    pessimistic = Event.NOT_EMPTY if action is Do.CHECK_DOMAIN else Event.EXPIRED
                    action = machine.handle(pessimistic)

    def _verify_placement(self) -> None:
        try:
            problem = self._domain.verify()
        except OSError as exc:
            problem = f"placement could not be checked: {describe_error(exc)}"
        if problem:
            self.step(Action.SCAN, "placement", problem, "not verified")

    async def _perform(self, action: Do) -> Do:
        """Perform one action of the machine; return the next one."""
        machine = self.machine
        census = self._census
        if action is Do.CHECK_DOMAIN:
            table = await self._table()
            live = self._domain.live_members(table.rows)
            escapees = census.scan(self._domain, table)
            self.step(
                Action.SCAN,
                "domain",
                f"{len(live)} live member(s) after the leader exited; "
                f"census: {len(escapees)} outside the domain",
            )
            for info in live:
                self._fates.watch(info)
                self._leftovers.add(info.pid)
            event = Event.NOT_EMPTY if live else Event.ESCAPEES if escapees else Event.EMPTY
            if event is Event.EMPTY and self._domain.settles:
                # Nothing in sight, and no signal sent: the grace is unused.
                await self._domain.settle(machine.budgets.grace)
            if event is Event.EMPTY:
                self._final_table = table
            return machine.handle(event)
        if action is Do.SIGNAL_GRACEFUL:
            # Signal first: the scan costs milliseconds. The scan then
            # serves both the census and, as a hint of whom to wait for,
            # the domain's wait.
            sigs = machine.graceful
            self._fates.before_signal(None, kill=False)
            if self._early is not None:
                job, then, submitted, sigs = self._early  # (a later request_stop changes no signal sent)
                self._early = None
                await self._await_job(job, submitted, sigs, then)
            else:
                first, then = self._domain.graceful_stages(sigs)
                await self._send(first, sigs, then)
            if self._domain.empties_without_scan() and _mass.in_burst():
                # In a burst, a domain that learns it is empty without a
                # process table (a verified cgroup) waits first: its census
                # comes from the scan after the domain emptied, which serves
                # the receipt too (each shared scan of 10,000 processes costs
                # the loop ~0.2 s). Escapees found there get this stage's
                # signals and are waited for, as in _wait_empty.
                emptied = await self._wait_empty([], machine.budget(), "grace", sigs)
                return machine.handle(emptied)
            # A leader already gone before the table is asked for: a table
            # (always begun after its request) that shows no live member
            # then proves the domain empty, as the one its wait_empty would
            # take after waiting for the leader (in a mass teardown, where
            # the leader died of the signal, one shared scan less each).
            gone_before = not self._domain.empties_without_scan() and not self._leader.alive
            table = await self._table()
            escapees = census.scan(self._domain, table)
            if escapees and machine.signals_escapees:
                self._signal_escapees(escapees, sigs)
            proof = table if gone_before and not self._domain.live_members(table.rows) else None
            emptied = await self._wait_empty(escapees, machine.budget(), "grace", sigs, table.rows, proof)
            return machine.handle(emptied)
        if action is Do.SIGNAL_FORCE:
            self._fates.before_signal(None, kill=True)
            await self._send(self._domain.force, _FORCE)
            escapees = []
            if machine.signals_escapees:
                escapees = census.scan(self._domain, await self._table())
                if escapees:
                    self._signal_escapees(escapees, _FORCE)
            emptied = await self._wait_empty(escapees, machine.budget(), "kill_wait", _FORCE)
            return machine.handle(emptied)
        if action is Do.WAIT_DRAIN:
            budget = machine.budget()
            expired = False
            # The command has ended (or its domain emptied): its pipes are
            # mostly at their end already; see so now, not a turn later.
            pending = [drain for drain in self._drains.values() if not drain.take_eof()]
            if pending:
                with _clock.after(budget) as scope:
                    for drain in pending:
                        if not drain.done.is_set():  # (set meanwhile: no turn of the loop for it)
                            await drain.done.wait()
                expired = scope.cancelled_caught
            outcome = "expired" if expired else "eof"
            self.step(Action.WAIT, "output", f"budget {budget:g}s (drain_wait)", outcome)
            return machine.handle(Event.EXPIRED if expired else Event.EOF)
        if action is Do.ABANDON_DRAIN:
            for drain in self._drains.values():
                if not drain.done.is_set():
                    drain.abandon()
                    self.step(Action.DRAIN, drain.name, f"{drain.capture.total} byte(s) read", "abandoned")
            for drain in self._drains.values():
                await drain.done.wait()
            return machine.handle(Event.ABANDONED)
        if action is Do.REAP:
            final, self._final_table = self._final_table, None
            self._finish(final if final is not None else await self._table())
            return machine.handle(Event.REAPED)
        msg = f"unexpected action {action!r}"  # pragma: no cover - the machine has no other actions
        raise AssertionError(msg)

    def signal_step(
        self, target: str, sent: Sent, sigs: tuple[int, ...], note: str = "", at: float | None = None
    ) -> None:
        """Record a signalling action and what the OS refused."""
        outcome = f"failed: {sent.failed}" if sent.failed else note
        self.step(Action.SIGNAL, target, sent.detail, outcome, _names(sigs), at)

    async def _send(
        self, act: Callable[[], Sent], sigs: tuple[int, ...], then: Callable[[Sent], Sent] = unchanged
    ) -> None:
        """Perform the domain's signalling action `act` in the signaller
        thread (see _signaller.py: the loop keeps running meanwhile) and
        record its step, stamped when it was performed. The wait is bounded
        by the teardown's deadline: an action that had not started by then
        never does (a step says so); one that had is waited for a little
        longer, for its evidence. With few teardowns under way (_mass.INLINE_MAX)
        and none queued for the thread, it is sent from the loop at once.
        `then` (the action's second stage, see Domain.graceful_stages) runs
        on the loop once `act` is done, unless the deadline passed."""
        submitted = self._now()
        if _mass.under_way() <= _mass.INLINE_MAX and not _signaller.pending():
            self.signal_step("domain", then(act()), sigs)
            return
        try:
            job = _signaller.submit(act)
        except RuntimeError:  # no thread can be started: send from the loop
            self.signal_step("domain", then(act()), sigs)
            return
        await self._await_job(job, submitted, sigs, then)

    async def _await_job(
        self,
        job: _signaller.Job[Sent],
        submitted: float,
        sigs: tuple[int, ...],
        then: Callable[[Sent], Sent] = unchanged,
    ) -> None:
        """Wait for a signalling action queued for the signaller thread at
        `submitted` and record its step (see _send)."""
        try:
            await job.done.wait()
        except trio.Cancelled:
            if job.cancel():
                self.step(
                    Action.SIGNAL,
                    "domain",
                    f"{signal_names(sigs)} not sent: the teardown's deadline passed "
                    "while the action waited for the signaller thread",
                    "not sent",
                    _names(sigs),
                )
                raise
            with _clock.after(IN_FLIGHT_WAIT, shield=True):
                await job.done.wait()
            if job.done.is_set() and job.error is not None:
                error = job.error
                self.step(Action.ERROR, "domain", f"signal: {type(error).__name__}: {error}", "failed")
            elif job.done.is_set():
                self._record_sent(job, submitted, sigs)
            else:
                self._in_flight = job
                self.step(
                    Action.SIGNAL,
                    "domain",
                    f"{signal_names(sigs)}: still being sent when the teardown's deadline passed",
                    "unknown",
                    _names(sigs),
                )
            raise
        self._record_sent(job, submitted, sigs, then)
        # The thread reports many actions at once: take turns to go on.
        await _mass.pace()

    def _record_sent(
        self,
        job: _signaller.Job[Sent],
        submitted: float,
        sigs: tuple[int, ...],
        then: Callable[[Sent], Sent] = unchanged,
    ) -> None:
        if job.error is not None:
            raise job.error  # an unforeseen failure: _run records it as an error step
        assert job.result is not None
        # Stamped when the worker began sending, in teardown time (never
        # before the request).
        at = max(submitted, self._now() - (time.perf_counter() - job.started))
        self.signal_step("domain", then(job.result), sigs, at=at)

    def _signalling(self) -> bool:
        """Is a signalling action to the domain still under way (one the
        teardown stopped waiting for)? Then the leader must stay unreaped."""
        return self._in_flight is not None and self._in_flight.running

    def _force(self, note: str = "") -> None:
        """SIGKILL to the domain, whatever the OS answers."""
        self._fates.before_signal(None, kill=True)
        self.signal_step("domain", self._domain.force(), _FORCE, note)

    def _signal_escapees(self, escapees: list[ProcInfo], sigs: tuple[int, ...]) -> None:
        census = self._census
        before = len(census.failures)
        n = census.signal(escapees, sigs)
        names = _names(sigs)
        failed = census.failures[before:]
        outcome = f"failed: {'; '.join(failed)}" if failed else ""
        self.step(Action.SIGNAL, "escapees", f"{'+'.join(names)} to {n} census escapee(s)", outcome, names)

    async def _wait_empty(
        self,
        escapees: list[ProcInfo],
        budget: float,
        name: str,
        sigs: tuple[int, ...],
        hint: list[ProcInfo] | None = None,
        proof: ProcessTable | None = None,
    ) -> Event:
        """Wait up to `budget` for the domain to empty and, under the
        terminate policy, for the escapees too: a member that leaves the
        domain while we wait is found by a census taken once the domain is
        empty, gets this stage's signals `sigs`, and is waited for as well.
        `proof`: a table that already shows the domain empty (see
        SIGNAL_GRACEFUL), so the domain is not waited for again.

        The census's tables are waited for within the teardown's own
        deadline, not the stage's budget: the scan is ours, and its wait
        (in a mass teardown, for a shared round) is no time the command
        had. An escapee it finds after the budget is still signalled and
        then waited for within the budget (that is, not at all: the stage
        expired); a domain already empty with none found has emptied.
        (Measured with 2,000 cgroup commands: 74-160 teardowns whose
        cgroup had emptied were forced because their census table came
        after the grace, and their extra stage took them past the bound.)"""
        census = self._census
        owned = escapees if self.machine.signals_escapees else []
        self._final_table = None
        cut = False  # the teardown's deadline passed while a census table was awaited
        with _clock.after(budget) as scope:
            if proof is None:
                proof = await self._domain.wait_empty(hint)
            while True:
                if owned:
                    await census.wait_gone(owned)
                if not self.machine.signals_escapees:
                    break
                table = proof if proof is not None and not owned else await self._census_table()
                if table is None:  # the teardown's deadline passed while it was awaited
                    cut = True
                    break
                proof = None
                owned = self._census_of(table, sigs)
                if not owned:
                    break
        expired = scope.cancelled_caught or cut
        detail = f"budget {budget:g}s ({name})"
        if scope.cancelled_caught and not cut and not owned and self._final_table is None:
            # The budget ran out before the domain's emptying reached us (a
            # loaded loop sees a deadline and an exit in one batch, and the
            # deadline wins; or the scan that proves a group empty came
            # late): ask once more now, and a domain empty by then gets no
            # SIGKILL stage for nobody.
            expired = not await self._empty_when_run_out(sigs)
            if not expired:
                detail += f"; it had {RAN_OUT}"
        self.step(Action.WAIT, "domain", detail, "expired" if expired else "empty")
        return Event.EXPIRED if expired else Event.EMPTY

    async def _empty_when_run_out(self, sigs: tuple[int, ...]) -> bool:
        """Is the domain empty, with no escapee left, now that a stage's
        budget ran out? Its leader must have ended; a verified cgroup says
        the rest itself (cgroup.events), any other domain by a table. That
        table (for a cgroup, only the census's) is awaited within the
        teardown's deadline, as in _wait_empty: the scan is ours. Escapees
        it finds get `sigs`, and the answer is no."""
        domain = self._domain
        if self._leader.alive:
            return False
        try:
            kernel_says = domain.empties_without_scan()
            if kernel_says and not domain.is_empty():
                return False
        except OSError:
            return False  # a failed read proves nothing
        if kernel_says and not self.machine.signals_escapees:
            return True
        table = await self._census_table()
        if table is None:
            return False
        if not kernel_says and domain.live_members(table.rows):
            return False
        if not self.machine.signals_escapees:
            return True
        return not self._census_of(table, sigs)

    async def _census_table(self) -> ProcessTable | None:
        """A table for a stage's census, awaited within the teardown's own
        deadline, not the stage's budget (the scan is ours); None if that
        deadline passed first."""
        with _clock.scope(self._deadline, shield=True) as bound:
            table = await self._table()
        return None if bound.cancelled_caught else table

    def _census_of(self, table: ProcessTable, sigs: tuple[int, ...]) -> list[ProcInfo]:
        """The escapees `table` shows; those not signalled yet get `sigs`.
        With none, the table was taken after every signal and shows nothing
        left: the receipt is written from it (see REAP)."""
        census = self._census
        owned = census.scan(self._domain, table)
        if not owned:
            self._final_table = table
            return owned
        fresh = census.unsignalled(owned)
        if fresh:
            self._signal_escapees(fresh, sigs)
        return owned

    async def _cut_short(self) -> None:
        """The teardown's own deadline expired before it finished (the event
        loop was starved, say): force now if that has not happened yet, wait
        at most CUT_SHORT_WAIT for the domain, then write the receipt from
        what is seen."""
        machine = self.machine
        if machine.state.value == "done":
            return
        if machine.handle(Event.DEADLINE) is Do.FORCE_AND_REAP:
            self._force("teardown deadline expired")
            if machine.signals_escapees:
                # Without waiting: a scan begun since our deadline passed
                # (another teardown starved with us took it) will do.
                table = self._table_since_asked()
                escapees = self._census.scan(self._domain, table)
                if escapees:
                    self._signal_escapees(escapees, _FORCE)
        waited_until = self._now() + CUT_SHORT_WAIT
        with _clock.scope(waited_until) as scope:
            try:
                await self._domain.wait_empty()
            except Exception as exc:
                self.step(Action.ERROR, "domain", f"wait: {type(exc).__name__}: {exc}", "failed")
                await trio.sleep_forever()  # the bound above ends it
        outcome = "expired" if scope.cancelled_caught else "empty"
        self.step(Action.WAIT, "domain", f"budget {CUT_SHORT_WAIT:g}s (after the deadline)", outcome)
        # The receipt's scan must begin after this wait ended (or expired):
        # a shared one, while this scope lasts; else see run().
        self._asked = waited_until if scope.cancelled_caught else self._now()
        self._finish(await self._table())

    def _finish(self, table: ProcessTable | None = None) -> None:
        """Reap, release, and write the receipt. Never waits.

        `table` is a process-table scan taken for this purpose; without one
        (an emergency exit of the teardown) a private scan is made.
        """
        self._withdraw_early()
        if table is None:
            table = ProcessTable(_procfs.snapshot(self._leader.mark))
        domain = self._domain
        leader = self._leader
        machine = self.machine
        for drain in self._drains.values():
            if not drain.done.is_set():
                drain.abandon()
        if domain.placement_pending():
            self._verify_placement()  # the leader is a zombie now: its cgroup still shows
        elif machine.cause != "exited" or self._leftovers:
            moved = domain.left()  # (not on the plain exit's path: a read per command)
            if moved:
                self.step(Action.SCAN, "placement", moved, "left")
        members = domain.members(table.rows)
        live: list[ProcInfo] = []
        zombies: list[ProcInfo] = []
        for m in members:
            (zombies if m.zombie else live).append(m)
        if domain.seen:
            listed = {m.pid for m in members}
            for pid, start in sorted(domain.seen.items()):
                if pid in listed:
                    continue
                info = _procfs.read_stat(pid)
                if info is not None and info.zombie and info.start == start:
                    zombies.append(info)
        reaped_orphans = 0
        if self._subreaper:
            from ._subreaper import reap_orphans

            reaped_orphans = reap_orphans(zombies)
            zombies = [z for z in zombies if _procfs.read_stat(z.pid) is not None]
        domain_empty = domain.is_empty(table.rows)
        escaped = self._census.scan(domain, table)
        leader_alive = leader.alive
        if self._signalling():
            leader.defer()
            self.step(
                Action.REAP,
                "leader",
                "a signal to its domain may still be under way: reaped later, at a later spawn",
                "not reaped",
            )
        elif leader.lost:
            leader.reap()
            self.step(
                Action.REAP,
                "leader",
                "reaped by someone else (SIGCHLD ignored, or a wait for any child): its exit status "
                "is unknown, and 0 is reported, as subprocess reports it",
                STATUS_LOST,
            )
        elif leader.reap():
            self.step(Action.REAP, "leader", f"returncode {leader.returncode}")
        else:
            leader.defer()
            self.step(Action.REAP, "leader", "still alive: reaped later, at a later spawn", "not reaped")
        failures = domain.read_failures()
        if failures:
            # Reads that failed proved nothing: the receipt says which.
            self.step(Action.ERROR, "domain", "; ".join(failures[:5]), "failed")
        released = domain.release()
        if released:
            outcome = "not removed" if "NOT removed" in released else "removed"
            self.step(Action.RELEASE, "domain", released, outcome)
        if machine.forced and domain.kind == "process-group" and not _mass.in_burst():
            self._remove_stale()
        keeper, keeper_note = self.spawned.guard.close()  # released: the keeper may forget it
        streams, output = self._output_record()
        still = [ProcessRecord(m.pid, _procfs.cmdline(m.pid), "alive") for m in live] if live else []
        if leader_alive:
            still.insert(0, ProcessRecord(leader.pid, _procfs.cmdline(leader.pid), "alive (the leader)"))
        census = self._census
        extras: dict[str, Any] = {}
        if reaped_orphans:
            extras["reaped_orphans"] = reaped_orphans
        if keeper_note and keeper != "guarded":
            extras["keeper_note"] = keeper_note
        self.receipt = Receipt(
            cause=machine.cause or "error",
            returncode=leader.returncode,
            domain=domain.kind,
            forced=machine.forced,
            domain_empty=domain_empty,
            output=output,
            escaped=tuple(ProcessRecord(e.pid, _procfs.cmdline(e.pid), "alive") for e in escaped),
            steps=tuple(self.steps),
            command=self.command,
            pid=leader.pid,
            domain_id=domain.ident,
            leftovers=tuple(self._fates.record(p) for p in sorted(self._leftovers)),
            unreaped=tuple(ProcessRecord(z.pid, "", "zombie") for z in zombies) if zombies else (),
            census=self._census_records(escaped),
            still_seen=tuple(still),
            streams=streams,
            escapee_policy=census.policy,
            census_scanned=not census.unreadable,
            census_unreadable=len(census.unreadable),
            escape_evidence=domain.escape_evidence,
            keeper=keeper,
            duration=self._lived(),
            extras=extras,
        )

    def _remove_stale(self) -> None:
        """After a forced teardown on the process-group domain: a member may
        have been an owner whose keeper was ended with it (a nested owner
        and its keeper both killed), leaving its commands' cgroups, now
        empty, under the cgroup root it shares with us. Those are removed
        now rather than at a later process's sweep (rmdir only: the cgroup
        domain removes what its commands made with its own cgroup)."""
        try:
            from ._cgroup import default_root

            root = default_root()
            removed = _stale.remove_empty(root) if root else []
        except Exception as exc:
            self.step(Action.ERROR, "stale domains", f"{type(exc).__name__}: {exc}", "failed")
            return
        if removed:
            self.step(
                Action.RELEASE,
                "stale domains",
                f"removed {len(removed)} empty cgroup(s) whose owner is gone: {', '.join(removed)}",
                "removed",
            )

    def _census_records(self, escaped: list[ProcInfo]) -> tuple[ProcessRecord, ...]:
        """The census's escapees and their fates, those still alive (named
        in `escaped`) left out."""
        if not self._census.found:
            return ()
        escaped_pids = {e.pid for e in escaped}
        return tuple(rec for rec in self._census.records() if rec.pid not in escaped_pids)

    def _output_record(self) -> tuple[tuple[StreamRecord, ...], OutputState]:
        """Each stream's record, and the output state they add up to."""
        streams = []
        for name in ("stdout", "stderr"):
            drain = self._drains.get(name)
            if drain is None:
                target = self._targets.get(name, "")
                if target != "merged into stdout":  # then its bytes are stdout's record
                    streams.append(StreamRecord(name, "not captured", 0, 0, 0, target))
                continue
            cap = drain.capture
            state: Literal["eof", "abandoned", "closed"] = (
                "eof" if drain.eof else "closed" if drain.closed_by_reader else "abandoned"
            )
            streams.append(StreamRecord(name, state, cap.total, cap.kept, cap.dropped, "capture"))
        output = output_of(streams)
        return tuple(streams), output

    def _emergency_receipt(self, exc: BaseException) -> None:
        """The last resort when writing the receipt itself failed: a receipt
        that claims nothing it has not seen (domain not proven empty)."""
        self.step(Action.ERROR, "teardown", f"writing the receipt: {type(exc).__name__}: {exc}", "failed")
        leader = self._leader
        try:
            self._withdraw_early()
            if self._signalling() or not leader.reap():
                leader.defer()
            self.step(Action.REAP, "leader", f"returncode {leader.returncode}")
        except Exception:
            leader.defer()
        try:
            released = self._domain.release()
            if released:
                self.step(Action.RELEASE, "domain", released)
        except Exception as error:
            self.step(Action.ERROR, "domain", f"release: {type(error).__name__}: {error}", "failed")
        keeper, keeper_note = self.spawned.guard.close()
        returncode = leader.returncode
        self.receipt = Receipt(
            cause=self.machine.cause or "error",
            returncode=returncode,
            domain=self._domain.kind,
            forced=self.machine.forced,
            domain_empty=False,
            output="abandoned" if self._drains else "not captured",
            steps=tuple(self.steps),
            command=self.command,
            pid=self._leader.pid,
            domain_id=self._domain.ident,
            escape_evidence=self._domain.escape_evidence,
            keeper=keeper,
            duration=self._lived(),
            extras={"keeper_note": keeper_note} if keeper_note and keeper != "guarded" else {},
        )
