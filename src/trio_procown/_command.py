# Owned commands: the public handle and the block that owns one.
#
# open_owned_command() spawns the command into an ownership domain
# (_spawn.py) and opens a nursery that holds, for the whole lifecycle, the
# single drain of each output pipe, the stdin feeder, and the *supervisor*
# task. The supervisor waits for one of: the leader exiting by itself, the
# command's own deadline (`timeout`), or a stop request (outer cancellation,
# KeyboardInterrupt or an exception in the body, terminate(), an owner's
# stop). Then it runs the teardown (_teardown.py, driving the pure machine
# of _escalation.py), whose shielded deadline bounds it whatever the
# command does.
#
# The supervisor is KI-protected: a KeyboardInterrupt is delivered to the
# main task, whose wait for the teardown (wait_torn_down, the one shielded
# bounded wait every owner uses) catches it, waits out the bounded teardown,
# and re-raises it. The block's own exception is caught *inside* the nursery
# and re-raised after it closes, so it propagates as itself rather than
# wrapped in an ExceptionGroup.
#
# Owners other than the block (a service owner after a handoff) talk to the
# command through a narrow interface: request_stop(cause), wait_torn_down(),
# relaunch(nursery).

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict, Unpack, final

import outcome
import trio

from . import _clock, _cloner, _mass
from ._budgets import DEFAULT_DRAIN_WAIT, DEFAULT_GRACE, DEFAULT_KILL_WAIT
from ._census import EscapeePolicy
from ._choice import DomainName, bind_domain
from ._domain import BY_THE_CALLER, Sent
from ._drain import DEFAULT_MAX_OUTPUT, ChunkStream, lines
from ._errors import HandoffError
from ._escalation import (
    Budgets,
    Escalation,
    Event,
    graceful_signals,
)
from ._leader import Leader
from ._receipt import Action, Cause, Receipt
from ._spawn import (
    CAPTURE,
    DEVNULL,
    INHERIT,
    STDOUT,
    Command,
    Spawned,
    Target,
    check_budget,
    finish_spawn,
    spawn_steps,
)
from ._stdin import StdinSource
from ._teardown import TEARDOWN_ALLOWANCE, Teardown

if TYPE_CHECKING:
    from trio_util import AsyncValue

    from ._handoff import HandoffReceipt
    from ._service import ServiceOwner

__all__ = [
    "CAPTURE",
    "DEVNULL",
    "INHERIT",
    "STDOUT",
    "Command",
    "HandoffError",
    "OwnedCommand",
    "OwnedOptions",
    "OwnedResult",
    "Target",
    "cause_of",
    "open_owned_command",
    "run_owned",
]

Phase = Literal["running", "tearing down", "done"]


