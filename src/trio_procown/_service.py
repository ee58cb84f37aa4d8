# Services: owned commands that outlive the block that starts them.
#
# A long-lived command (a database for a test session, a dev server for an
# agent's run) is still owned: by a ServiceOwner, a nursery-like scope that
# outlives the blocks that start services. Two ways in:
#
#   owner.start(cmd, ready=...)  like nursery.start: returns once the service
#                                is ready; on a readiness failure the command
#                                is torn down and ServiceNotReady carries the
#                                receipt and the output so far.
#   run.hand_off(owner, reason)  moves a command running in an
#                                open_owned_command block to the owner.
#
# Each service runs under a supervisor task in the owner's nursery. For a
# started service the supervisor holds an open_owned_command block, so every
# way out (stop(), the owner's exit, cancellation) is that block's bounded
# teardown; a service that exits by itself is reported and, under a restart
# policy, started again up to max_restarts times. For a handed-off command
# the supervisor re-launches the command's drains and owner task in a nursery
# of its own (the drain's reading task moves; there is never a second
# reader) and runs the same teardown when asked.
#
# Leaving the owner's block stops every service concurrently; each teardown
# is bounded by its own grace + kill_wait + drain_wait, so the owner's exit is
# bounded by the largest of them.

from __future__ import annotations

import enum
import math
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Literal, Unpack, final

import trio
from trio_util import AsyncValue

from . import _clock
from ._command import (
    OwnedCommand,
    OwnedOptions,
    cause_of,
    open_owned_command,
)
from ._errors import OwnerClosed, ServiceError, ServiceNotReady
from ._handoff import HandoffReceipt
from ._ready import Readiness, await_ready
from ._receipt import Receipt
from ._spawn import Command, normalize_command

RestartPolicy = Literal["never", "on-failure", "always"]
ServiceState = Literal["starting", "ready", "restarting", "stopping", "stopped", "exited", "failed"]


# -- services -----------------------------------------------------------------


class _Origin(enum.Enum):
    STARTED = "started"
    HANDED_OFF = "handed off"


@final
class Service:
    """One service of a ServiceOwner: its current run, its receipts.

    Built by `ServiceOwner.start` or `OwnedCommand.hand_off`.

    Synopsis::

        svc = await owner.start(cmd, ready=trio_procown.ready_line("ready"))
        print(svc.pid, svc.state.value)
        await svc.state.wait_value("exited")   # e.g. wait for it to end
        print(svc.receipt)
    """

    def __init__(self, name: str, command: Command | Sequence[str], origin: _Origin) -> None:
        self.name = name
        self.command = command
        self.origin = origin
        self.state: AsyncValue[ServiceState] = AsyncValue("starting")
        self.run: OwnedCommand | None = None
        self.receipts: list[Receipt] = []  # one per incarnation, in order
        self.handoff: HandoffReceipt | None = None
        self.restarts = 0
        self.error: BaseException | None = None
        self._stop_requested = False
        self._finished = trio.Event()
        self._settled = trio.Event()  # ready, or failed before ready

    @property
    def pid(self) -> int | None:
        """The pid of the current incarnation's direct process."""
        return self.run.pid if self.run else None

    @property
    def stdout(self) -> bytes:
        """The current incarnation's stdout so far (bounded by max_output)."""
        return self.run.stdout if self.run else b""

    @property
    def stderr(self) -> bytes:
        """The current incarnation's stderr so far (bounded by max_output)."""
        return self.run.stderr if self.run else b""

    @property
    def receipt(self) -> Receipt | None:
        """The receipt of the last incarnation that ended."""
        return self.receipts[-1] if self.receipts else None

    async def lines(
        self,
        name: Literal["stdout", "stderr"] = "stdout",
        *,
        encoding: str = "utf-8",
        errors: str = "replace",
    ) -> AsyncIterator[str]:
        """Follow the service's output: each text line of every incarnation
        in turn (a restart's run follows the one before), as
        `OwnedCommand.lines` gives them, until the service has ended
        (stopped, exited or failed) and its last run's output is read.

        The lines end when the service does, that is at the latest when
        its owner's block ends: read them in a task of a nursery that
        encloses the owner's block (or cancel that task), not one inside
        it, whose end would wait for the owner's.

        Synopsis::

            async with trio.open_nursery() as nursery:
                async with trio_procown.open_service_owner() as owner:
                    web = await owner.start(cmd, restart="on-failure")

                    async def follow() -> None:
                        async for line in web.lines():
                            print("web:", line, end="")

                    nursery.start_soon(follow)
                    ...
        """
        seen: OwnedCommand | None = None
        while True:
            run = self.run
            if run is not None and run is not seen:
                seen = run
                async for line in run.lines(name, encoding=encoding, errors=errors):
                    yield line
                continue
            if self._finished.is_set():
                return
            await self.state.wait_transition()

    def __repr__(self) -> str:
        return f"<Service {self.name!r} pid={self.pid} state={self.state.value}>"


