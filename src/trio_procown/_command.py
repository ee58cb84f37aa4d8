# Owned commands: the lifecycle that every way out of the block shares.
#
# Theory of operation.
#
# open_owned_command() spawns the command into an ownership domain (a new
# session / process group, or a cgroup) and opens a nursery that holds, for
# the whole lifecycle, the single drain of each output pipe, the stdin
# feeder, and the *owner task*. The owner task waits for one of: the leader
# exiting by itself, the command's own deadline (`timeout`), or a stop
# request from the block (outer cancellation, KeyboardInterrupt, an
# exception in the body). Then it runs the teardown, driving the pure state
# machine of _escalation.py:
#
#   1. SIGTERM + SIGCONT to the domain (and to census escapees)
#   2. wait <= grace for it to be empty
#   3. SIGKILL (forced = True)
#   4. wait <= kill_wait
#   5. wait <= drain_wait for EOF, then close the read ends ("abandoned")
#   6. reap the leader, release the domain, write the receipt
#
# When the leader exited by itself, steps 1-4 run only if the domain still
# holds live processes (owned work that outlived it); otherwise nothing is
# signalled. The teardown runs in a shielded cancel scope whose deadline is
# grace + kill_wait + drain_wait + TEARDOWN_ALLOWANCE, so neither a second
# cancellation nor a misbehaving command can stop it or make it unbounded.
#
# The teardown runs in the owner task, not in the task that runs the block,
# and the owner task is KI-protected: a KeyboardInterrupt is delivered to the
# main task, whose wait for the teardown catches it, waits out the (bounded)
# teardown, and re-raises it. The block's own exception is caught *inside*
# the nursery and re-raised after it closes, so it propagates as itself
# rather than wrapped in an ExceptionGroup.

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict, Unpack, final

import trio
from trio_util import AsyncValue

from . import _procfs
from ._census import COOKIE_VAR, Census, EscapeePolicy
from ._domain import Domain, Sent, describe_error
from ._drain import DEFAULT_MAX_OUTPUT, ChunkStream, Drain, lines
from ._escalation import Budgets, Do, Escalation, Event
from ._fates import Fates
from ._leader import Leader
from ._procfs import ProcessTable, ProcInfo
from ._receipt import (
    Action,
    Cause,
    HandoffReceipt,
    OutputState,
    ProcessRecord,
    Receipt,
    Step,
    StreamRecord,
)
from ._select import DomainChoice, make_domain
from ._stdin import Feeder, StdinSource

if TYPE_CHECKING:
    from ._service import ServiceOwner


class HandoffError(RuntimeError):
    """A command cannot be handed off (already handed off, ended, or the
    owner is closed).

    Synopsis::

        try:
            await run.hand_off(owner, reason="keep it running")
        except trio_procown.HandoffError:
            ...  # the command already ended: read run.receipt
    """


# Scheduling slack added to the teardown's deadline on top of its budgets:
# it covers the cost of the actions themselves (scans, signals, reaping).
TEARDOWN_ALLOWANCE = 0.5

# If the event loop was starved past the teardown's deadline (so the bound is
# already exceeded), how long the forced fallback may wait for the domain.
CUT_SHORT_WAIT = 0.25

CAPTURE = "capture"
STDOUT = "stdout"
DEVNULL = "devnull"
Target: TypeAlias = "str | os.PathLike[str]"
Phase = Literal["running", "tearing down", "done"]
Command: TypeAlias = "str | Sequence[str | os.PathLike[str]]"