@final
class OwnedCommand:
    """A running owned command: its pid, its output so far, its receipt.

    Built only by `open_owned_command`; see there.

    Synopsis::

        async with trio_procown.open_owned_command(["sh", "-c", "echo hi"]) as run:
            print(run.pid, run.phase.value)
            receipt = await run.wait()
        print(run.stdout, run.receipt)
    """

    def __init__(
        self,
        _private: object,
        *,
        command: tuple[str, ...],
        spawned: Spawned,
        teardown: Teardown,
        deadline: float,
    ) -> None:
        if _private is not _TOKEN:
            msg = "use trio_procown.open_owned_command() to start a command"
            raise TypeError(msg)
        self.command = command
        self._phase_now: Phase = "running"
        self._phase: AsyncValue[Phase] | None = None  # made on first use: see phase
        self.receipt: Receipt | None = None
        self.handoff: HandoffReceipt | None = None
        self._spawned = spawned
        self._leader = spawned.leader
        self._teardown = teardown
        self._deadline = deadline
        # The supervisor's scope while it waits (see _supervise), made by
        # it: shielded, so that an outer cancel reaches the supervisor only
        # as a stop request from the block (see open_owned_command).
        self._life_scope: trio.CancelScope | None = None
        self._relocating = False  # a handoff is moving the tasks to an owner
        self._supervisor_stopped: trio.Event | None = None  # made by a handoff, set by the supervisor
        self._stop_cause: Cause | None = None
        self._custom_stop = False  # begin_stop(): the caller signals first
        self._done = trio.Event()

    # -- public surface -------------------------------------------------------
    @property
    def phase(self) -> AsyncValue[Phase]:
        """Where the command is: "running", "tearing down", then "done", as
        a trio_util.AsyncValue (`await run.phase.wait_value("done")`). Made
        on first use: only programs that ask for it import trio_util (~4 ms
        at start-up)."""
        if self._phase is None:
            from trio_util import AsyncValue

            self._phase = AsyncValue(self._phase_now)
        return self._phase

    def _set_phase(self, phase: Phase) -> None:
        self._phase_now = phase
        if self._phase is not None:
            self._phase.value = phase

    @property
    def pid(self) -> int:
        """The pid of the direct process (the domain's leader)."""
        return self._leader.pid

    @property
    def stdout(self) -> bytes:
        """Bytes of stdout captured so far (complete after the block)."""
        drain = self._spawned.drains.get("stdout")
        return drain.capture.getvalue() if drain else b""

    @property
    def stderr(self) -> bytes:
        """Bytes of stderr captured so far (complete after the block)."""
        drain = self._spawned.drains.get("stderr")
        return drain.capture.getvalue() if drain else b""

    @property
    def domain(self) -> str:
        """The kind of ownership domain holding the command."""
        return self._spawned.domain.kind

    @property
    def domain_id(self) -> str:
        """What identifies the domain: ``"pgid N"`` or the cgroup's path."""
        return self._spawned.domain.ident

    @property
    def started_at(self) -> float:
        """``trio.current_time()`` at the spawn; receipt step times count from
        it (under a test's clock, such as trio.testing.MockClock, they are
        real seconds from the spawn: the teardown's bounds are real time)."""
        return self._spawned.started

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
        self.request_stop("stopped")
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
        if self._done.is_set() or self._stop_cause is not None or self._phase_now != "running":
            msg = f"pid {self.pid} is no longer running ({self._phase_now}); nothing to hand off"
            raise HandoffError(msg)
        owner.check_open()
        with trio.CancelScope(shield=True):  # bounded: the tasks stop at once
            stopped = self._supervisor_stopped = trio.Event()
            self._relocating = True
            self._wake()
            await stopped.wait()
            self._relocating = False
            if self._done.is_set() or self._phase_now != "running":
                msg = f"pid {self.pid} ended during the handoff; see its receipt"
                raise HandoffError(msg)
            for drain in self._spawned.drains.values():
                await drain.pause()
        if self._spawned.feeder is not None:
            self._spawned.feeder.scope.cancel()
        self._deadline = math.inf
        step = self._teardown.step(Action.HANDOFF, "owner", f"to {owner.name}: {reason}")
        b = self._teardown.machine.budgets
        from ._handoff import HandoffReceipt  # here: most processes never hand off (start-up cost)

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
        owner.adopt(self)
        return self.handoff

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
        drain = self._spawned.drains.get(name)
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
        split across reads comes out whole. Same policy as `stream`. A line
        longer than 64 Mi characters comes in pieces of that size (only the
        last with its newline): memory stays bounded.

        Synopsis::

            async for line in run.lines("stderr"):
                log.warning(line.rstrip())
        """
        return lines(self.stream(name, lossless=lossless), encoding, errors)

    def poll(self) -> int | None:
        """The direct process's status once it has exited (-N for signal N),
        else None; it is not reaped before the teardown is over."""
        return self._leader.returncode if self._leader.reaped else self._leader.poll()

    async def _wait_exited(self) -> int:
        """Wait until the direct process has exited (not for the teardown);
        its status, as poll() gives it."""
        if not self._leader.reaped:
            await self._leader.wait(beside=True)
        code = self.poll()
        assert code is not None
        return code

    def _block_until_exited(self, timeout: float) -> bool:
        """Block this thread until the direct process has exited, at most
        `timeout` seconds (not for the teardown, and not reaping it); True
        if it did. For Popen-style waits (OwnedProcess._proc.wait())."""
        return self._leader.reaped or self._leader.block_until_exited(timeout)

    def send_signal(self, sig: int) -> bool:
        """Send `sig` to the direct process only (not its domain); False if
        it has already exited. Safe against pid reuse: the process is held
        by a pidfd and not reaped before the teardown is over.

        Synopsis::

            import signal

            async with trio_procown.open_owned_command(["sleep", "30"]) as run:
                run.send_signal(signal.SIGTERM)
                receipt = await run.wait()
        """
        return self._leader.signal(sig)

    def signal_domain(self, sig: int) -> bool:
        """Send `sig`, then SIGCONT (so a stopped member sees it), to every
        process of the domain, as a shell's `kill -SIG -PGID` would, and note
        it in the receipt's steps; False, with nothing sent, once the
        teardown has released the domain. It does not start, shorten or
        replace the teardown (a relay of a second signal during the grace,
        as GNU timeout relays every signal it receives). A refused signal
        is noted, not raised; a number that is no signal raises ValueError,
        as for `first_signal`.

        Synopsis::

            import signal

            async with trio_procown.open_owned_command(["make", "-j4"]) as run:
                run.signal_domain(signal.SIGUSR1)
        """
        sigs = graceful_signals(sig)
        leader = self._leader
        if self._phase_now == "done" or (leader.reaped and not leader.lost):
            return False
        sent = self._spawned.domain.signal_graceful(sigs)
        self._teardown.signal_step("domain", Sent(sent.detail + BY_THE_CALLER, sent.failed), sigs)
        return not sent.failed

    def begin_stop(self, cause: Cause, how: str) -> None:
        """Record that the caller is stopping the command its own way (`how`,
        e.g. a custom deliver_cancel) before the owned teardown: when the
        direct process then exits, the receipt says it was stopped with
        `cause`, never that it exited by itself."""
        if self._stop_cause is None:
            self._stop_cause = cause
        self._custom_stop = True
        self._teardown.step(Action.STOP, "leader", cause, how)

    def owns_pid(self, pid: int) -> bool:
        """Is process `pid` inside this command's domain right now (read fresh)?"""
        return self._spawned.domain.contains(pid)

    # -- the owner interface --------------------------------------------------
    def request_stop(self, cause: Cause, *, first_signal: int | None = None) -> None:
        """Ask for the bounded teardown with `cause`, without waiting (for
        owners: a service owner, the block, a CLI relaying a signal it got;
        most code calls terminate()). `first_signal` replaces the graceful
        stage's signal for this teardown, if it has not started yet."""
        if first_signal is not None and self._phase_now == "running":
            self._teardown.machine.graceful = graceful_signals(first_signal)
        if (
            self._stop_cause is None
            and self._phase_now == "running"
            and not self._relocating
            and self._leader.poll() is not None  # (a system call: asked last, once)
        ):
            # The leader had ended by itself before the request, though its
            # supervisor has not run since: the command exited (cause
            # "exited"), whatever came after. Its wait ends now, and the
            # teardown ends what outlived it, as for any exit.
            _mass.wake_soon(self._wake)
            return
        if self._stop_cause is None:
            self._stop_cause = cause
        if self._teardown.requested is None and self._phase_now == "running":
            # The teardown's bound counts from now, however late its task runs.
            self._teardown.ask(_clock.now())
        _mass.wake_soon(self._wake)

    def _wake(self) -> None:
        """End the supervisor's wait (a supervisor not started yet sees the
        stop request or the handoff itself when it starts)."""
        if self._life_scope is not None:
            self._life_scope.cancel()

    def stop_reading(self, name: Literal["stdout", "stderr"]) -> None:
        """Stop reading a captured stream now, because its consumer went
        away: the read end is closed, so the command's next write sees a
        broken pipe (EPIPE or SIGPIPE), as it would have without us. Bytes
        read so far are kept; the receipt says the stream was closed by the
        caller, not abandoned."""
        drain = self._spawned.drains.get(name)
        if drain is None:
            msg = f"{name} is not captured for this command"
            raise ValueError(msg)
        if drain.done.is_set():
            return  # it had already ended: nothing is cut short
        drain.close_by_reader()
        self._teardown.step(Action.DRAIN, name, f"{drain.capture.total} byte(s) read", "closed by the caller")

    @property
    def teardown_bound(self) -> float:
        """How long a teardown may take once started, scheduling margin included."""
        return self._teardown.budget + TEARDOWN_ALLOWANCE

    async def wait_torn_down(self) -> KeyboardInterrupt | None:
        """Wait, shielded and at most `teardown_bound`, until the teardown is
        over (or the command was handed off). A KeyboardInterrupt arriving
        meanwhile does not cut the wait short: it is returned, for the
        caller to re-raise once the teardown is done."""
        interrupted: KeyboardInterrupt | None = None
        if self._done.is_set() or self.handoff is not None:
            return interrupted
        with _clock.after(self.teardown_bound, shield=True):
            while not self._done.is_set() and self.handoff is None:
                try:
                    await self._done.wait()
                except KeyboardInterrupt as exc:
                    interrupted = interrupted or exc
        return interrupted

    def launch(self, nursery: trio.Nursery) -> None:
        """Start the drains, the feeder and the supervisor in `nursery`."""
        for drain in self._spawned.drains.values():
            nursery.start_soon(drain.run)
        if self._spawned.feeder is not None:
            nursery.start_soon(self._spawned.feeder.run)
        nursery.start_soon(self._supervise)

    def relaunch(self, nursery: trio.Nursery) -> None:
        """Start the drains and the supervisor in an owner's nursery (handoff)."""
        for drain in self._spawned.drains.values():
            nursery.start_soon(drain.run)
        nursery.start_soon(self._supervise)

    # -- lifecycle ------------------------------------------------------------
    @trio.lowlevel.enable_ki_protection
    async def _supervise(self) -> None:
        """Wait for exit, deadline or stop; then run the bounded teardown."""
        exited = False
        self._life_scope = trio.CancelScope(shield=True, deadline=self._deadline)
        if self._stop_cause is not None or self._relocating:
            self._life_scope.cancel()
        # A live command for the crowd's freeze (_mass.py), counted once it
        # is set up: its nursery, tasks and scopes exist now, and a freeze at
        # this height holds them (counted at the spawn, a crowd started
        # together left each command's later objects out: 123,000 of them
        # for 2,000 commands, walked by every full collection, 57-85 ms).
        _mass.born(self._teardown)
        with self._life_scope:
            await self._leader.wait()
            exited = True
        if self._relocating and not exited and self._stop_cause is None:
            if self._supervisor_stopped is not None:
                self._supervisor_stopped.set()  # a handoff moves us to the owner's nursery
            return
        teardown = self._teardown
        code = self._leader.poll()
        status = "exit status lost (reaped by someone else)" if self._leader.lost else f"returncode {code}"
        if self._custom_stop:
            # The caller stopped it its own way first (begin_stop): the
            # owned teardown follows, for whatever of the domain is left.
            assert self._stop_cause is not None
            if code is not None:
                teardown.step(Action.EXIT, "leader", status, "exited after the caller's stop")
            teardown.machine.handle(Event.STOP, cause=self._stop_cause)
        elif not teardown.signalled_early and (exited or (code is not None and self._stop_cause is None)):
            teardown.step(Action.EXIT, "leader", status, "exited")
            teardown.machine.handle(Event.LEADER_EXITED)
        else:
            cause: Cause = self._stop_cause or "timed_out"
            if self._stop_cause is None and teardown.requested is None:
                # Our own deadline: the teardown counts from it, not from
                # when this task got to run.
                teardown.requested = _clock.at(min(self._deadline, trio.current_time()))
            teardown.step(Action.STOP, "leader", cause, at=teardown.requested)
            teardown.machine.handle(Event.STOP, cause=cause)
        self._set_phase("tearing down")
        self.receipt = await teardown.run()
        self._set_phase("done")
        self._done.set()
        if self._supervisor_stopped is not None:
            self._supervisor_stopped.set()