@final
class ServiceOwner:
    """Owns services beyond the blocks that start them; see `open_service_owner`.

    Synopsis::

        async with trio_procown.open_service_owner("session") as owner:
            svc = await owner.start(cmd)
            await owner.stop(svc)
        print(owner.receipts)
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.services: list[Service] = []
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._exit_cause: Literal["stopped", "cancelled", "error"] = "stopped"

    def check_open(self) -> None:
        """Raise unless this owner can still take services (owner interface)."""
        if self._closed or self._nursery is None:
            msg = f"service owner {self.name!r} is closed"
            raise OwnerClosed(msg)

    @property
    def receipts(self) -> list[tuple[str, Receipt]]:
        """Every service's receipts as (service name, receipt), in order."""
        return [(svc.name, r) for svc in self.services for r in svc.receipts]

    async def start(
        self,
        command: Command,
        *,
        ready: Readiness | None = None,
        ready_timeout: float = 30.0,
        restart: RestartPolicy = "never",
        max_restarts: int = 3,
        name: str | None = None,
        **options: Unpack[OwnedOptions],
    ) -> Service:
        """Start `command` as a service and return once it is ready.

        `ready` is a probe (`ready_line`, `ready_port`, `ready_file`,
        `ready_when`, or any ``async def probe(run)`` that returns when
        ready); None means ready at once. If the probe fails, the command
        exits first, or `ready_timeout` passes, the command is torn down and
        ServiceNotReady is raised with the receipt and the output so far.
        `restart`: "never", "on-failure" (non-zero exit) or "always", at most
        `max_restarts` times. Other keywords go to `open_owned_command`
        (`timeout` is not allowed: a service lives until stopped).

        Synopsis::

            async with trio_procown.open_service_owner() as owner:
                web = await owner.start([sys.executable, "-m", "http.server", "8123"],
                                        ready=trio_procown.ready_port(8123))
                ...
        """
        self.check_open()
        if options.get("timeout") is not None:
            msg = "a service has no timeout: it runs until stopped"
            raise ValueError(msg)
        if restart not in ("never", "on-failure", "always"):
            msg = f"restart must be 'never', 'on-failure' or 'always', not {restart!r}"
            raise ValueError(msg)
        if math.isnan(ready_timeout) or ready_timeout < 0:
            msg = f"ready_timeout must be a non-negative number of seconds, not {ready_timeout!r}"
            raise ValueError(msg)
        if max_restarts < 0:
            msg = f"max_restarts must be >= 0, not {max_restarts!r}"
            raise ValueError(msg)
        command = normalize_command(command)  # read once: a restart runs the same argv
        svc = Service(name or _name_of(command), command, _Origin.STARTED)
        self.services.append(svc)
        assert self._nursery is not None
        self._nursery.start_soon(
            self._supervise_started, svc, command, ready, ready_timeout, restart, max_restarts, options
        )
        try:
            await svc._settled.wait()
        except BaseException:
            await self._stop_now(svc)
            raise
        if svc.error is not None:
            raise svc.error
        return svc

    async def stop(self, service: Service) -> Receipt | None:
        """Stop `service` with the bounded teardown; return its last receipt.

        Synopsis::

            receipt = await owner.stop(web)
        """
        if service not in self.services:
            msg = f"{service!r} does not belong to {self.name!r}"
            raise ServiceError(msg)
        await self._stop_now(service)
        return service.receipt

    async def _stop_now(self, svc: Service) -> None:
        svc._stop_requested = True
        if svc.run is not None and not svc._finished.is_set():
            svc.state.value = "stopping"
            svc.run.request_stop("stopped")
        with trio.CancelScope(shield=True):
            await svc._finished.wait()

    def adopt(self, run: OwnedCommand) -> Service:
        """Take over a command handed off to us (owner interface)."""
        assert run.handoff is not None
        svc = Service(_name_of(run.command), run.command, _Origin.HANDED_OFF)
        svc.run = run
        svc.handoff = run.handoff
        svc.state.value = "ready"
        svc._settled.set()
        self.services.append(svc)
        assert self._nursery is not None
        self._nursery.start_soon(self._supervise_adopted, svc, run)
        return svc

    # -- supervisors --------------------------------------------------------
    @trio.lowlevel.enable_ki_protection
    async def _supervise_adopted(self, svc: Service, run: OwnedCommand) -> None:
        try:
            async with trio.open_nursery() as nursery:
                run.relaunch(nursery)
                try:
                    await run.wait()
                except BaseException as exc:
                    run.request_stop(cause_of(exc))
                    interrupted = await run.wait_torn_down()
                    if not isinstance(exc, trio.Cancelled):
                        raise
                    if interrupted is not None:
                        raise interrupted from None
        finally:
            if run.receipt is not None:
                svc.receipts.append(run.receipt)
            svc.state.value = "stopped" if svc._stop_requested else "exited"
            svc._finished.set()

    @trio.lowlevel.enable_ki_protection
    async def _supervise_started(
        self,
        svc: Service,
        command: Command,
        ready: Readiness | None,
        ready_timeout: float,
        restart: RestartPolicy,
        max_restarts: int,
        options: OwnedOptions,
    ) -> None:
        try:
            while True:
                failed: ServiceNotReady | None = None
                async with open_owned_command(command, **options) as run:
                    svc.run = run
                    if svc._stop_requested:
                        run.request_stop("stopped")
                    why = await await_ready(run, ready, ready_timeout)
                    if why is not None:
                        run.request_stop("error")
                        receipt = await run.wait()
                        msg = f"service {svc.name!r} did not become ready: {why}"
                        failed = ServiceNotReady(msg, receipt, run.stdout, run.stderr)
                    else:
                        svc.state.value = "ready"
                        svc._settled.set()
                        await run.wait()
                assert run.receipt is not None
                svc.receipts.append(run.receipt)
                if failed is not None:
                    svc.state.value = "failed"
                    if not svc._settled.is_set():
                        svc.error = failed
                    return
                if svc._stop_requested or self._closed:
                    svc.state.value = "stopped"
                    return
                code = run.receipt.returncode
                wanted = restart == "always" or (restart == "on-failure" and code != 0)
                if not wanted or svc.restarts >= max_restarts:
                    svc.state.value = "exited"
                    return
                svc.restarts += 1
                svc.state.value = "restarting"
        except trio.Cancelled:
            # The owner's scope was cancelled; the teardown has run (in the
            # open_owned_command block) and the owner's own block re-raises.
            svc.state.value = "stopped"
        finally:
            last = svc.run.receipt if svc.run is not None else None
            if last is not None and (not svc.receipts or svc.receipts[-1] is not last):
                svc.receipts.append(last)
            if not svc._settled.is_set():
                if svc.error is None:
                    svc.error = ServiceError(f"service {svc.name!r} ended before it was ready")
                svc._settled.set()
            svc._finished.set()


