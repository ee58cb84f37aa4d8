# The library's exceptions, in one small hierarchy.
#
#   ProcownError                       every error trio_procown raises itself
#   +-- DomainUnavailable              (also a RuntimeError)
#   +-- HandoffError                   (also a RuntimeError)
#   |   +-- OwnerClosed                (also a ServiceError)
#   +-- ServiceError                   (also a RuntimeError)
#   |   +-- ServiceNotReady
#   |   +-- OwnerClosed
#   +-- CliError                       procown's own failure (exit status 125)
#   +-- ProcessLeakError               (also an AssertionError) a NoLeaks block leaked
#
# Each error keeps the stdlib base it had before the root existed, so code
# that catches RuntimeError keeps working. OwnerClosed is both a
# HandoffError and a ServiceError because both ways into a closed owner
# raise it: `run.hand_off(owner)` (a handoff that cannot happen; before
# OwnerClosed existed it raised a plain HandoffError, and still matches
# `except HandoffError`) and `owner.start(cmd)` (a service that cannot be
# started). Errors the operating system gives (a missing executable, a bad
# cwd) stay the OSError it raised, and bad arguments stay ValueError: they
# are not wrapped.

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._leaks import LeakedProcess
    from ._receipt import Receipt


class ProcownError(Exception):
    """The root of every error trio_procown raises itself.

    Synopsis::

        try:
            result = await trio_procown.run_owned(["true"], domain="process-group")
        except trio_procown.ProcownError as exc:
            print("trio_procown could not do it:", exc)
    """


class DomainUnavailable(ProcownError, RuntimeError):
    """The requested ownership domain cannot be used on this machine; the
    message says why.

    Synopsis::

        try:
            result = await trio_procown.run_owned(["true"], domain="cgroup")
        except trio_procown.DomainUnavailable as exc:
            print("no cgroup here:", exc)
    """


class HandoffError(ProcownError, RuntimeError):
    """A command cannot be handed off (already handed off, ended, or the
    owner is closed).

    Synopsis::

        async with trio_procown.open_owned_command(["true"]) as run:
            receipt = await run.wait()
            try:
                await run.hand_off(owner, reason="keep it running")
            except trio_procown.HandoffError:
                print(receipt.cause)  # it already ended: its receipt says how
    """


class ServiceError(ProcownError, RuntimeError):
    """A service could not be started or kept running.

    Synopsis::

        try:
            svc = await owner.start(cmd, ready=trio_procown.ready_line("listening"))
        except trio_procown.ServiceError as exc:
            print("service failed:", exc)
    """


class ServiceNotReady(ServiceError):
    """A service did not become ready; it was torn down.

    `receipt` is its teardown receipt; `stdout` and `stderr` what it printed.

    Synopsis::

        try:
            await owner.start(cmd, ready=trio_procown.ready_line("listening"), ready_timeout=10)
        except trio_procown.ServiceNotReady as exc:
            print(exc.stderr.decode(), exc.receipt.claims())
    """

    def __init__(self, msg: str, receipt: Receipt | None, stdout: bytes, stderr: bytes) -> None:
        super().__init__(msg)
        self.receipt = receipt
        self.stdout = stdout
        self.stderr = stderr


class OwnerClosed(ServiceError, HandoffError):
    """The service owner has closed: nothing can be started on it or
    handed off to it. A ServiceError (for `owner.start`) and a HandoffError
    (for `run.hand_off`).

    Synopsis::

        async with trio_procown.open_service_owner() as owner:
            pass
        try:
            await owner.start(["sleep", "30"])
        except trio_procown.OwnerClosed:
            ...  # open a new owner
    """


class CliError(ProcownError):
    """An error of procown itself, reported on one line; exit status 125."""


class ProcessLeakError(ProcownError, AssertionError):
    """A NoLeaks block (or the pytest plugin's `procown_no_leaks`) left
    processes running; `leaks` names each one and what became of it.

    It is an AssertionError as well because a leak is a failed check of the
    code under test, not an error of trio_procown: pytest then reports it as
    a test failure, and code that treats failed assertions specially (pytest,
    hypothesis) does the same for it.

    Synopsis::

        try:
            with trio_procown.NoLeaks():
                subprocess.Popen(["sleep", "30"])
        except trio_procown.ProcessLeakError as exc:
            print([(leak.pid, leak.fate) for leak in exc.leaks])  # stopped: "terminated"
    """

    def __init__(self, message: str, leaks: list[LeakedProcess]) -> None:
        super().__init__(message)
        self.leaks = leaks