_TOKEN = object()


async def _clone(clone: Callable[[], Leader]) -> outcome.Outcome[Leader]:
    """Make the clone of a spawn (see _spawn.SpawnSteps): what it returned
    or raised. While other commands are live, in a worker thread (with this
    thread's signal mask, which the command inherits), shielded: the loop
    serves them while the kernel finds a CPU for the new process, as trio's
    own spawn does; a cancel waits for the clone, and the teardown that
    follows owns what it started. Else on this thread (a thread round trip
    costs more than the clone's ~0.15 ms)."""
    if _mass.live() == 0:
        return outcome.capture(clone)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    with trio.CancelScope(shield=True):
        cloned = await trio.to_thread.run_sync(_clone_in_worker, clone, mask)
    return cloned


def _clone_in_worker(clone: Callable[[], Leader], mask: set[int | signal.Signals]) -> outcome.Outcome[Leader]:
    previous = signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        with _cloner.not_idle():
            return outcome.capture(clone)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def cause_of(exc: BaseException) -> Cause:
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
    grace: float = DEFAULT_GRACE,
    kill_wait: float = DEFAULT_KILL_WAIT,
    drain_wait: float = DEFAULT_DRAIN_WAIT,
    stdin: StdinSource = None,
    stdout: Target = CAPTURE,
    stderr: Target = CAPTURE,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    domain: DomainName = "auto",
    escapees: EscapeePolicy = "terminate",
    max_output: int = DEFAULT_MAX_OUTPUT,
    subreaper: bool = False,
    first_signal: int = signal.SIGTERM,
    keeper: bool = True,
    pass_fds: Sequence[int] = (),
    executable: str | os.PathLike[str] | None = None,
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
    `stdout` / `stderr`: ``"capture"`` (default), ``"devnull"``,
    ``"inherit"`` (the caller's own stream), a file path, an open fd or file
    object (passed as is, not closed), and for stderr also ``"stdout"``
    (merged, in order). Only captured streams are claimed in the receipt.
    `domain`: ``"auto"``, ``"cgroup"``, ``"process-group"``, or
    ``"slurm"`` / a :class:`SlurmDomain` (run as a Slurm job, see
    docs/domains.md).
    `escapees`: what to do with processes that left the domain (found by the
    census): ``"terminate"`` or ``"report"``.
    `max_output`: per-stream memory bound; head and tail are kept.
    `first_signal`: the graceful stage's signal (default SIGTERM; SIGINT for
    tools that clean up on Ctrl-C, SIGHUP, ...; 0 sends nothing); SIGCONT
    always follows it.
    `keeper`: tell this process's keeper of the command, so that it is
    ended even if this process dies before its teardown (default); False, or
    the environment variable ``TRIO_PROCOWN_NO_KEEPER=1``, opts out, and the
    receipt says that no keeper was running.
    `pass_fds`: open descriptors of ours (above 2) the command inherits, as
    in subprocess (a make jobserver's pipe); every other one above 2 is
    closed in the command.
    `executable`: the program to run in place of the one `command` names,
    as Popen's executable=: ``command[0]`` is then only the name it is
    given (its argv[0]); a `str` command runs under ``executable -c``
    instead of ``/bin/sh -c``.

    Synopsis::

        with trio.move_on_after(1):
            async with trio_procown.open_owned_command("sleep 30 & echo early; sleep 30") as run:
                await run.wait()
        print(run.receipt.cause, run.stdout)
    """
    check_budget("timeout", timeout, optional=True)
    check_budget("grace", grace)
    check_budget("kill_wait", kill_wait)
    check_budget("drain_wait", drain_wait)
    machine = Escalation(Budgets(grace, kill_wait, drain_wait), escapees, first_signal)
    domain = await bind_domain(domain, timeout, machine.budgets.total)
    steps = spawn_steps(
        command,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=env,
        domain=domain,
        escapees=escapees,
        max_output=max_output,
        subreaper=subreaper,
        keeper=keeper,
        keeper_grace=grace,
        pass_fds=pass_fds,
        executable=executable,
    )
    clone = next(steps)
    try:
        cloned = await _clone(clone)
    except BaseException:  # no worker thread could be had: nothing was started
        steps.close()  # (its fds are closed, its domain given back)
        raise
    argv, spawned = finish_spawn(steps, cloned)
    name = tuple(argv) if not isinstance(command, str) else (command,)
    teardown = Teardown(spawned, machine, name, subreaper)
    teardown.step(Action.SPAWN, "leader", f"pid {spawned.leader.pid} in {spawned.domain.kind}")
    deadline = math.inf if timeout is None else spawned.started + timeout
    run = OwnedCommand(_TOKEN, command=name, spawned=spawned, teardown=teardown, deadline=deadline)

    caught: BaseException | None = None
    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            run.launch(nursery)
            try:
                try:
                    yield run
                except GeneratorExit:
                    spawned.leader.kill_now()
                    raise
                if run.handoff is None and not run._done.is_set():
                    await run._done.wait()
            except BaseException as exc:
                caught = exc
                if run.handoff is None:
                    run.request_stop(cause_of(exc))
            guard.shield = True
            # KeyboardInterrupt may arrive during the wait (we are in the
            # main task): it is kept and re-raised after the teardown.
            interrupted = await run.wait_torn_down()
            caught = caught or interrupted
            if nursery.child_tasks:  # (each finished: trio's cancel costs a repr of this task)
                nursery.cancel_scope.cancel()
    if caught is not None:
        raise caught


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
    domain: DomainName
    escapees: EscapeePolicy
    max_output: int
    subreaper: bool
    first_signal: int
    keeper: bool
    pass_fds: Sequence[int]
    executable: str | os.PathLike[str] | None


async def run_owned(command: Command, **options: Unpack[OwnedOptions]) -> OwnedResult:
    """Run `command` to completion as an owned command; return its output
    and receipt. Takes the same arguments as `open_owned_command`.

    Synopsis::

        result = await trio_procown.run_owned(["ls", "-l"], timeout=60)
        print(result.returncode, result.receipt.cause)
    """
    # Like trio.run_process: under a scope already cancelled, nothing is
    # started (its receipt could not be returned). A block of
    # open_owned_command, by contrast, is entered and its receipt kept.
    await trio.lowlevel.checkpoint_if_cancelled()
    async with open_owned_command(command, **options) as run:
        receipt = await run.wait()
    return OwnedResult(run.stdout, run.stderr, receipt.returncode, receipt)