def _check_budget(name: str, value: float | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if optional and value == math.inf:
        return  # timeout=inf: no deadline of its own, like None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        msg = f"{name} must be a number of seconds, not {value!r}"
        raise TypeError(msg)
    if math.isnan(value) or value < 0 or math.isinf(value):
        # inf would make the teardown unbounded: every budget has a bound.
        msg = f"{name} must be a finite, non-negative number of seconds, not {value!r}"
        raise ValueError(msg)


def _resolve_argv(command: Command, cwd: str | os.PathLike[str] | None, path: str | None) -> list[str]:
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = [os.fspath(a) for a in command]
    if not argv:
        msg = "the command is empty"
        raise ValueError(msg)
    exe = argv[0]
    if os.sep not in exe:
        found = shutil.which(exe, path=path)
        if found is None:
            msg = f"executable not found on PATH: {exe!r}"
            raise FileNotFoundError(2, msg, exe)
        argv[0] = found
    else:
        full = exe if cwd is None or os.path.isabs(exe) else os.path.join(os.fspath(cwd), exe)
        if not os.path.exists(full):
            msg = f"executable not found: {exe!r}"
            raise FileNotFoundError(2, msg, exe)
        if os.path.isdir(full) or not os.access(full, os.X_OK):
            msg = f"not an executable file: {exe!r}"
            raise PermissionError(13, msg, exe)
    return argv


def _open_target(target: Target) -> int:
    return os.open(os.fspath(target), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)


@final
class OwnedCommand:
    """A running owned command: its pid, its output so far, its receipt.

    Built only by `open_owned_command`; see there.

    Synopsis::

        async with trio_procown.open_owned_command(["sh", "-c", "echo building; sleep 0.1"]) as run:
            print(run.pid, run.phase.value)
            receipt = await run.wait()
        print(run.stdout, run.receipt)
    """

    def __init__(self, _private: object) -> None:
        if _private is not _TOKEN:
            msg = "use trio_procown.open_owned_command() to start a command"
            raise TypeError(msg)
        self.command: tuple[str, ...] = ()
        self.phase: AsyncValue[Phase] = AsyncValue("running")
        self.receipt: Receipt | None = None
        self._leader: Leader
        self._domain: Domain
        self._census: Census
        self._drains: dict[str, Drain] = {}
        self._feeder: Feeder | None = None
        self._machine: Escalation
        self._deadline = math.inf
        self._started = 0.0
        # Shielded: an outer cancel reaches the owner task only as a stop
        # request from the block (see open_owned_command).
        self._life_scope = trio.CancelScope(shield=True)
        self._relocating = False  # a handoff is moving the tasks to an owner
        self._own_stopped = trio.Event()
        self.handoff: HandoffReceipt | None = None
        self._stop_cause: Cause | None = None
        # A scan taken after the last signal that showed nothing alive; the
        # receipt is written from it instead of scanning once more.
        self._final_table: ProcessTable | None = None
        self._done = trio.Event()
        self._steps: list[Step] = []
        self._leftovers: set[int] = set()  # members that outlived a leader that exited
        self._fates = Fates()
        self._targets: dict[str, str] = {}  # where each uncaptured stream goes
        self._subreaper = False

    # -- public surface -------------------------------------------------------
    @property
    def pid(self) -> int:
        """The pid of the direct process (the domain's leader)."""
        return self._leader.pid

    @property
    def stdout(self) -> bytes:
        """Bytes of stdout captured so far (complete after the block)."""
        drain = self._drains.get("stdout")
        return drain.capture.getvalue() if drain else b""

    @property
    def stderr(self) -> bytes:
        """Bytes of stderr captured so far (complete after the block)."""
        drain = self._drains.get("stderr")
        return drain.capture.getvalue() if drain else b""

    @property
    def domain(self) -> str:
        """The kind of ownership domain holding the command."""
        return self._domain.kind

    @property
    def domain_id(self) -> str:
        """What identifies the domain: ``"pgid N"`` or the cgroup's path."""
        return self._domain.ident

    @property
    def returncode(self) -> int | None:
        """The leader's status once known (-N when killed by signal N)."""
        return self._leader.returncode

    async def wait(self) -> Receipt:
        """Wait for the leader to exit (or the own timeout), tear down what
        remains of its domain, and return the receipt.

        Synopsis::

            async with trio_procown.open_owned_command(["sh", "-c", "echo building"], timeout=60) as run:
                receipt = await run.wait()
            print(receipt.cause, receipt.returncode)
        """
        await self._done.wait()
        assert self.receipt is not None
        return self.receipt

    async def terminate(self) -> Receipt:
        """Tear the command down now (cause ``"stopped"``) and return the
        receipt; the same bounded teardown as every other way out.

        Synopsis::

            async with trio_procown.open_owned_command(["sleep", "30"]) as run:
                ...  # runs until terminated
                receipt = await run.terminate()
        """
        self._request_stop("stopped")
        return await self.wait()

    async def hand_off(self, owner: ServiceOwner, *, reason: str) -> HandoffReceipt:
        """Move this running command to a longer-lived `owner`; leaving this
        block then no longer tears it down: the owner's `stop()` or exit does,
        with the same bounded teardown. The command's single drain moves with
        it (never two readers); its stdin, if fed by us, is closed, and its
        own `timeout` no longer applies.

        Raises HandoffError if the command was already handed off, is no
        longer running, or the owner is closed.

        Synopsis::

            async with trio_procown.open_service_owner() as owner:
                server = [sys.executable, "-m", "http.server", "8123"]
                async with trio_procown.open_owned_command(server) as run:
                    with trio.fail_after(10):
                        await trio_procown.ready_port(8123)(run)  # any probe can be awaited
                    await run.hand_off(owner, reason="shared by the whole test session")
                ...  # the server runs on; the owner's exit stops it
        """
        if self.handoff is not None:
            msg = f"pid {self.pid} was already handed off to {self.handoff.to_owner}"
            raise HandoffError(msg)
        if self._done.is_set() or self._stop_cause is not None or self.phase.value != "running":
            msg = f"pid {self.pid} is no longer running ({self.phase.value}); nothing to hand off"
            raise HandoffError(msg)
        owner._check_open()
        with trio.CancelScope(shield=True):  # bounded: the tasks stop at once
            self._own_stopped = trio.Event()
            self._relocating = True
            self._life_scope.cancel()
            await self._own_stopped.wait()
            self._relocating = False
            if self._done.is_set() or self.phase.value != "running":
                msg = f"pid {self.pid} ended during the handoff; see its receipt"
                raise HandoffError(msg)
            for drain in self._drains.values():
                await drain.pause()
        if self._feeder is not None:
            self._feeder.scope.cancel()
        self._deadline = math.inf
        step = self._step(Action.HANDOFF, "owner", f"to {owner.name}: {reason}")
        b = self._machine.budgets
        self.handoff = HandoffReceipt(
            pid=self.pid,
            command=self.command,
            from_owner="open_owned_command block",
            to_owner=owner.name,
            at=step.at,
            wall_time=time.time(),
            reason=reason,
            domain=self.domain,
            domain_id=self.domain_id,
            termination=(
                f"ended by the owner's stop() or exit with the bounded teardown: SIGTERM+SIGCONT, "
                f"grace {b.grace:g}s, SIGKILL, kill_wait {b.kill_wait:g}s, drain_wait {b.drain_wait:g}s"
            ),
        )
        owner._adopt(self)
        return self.handoff

    def _relaunch(self, nursery: trio.Nursery) -> None:
        """Start the drains and the owner task in another nursery (handoff)."""
        for drain in self._drains.values():
            nursery.start_soon(drain.run)
        nursery.start_soon(self._own)

    def stream(self, name: Literal["stdout", "stderr"] = "stdout", *, lossless: bool = False) -> ChunkStream:
        """Iterate over a stream's bytes: everything still retained from the
        start, then live chunks until end of output.

        The iterator is fed by the command's single drain, never by reading
        the pipe. Policy for slow consumers: by default the drain never waits
        for them; if a consumer falls so far behind that bytes it has not
        seen were dropped by `max_output`, it skips to the oldest retained
        byte (counted in `.skipped`; the record itself is not affected).
        With ``lossless=True`` the consumer holds the drain back instead:
        no byte is dropped before it has read it, and a slow consumer slows
        the command (its writes block) rather than losing output. Close a
        lossless stream you stop reading early (``async with`` or
        ``.close()``), or it keeps holding the command back until the
        teardown, whose drain wait stays bounded by `drain_wait`.

        Synopsis::

            async with trio_procown.open_owned_command(cmd) as run:
                async for chunk in run.stream("stdout"):
                    print(chunk.decode(errors="replace"), end="")
        """
        drain = self._drains.get(name)
        if drain is None:
            msg = f"{name} is not captured for this command"
            raise ValueError(msg)
        return drain.chunks(lossless=lossless)

    def lines(
        self,
        name: Literal["stdout", "stderr"] = "stdout",
        *,
        encoding: str = "utf-8",
        errors: str = "replace",
        lossless: bool = False,
    ) -> AsyncIterator[str]:
        """Iterate over a stream's text lines (newline kept; a last line
        without one is yielded too), decoded incrementally so a character
        split across reads comes out whole. Same policy as `stream`.

        Synopsis::

            async for line in run.lines("stderr"):
                log.warning(line.rstrip())
        """
        return lines(self.stream(name, lossless=lossless), encoding, errors)

    # -- lifecycle ------------------------------------------------------------
    def _step(self, action: Action, target: str, detail: str = "", outcome: str = "") -> Step:
        step = Step(trio.current_time() - self._started, action, target, detail, outcome)
        self._steps.append(step)
        return step

    def _lived(self) -> float:
        return trio.current_time() - self._started

    async def _table(self) -> ProcessTable:
        return await _procfs.table_for(self._leader.mark)

    def _request_stop(self, cause: Cause) -> None:
        if self._stop_cause is None:
            self._stop_cause = cause
        self._life_scope.cancel()

    def _launch(self, nursery: trio.Nursery) -> None:
        for drain in self._drains.values():
            nursery.start_soon(drain.run)
        if self._feeder is not None:
            nursery.start_soon(self._feeder.run)
        nursery.start_soon(self._own)

    @trio.lowlevel.enable_ki_protection
    async def _own(self) -> None:
        exited = False
        self._life_scope = trio.CancelScope(shield=True, deadline=self._deadline)
        if self._stop_cause is not None or self._relocating:
            self._life_scope.cancel()
        with self._life_scope:
            await self._leader.wait()
            exited = True
        if self._relocating and not exited and self._stop_cause is None:
            self._own_stopped.set()  # a handoff moves us to the owner's nursery
            return
        machine = self._machine
        code = self._leader.poll()
        if exited or (code is not None and self._stop_cause is None):
            self._step(Action.EXIT, "leader", f"returncode {code}", "exited")
            machine.handle(Event.LEADER_EXITED)
        else:
            cause: Cause = self._stop_cause or "timed_out"
            self._step(Action.STOP, "leader", cause)
            machine.handle(Event.STOP, cause=cause)
        self.phase.value = "tearing down"
        deadline = trio.current_time() + machine.budgets.total + TEARDOWN_ALLOWANCE
        with trio.CancelScope(deadline=deadline, shield=True):
            await self._teardown()
        try:
            if self.receipt is None:
                # The loop was starved past the teardown's deadline, or an
                # action failed while writing the receipt.
                with trio.CancelScope(deadline=trio.current_time() + CUT_SHORT_WAIT, shield=True):
                    await self._cut_short()
                if self.receipt is None:
                    self._finish()
        except Exception as exc:
            self._emergency_receipt(exc)
        self.phase.value = "done"
        self._done.set()
        self._own_stopped.set()

    async def _teardown(self) -> None:
        if self._feeder is not None:
            self._feeder.scope.cancel()
        self._verify_placement()
        machine = self._machine
        action = machine.next_action
        while action is not Do.NOTHING:
            try:
                action = await self._perform(action)
            except Exception as exc:
                # An action the OS refused in a way no stage foresaw (or a
                # bug): it is evidence, never a reason to skip a stage or a
                # bound. Go on as if the stage's wait had expired.
                self._step(Action.ERROR, "teardown", f"{action.name}: {type(exc).__name__}: {exc}", "failed")
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
            self._step(Action.SCAN, "placement", problem, "not verified")

    async def _perform(self, action: Do) -> Do:
        """Perform one action of the machine; return the next one."""
        machine = self._machine
        census = self._census
        if action is Do.CHECK_DOMAIN:
            table = await self._table()
            live = self._domain.live_members(table.rows)
            escapees = census.scan(self._domain, table)
            self._step(
                Action.SCAN,
                "domain",
                f"{len(live)} live member(s) after the leader exited; "
                f"census: {len(escapees)} outside the domain",
            )
            for info in live:
                self._fates.watch(info)
                self._leftovers.add(info.pid)
            owned_escapees = escapees if census.policy == "terminate" else []
            event = Event.NOT_EMPTY if live or owned_escapees else Event.EMPTY
            if event is Event.EMPTY and not escapees:
                self._final_table = table
            return machine.handle(event)
        if action is Do.SIGNAL_GRACEFUL:
            # Signal first: the scan costs milliseconds. The scan then
            # serves both the census and, as a hint of whom to wait for,
            # the domain's wait.
            sigs = (signal.SIGTERM, signal.SIGCONT)
            self._fates.before_signal(None, kill=False)
            self._signal_step("domain", self._domain.signal_graceful())
            table = await self._table()
            escapees = census.scan(self._domain, table)
            if escapees and census.policy == "terminate":
                self._signal_escapees(escapees, sigs)
            emptied = await self._wait_empty(escapees, machine.budget(), "grace", sigs, table.rows)
            return machine.handle(emptied)
        if action is Do.SIGNAL_FORCE:
            self._force()
            escapees = []
            if census.policy == "terminate":
                escapees = census.scan(self._domain, await self._table())
                if escapees:
                    self._signal_escapees(escapees, (signal.SIGKILL,))
            emptied = await self._wait_empty(escapees, machine.budget(), "kill_wait", (signal.SIGKILL,))
            return machine.handle(emptied)
        if action is Do.WAIT_DRAIN:
            budget = machine.budget()
            with trio.move_on_after(budget) as scope:
                for drain in self._drains.values():
                    await drain.done.wait()
            outcome = "expired" if scope.cancelled_caught else "eof"
            self._step(Action.WAIT, "output", f"budget {budget:g}s (drain_wait)", outcome)
            return machine.handle(Event.EXPIRED if scope.cancelled_caught else Event.EOF)
        if action is Do.ABANDON_DRAIN:
            for drain in self._drains.values():
                if not drain.done.is_set():
                    drain.abandon()
                    self._step(Action.DRAIN, drain.name, f"{drain.capture.total} byte(s) read", "abandoned")
            for drain in self._drains.values():
                await drain.done.wait()
            return Do.REAP
        if action is Do.REAP:
            final, self._final_table = self._final_table, None
            self._finish(final if final is not None else await self._table())
            return machine.handle(Event.REAPED)
        msg = f"unexpected action {action!r}"  # pragma: no cover - the machine has no other actions
        raise AssertionError(msg)

    def _signal_step(self, target: str, sent: Sent, note: str = "") -> None:
        self._step(Action.SIGNAL, target, sent.detail, f"failed: {sent.failed}" if sent.failed else note)

    def _force(self, note: str = "") -> None:
        """SIGKILL to the domain, whatever the OS answers."""
        self._fates.before_signal(None, kill=True)
        self._signal_step("domain", self._domain.force(), note)

    def _signal_escapees(self, escapees: list[ProcInfo], sigs: tuple[int, ...]) -> None:
        census = self._census
        before = len(census.failures)
        n = census.signal(escapees, sigs)
        names = "+".join(signal.Signals(s).name for s in sigs)
        failed = census.failures[before:]
        outcome = f"failed: {'; '.join(failed)}" if failed else ""
        self._step(Action.SIGNAL, "escapees", f"{names} to {n} census escapee(s)", outcome)

    async def _wait_empty(
        self,
        escapees: list[ProcInfo],
        budget: float,
        name: str,
        sigs: tuple[int, ...],
        hint: list[ProcInfo] | None = None,
    ) -> Event:
        """Wait up to `budget` for the domain to empty and, under the
        terminate policy, for the escapees too: a member that leaves the
        domain while we wait is found by a census taken once the domain is
        empty, gets this stage's signals `sigs`, and is waited for as well."""
        census = self._census
        owned = escapees if census.policy == "terminate" else []
        self._final_table = None
        with trio.move_on_after(budget) as scope:
            proof = await self._domain.wait_empty(hint)
            while True:
                if owned:
                    await census.wait_gone(owned)
                if census.policy != "terminate":
                    break
                table = proof if proof is not None and not owned else await self._table()
                proof = None
                owned = census.scan(self._domain, table)
                if not owned:
                    # Taken after every signal, showing nothing left: the
                    # receipt can be written from it (see REAP).
                    self._final_table = table
                    break
                fresh = census.unsignalled(owned)
                if fresh:
                    self._signal_escapees(fresh, sigs)
        outcome = "expired" if scope.cancelled_caught else "empty"
        self._step(Action.WAIT, "domain", f"budget {budget:g}s ({name})", outcome)
        return Event.EXPIRED if scope.cancelled_caught else Event.EMPTY

    async def _cut_short(self) -> None:
        """The teardown's own deadline expired before it finished (the event
        loop was starved, say): force now if that has not happened yet, wait
        at most CUT_SHORT_WAIT for the domain, then write the receipt from
        what is seen."""
        machine = self._machine
        if not machine.forced:
            machine.forced = True
            self._force("teardown deadline expired")
            if self._census.policy == "terminate":
                table = ProcessTable(_procfs.snapshot(self._leader.mark))
                escapees = self._census.scan(self._domain, table)
                if escapees:
                    self._signal_escapees(escapees, (signal.SIGKILL,))
        with trio.move_on_after(CUT_SHORT_WAIT) as scope:
            try:
                await self._domain.wait_empty()
            except Exception as exc:
                self._step(Action.ERROR, "domain", f"wait: {type(exc).__name__}: {exc}", "failed")
                await trio.sleep_forever()  # the bound above ends it
        outcome = "expired" if scope.cancelled_caught else "empty"
        self._step(Action.WAIT, "domain", f"budget {CUT_SHORT_WAIT:g}s (after the deadline)", outcome)
        self._finish()

    def _finish(self, table: ProcessTable | None = None) -> None:
        """Reap, release, and write the receipt. Never waits.

        `table` is a process-table scan taken for this purpose; without one
        (an emergency exit of the teardown) a private scan is made.
        """
        if table is None:
            table = ProcessTable(_procfs.snapshot(self._leader.mark))
        domain = self._domain
        leader = self._leader
        machine = self._machine
        for drain in self._drains.values():
            if not drain.done.is_set():
                drain.abandon()
        if self._domain.placement_pending():
            self._verify_placement()  # the leader is a zombie now: its cgroup still shows
        members = domain.members(table.rows)
        live = [m for m in members if not m.zombie]
        zombies = [m for m in members if m.zombie]
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
        if leader.reap():
            self._step(Action.REAP, "leader", f"returncode {leader.returncode}")
        else:
            leader.defer()
            self._step(Action.REAP, "leader", "still alive: reaped later, at a later spawn", "not reaped")
        released = domain.release()
        if released:
            outcome = "not removed" if "NOT removed" in released else "removed"
            self._step(Action.RELEASE, "domain", released, outcome)
        streams, output = self._output_record()
        still = [ProcessRecord(m.pid, _procfs.cmdline(m.pid), "alive") for m in live]
        if leader_alive:
            still.insert(0, ProcessRecord(leader.pid, _procfs.cmdline(leader.pid), "alive (the leader)"))
        escaped_pids = {e.pid for e in escaped}
        census = self._census
        extras: dict[str, Any] = {}
        if reaped_orphans:
            extras["reaped_orphans"] = reaped_orphans
        self.receipt = Receipt(
            cause=machine.cause or "error",
            returncode=leader.returncode,
            domain=domain.kind,
            forced=machine.forced,
            domain_empty=domain_empty,
            output=output,
            escaped=tuple(ProcessRecord(e.pid, _procfs.cmdline(e.pid), "alive") for e in escaped),
            steps=tuple(self._steps),
            command=self.command,
            pid=leader.pid,
            domain_id=domain.ident,
            leftovers=tuple(self._fates.record(p) for p in sorted(self._leftovers)),
            unreaped=tuple(ProcessRecord(z.pid, "", "zombie") for z in zombies),
            census=tuple(rec for rec in census.records() if rec.pid not in escaped_pids),
            still_seen=tuple(still),
            streams=streams,
            escapee_policy=census.policy,
            census_scanned=not census.unreadable,
            census_unreadable=len(census.unreadable),
            duration=self._lived(),
            extras=extras,
        )

    def _output_record(self) -> tuple[tuple[StreamRecord, ...], OutputState]:
        """Each stream's record, and the output state they add up to."""
        streams = []
        truncated = False
        for name in ("stdout", "stderr"):
            drain = self._drains.get(name)
            if drain is None:
                target = self._targets.get(name, "")
                if target != "merged into stdout":  # then its bytes are stdout's record
                    streams.append(StreamRecord(name, "not captured", 0, 0, 0, target))
                continue
            cap = drain.capture
            truncated |= cap.dropped > 0
            state: Literal["eof", "abandoned"] = "eof" if drain.eof else "abandoned"
            streams.append(StreamRecord(name, state, cap.total, cap.kept, cap.dropped, "capture"))
        output: OutputState
        if not self._drains:
            output = "not captured"
        elif self._machine.output == "abandoned" or any(d.abandoned for d in self._drains.values()):
            output = "abandoned"
        else:
            output = "truncated" if truncated else "complete"
        return tuple(streams), output

    def _emergency_receipt(self, exc: BaseException) -> None:
        """The last resort when writing the receipt itself failed: a receipt
        that claims nothing it has not seen (domain not proven empty)."""
        self._step(Action.ERROR, "teardown", f"writing the receipt: {type(exc).__name__}: {exc}", "failed")
        leader = self._leader
        try:
            if not leader.reap():
                leader.defer()
            self._step(Action.REAP, "leader", f"returncode {leader.returncode}")
        except Exception:
            leader.defer()
        try:
            released = self._domain.release()
            if released:
                self._step(Action.RELEASE, "domain", released)
        except Exception as error:
            self._step(Action.ERROR, "domain", f"release: {type(error).__name__}: {error}", "failed")
        returncode = leader.returncode
        self.receipt = Receipt(
            cause=self._machine.cause or "error",
            returncode=returncode,
            domain=self._domain.kind,
            forced=self._machine.forced,
            domain_empty=False,
            output="abandoned" if self._drains else "not captured",
            steps=tuple(self._steps),
            command=self.command,
            pid=self._leader.pid,
            domain_id=self._domain.ident,
            duration=self._lived(),
        )


_TOKEN = object()


def _cause_of(exc: BaseException) -> Cause:
    """The cause for the way the block was left. An exception group (a
    nursery in the body) counts as a cancel when it holds only Cancelled and
    KeyboardInterrupt, as an outer cancel or ^C seen through that nursery."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split((trio.Cancelled, KeyboardInterrupt))
        return "cancelled" if rest is None else "error"
    if isinstance(exc, (trio.Cancelled, KeyboardInterrupt)):
        return "cancelled"
    return "error"


@asynccontextmanager
@trio.lowlevel.enable_ki_protection
async def open_owned_command(
    command: Command,
    *,
    timeout: float | None = None,
    grace: float = 2.0,
    kill_wait: float = 1.0,
    drain_wait: float = 0.5,
    stdin: StdinSource = None,
    stdout: Target = CAPTURE,
    stderr: Target = CAPTURE,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    domain: DomainChoice = "auto",
    escapees: EscapeePolicy = "terminate",
    max_output: int = DEFAULT_MAX_OUTPUT,
    subreaper: bool = False,
) -> AsyncIterator[OwnedCommand]:
    """Run `command` owned by this block: every process it starts is torn
    down, with a bounded teardown, before control leaves the block.

    A `str` runs under ``/bin/sh -c``; a sequence is executed directly.
    `timeout` is the command's own deadline (cause ``"timed_out"``, no
    exception). An outer cancellation, KeyboardInterrupt or an exception in
    the body tears the command down first and then propagates unchanged.
    The teardown takes at most ``grace + kill_wait + drain_wait`` (plus a
    small scheduling allowance) whatever the command does.

    `stdin`: None (``/dev/null``), bytes, a path, an open fd or file object
    (inherited as is, sharing its offset; not closed), or a trio ReceiveStream.
    `stdout` / `stderr`: ``"capture"`` (default), ``"devnull"``, a file path,
    and for stderr also ``"stdout"`` (merged, in order).
    `domain`: ``"auto"``, ``"cgroup"`` or ``"process-group"``.
    `escapees`: what to do with processes that left the domain (found by the
    census): ``"terminate"`` or ``"report"``.
    `max_output`: per-stream memory bound; head and tail are kept.

    Synopsis::

        with trio.move_on_after(1):
            async with trio_procown.open_owned_command("sleep 30 & echo early; sleep 30") as run:
                await run.wait()
        print(run.receipt.cause, run.stdout)
    """
    _check_budget("timeout", timeout, optional=True)
    _check_budget("grace", grace)
    _check_budget("kill_wait", kill_wait)
    _check_budget("drain_wait", drain_wait)
    if not isinstance(max_output, int) or isinstance(max_output, bool) or max_output < 0:
        msg = f"max_output must be a non-negative int, not {max_output!r}"
        raise ValueError(msg)
    for name, target in (("stdout", stdout), ("stderr", stderr)):
        if target == STDOUT and name == "stdout":
            msg = "stdout cannot be merged into itself"
            raise ValueError(msg)
    census = Census(escapees, Census.inherited(os.environ, env))
    child_env = dict(os.environ if env is None else env)
    child_env[COOKIE_VAR] = census.value
    argv = _resolve_argv(command, cwd, child_env.get("PATH", os.defpath))
    if cwd is not None and not os.path.isdir(cwd):
        if not os.path.exists(cwd):
            raise FileNotFoundError(2, f"cwd does not exist: {os.fspath(cwd)!r}", os.fspath(cwd))
        raise NotADirectoryError(20, f"cwd is not a directory: {os.fspath(cwd)!r}", os.fspath(cwd))
    own_domain = make_domain(domain)
    if subreaper:
        from ._subreaper import enable_subreaper

        enable_subreaper()

    run = OwnedCommand(_TOKEN)
    run.command = tuple(argv) if not isinstance(command, str) else (command,)
    run._domain = own_domain
    run._census = census
    run._subreaper = subreaper
    run._machine = Escalation(Budgets(grace, kill_wait, drain_wait))

    parent_fds: list[int] = []
    child_fds: list[int] = []
    try:
        stdin_fd, feeder_fd, feeder_src = _stdin_fd(stdin, parent_fds, child_fds)
        out_fd = _output_fd("stdout", stdout, run, max_output, parent_fds, child_fds)
        if stderr == STDOUT:
            err_fd = out_fd
            run._targets["stderr"] = "merged into stdout"
        else:
            err_fd = _output_fd("stderr", stderr, run, max_output, parent_fds, child_fds)
        spawn_argv = own_domain.prepare(argv)
        mark = _procfs.pid_mark()  # before the spawn: every descendant's pid comes after it
        try:
            run._leader = Leader.spawn(
                spawn_argv, stdin=stdin_fd, stdout=out_fd, stderr=err_fd, cwd=cwd, env=child_env
            )
            run._leader.mark = mark
        except BaseException:
            own_domain.abort_spawn()
            raise
        run._started = trio.current_time()
        run._step(Action.SPAWN, "leader", f"pid {run._leader.pid} in {own_domain.kind}")
        try:
            own_domain.attach(run._leader, run._started)
        except BaseException:
            run._leader.kill_now()
            run._leader.reap()
            own_domain.release()
            raise
        if feeder_src is not None and feeder_fd is not None:
            run._feeder = Feeder(feeder_fd, feeder_src)
    except BaseException:
        for fd in parent_fds:
            os.close(fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    run._deadline = math.inf if timeout is None else run._started + timeout

    caught: BaseException | None = None
    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            run._launch(nursery)
            try:
                try:
                    yield run
                except GeneratorExit:
                    run._leader.kill_now()
                    raise
                if run.handoff is None:
                    await run._done.wait()
            except BaseException as exc:
                caught = exc
                if run.handoff is None:
                    run._request_stop(_cause_of(exc))
            guard.shield = True
            # The teardown is bounded by its own shielded deadline; this
            # wait only adds a margin. KeyboardInterrupt may arrive here (we
            # are in the main task): remember it, keep waiting, re-raise.
            limit = trio.current_time() + run._machine.budgets.total + 2 * TEARDOWN_ALLOWANCE
            with trio.move_on_at(limit):
                while not run._done.is_set() and run.handoff is None:
                    try:
                        await run._done.wait()
                    except KeyboardInterrupt as exc:
                        caught = caught or exc
            nursery.cancel_scope.cancel()
    if caught is not None:
        raise caught


def _stdin_fd(
    stdin: StdinSource, parent_fds: list[int], child_fds: list[int]
) -> tuple[int, int | None, bytes | trio.abc.ReceiveStream | None]:
    """The child's stdin fd, and the feeder's fd and source if one is needed."""
    if stdin is None:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        child_fds.append(fd)
        return fd, None, None
    if isinstance(stdin, (bytes, bytearray, memoryview, trio.abc.ReceiveStream)):
        r, w = os.pipe()
        parent_fds.append(w)
        child_fds.append(r)
        src = stdin if isinstance(stdin, trio.abc.ReceiveStream) else bytes(stdin)
        return r, w, src
    if isinstance(stdin, (str, os.PathLike)):
        fd = os.open(os.fspath(stdin), os.O_RDONLY | os.O_CLOEXEC)
        child_fds.append(fd)
        return fd, None, None
    if (isinstance(stdin, int) and not isinstance(stdin, bool)) or callable(getattr(stdin, "fileno", None)):
        # An open fd (or file object) is handed over as a shell's `< file`
        # would: the child inherits the same open file description, so it
        # reads from (and moves) the caller's offset. Not reopened, not
        # dup'd by us, and not closed: the fd stays the caller's.
        fd = stdin if isinstance(stdin, int) else stdin.fileno()
        if fd < 0:
            msg = f"stdin must be an open file descriptor (>= 0), not {fd}"
            raise ValueError(msg)
        os.fstat(fd)  # a closed fd raises EBADF here, before anything is started
        return fd, None, None
    msg = (
        "stdin must be None, bytes, a path, an open file descriptor or file object, "
        f"or a trio ReceiveStream, not {type(stdin).__name__}"
    )
    raise TypeError(msg)


def _output_fd(
    name: str, target: Target, run: OwnedCommand, limit: int, parent_fds: list[int], child_fds: list[int]
) -> int:
    if target == CAPTURE:
        r, w = os.pipe()
        parent_fds.append(r)
        child_fds.append(w)
        run._drains[name] = Drain(name, r, limit)
        return w
    fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC) if target == DEVNULL else _open_target(target)
    child_fds.append(fd)
    run._targets[name] = "devnull" if target == DEVNULL else f"file {os.fspath(target)}"
    return fd


@final
@dataclass(frozen=True, slots=True)
class OwnedResult:
    """What `run_owned` returns: the output and the receipt.

    Synopsis::

        result = await trio_procown.run_owned(["uname", "-sr"])
        print(result.returncode, result.stdout.decode(), result.receipt.cause)
    """

    stdout: bytes
    stderr: bytes
    returncode: int | None
    receipt: Receipt


class OwnedOptions(TypedDict, total=False):
    """The keyword arguments of `open_owned_command`, for `run_owned`."""

    timeout: float | None
    grace: float
    kill_wait: float
    drain_wait: float
    stdin: StdinSource
    stdout: Target
    stderr: Target
    cwd: str | os.PathLike[str] | None
    env: Mapping[str, str] | None
    domain: DomainChoice
    escapees: EscapeePolicy
    max_output: int
    subreaper: bool


async def run_owned(command: Command, **options: Unpack[OwnedOptions]) -> OwnedResult:
    """Run `command` to completion as an owned command; return its output
    and receipt. Takes the same arguments as `open_owned_command`.

    Synopsis::

        result = await trio_procown.run_owned(["ls", "-l"], timeout=60)
        print(result.returncode, result.receipt.cause)
    """
    async with open_owned_command(command, **options) as run:
        receipt = await run.wait()
    return OwnedResult(run.stdout, run.stderr, receipt.returncode, receipt)