def _name_of(command: Command | Sequence[str]) -> str:
    argv = normalize_command(command)
    if isinstance(argv, str):
        return argv.split()[0] if argv.split() else argv
    return os.path.basename(argv[0]) if argv else "service"


@asynccontextmanager
async def open_service_owner(name: str = "service owner") -> AsyncIterator[ServiceOwner]:
    """A scope that owns services beyond the blocks that start them; its
    exit stops every service concurrently, each with the bounded teardown.

    Synopsis::

        async with trio_procown.open_service_owner("test session") as owner:
            web = await owner.start([sys.executable, "-m", "http.server", "8123"],
                                    ready=trio_procown.ready_port(8123))
            ...
        for name, receipt in owner.receipts:
            print(name, receipt.cause, receipt.domain_empty)
    """
    owner = ServiceOwner(name)
    caught: BaseException | None = None
    with trio.CancelScope() as guard:
        async with trio.open_nursery() as nursery:
            owner._nursery = nursery
            try:
                yield owner
            except BaseException as exc:
                caught = exc
            guard.shield = True
            owner._closed = True
            cause = "stopped" if caught is None else cause_of(caught)
            for svc in owner.services:
                svc._stop_requested = True
                if svc.run is not None and not svc._finished.is_set():
                    svc.state.value = "stopping"
                    svc.run.request_stop(cause)
            budget = max((s.run.teardown_bound for s in owner.services if s.run is not None), default=0.0)
            with _clock.after(budget):
                for svc in owner.services:
                    await svc._finished.wait()
            nursery.cancel_scope.cancel()
    if caught is not None:
        raise caught
