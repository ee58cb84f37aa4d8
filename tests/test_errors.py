"""The exception hierarchy: one root, the stdlib bases kept, the names where users find them."""

from __future__ import annotations

import pytest

import trio_procown
from trio_procown import _cli, _command, _domain, _errors, _service

# Each error and the stdlib base it had before ProcownError existed.
STDLIB_BASES: list[tuple[type[Exception], type[Exception]]] = [
    (trio_procown.DomainUnavailable, RuntimeError),
    (trio_procown.HandoffError, RuntimeError),
    (trio_procown.ServiceError, RuntimeError),
    (trio_procown.ServiceNotReady, RuntimeError),
    (trio_procown.OwnerClosed, RuntimeError),
    (_errors.CliError, Exception),
]


@pytest.mark.parametrize(("error", "base"), STDLIB_BASES, ids=lambda x: x.__name__)
def test_every_error_is_a_procown_error_and_keeps_its_stdlib_base(
    error: type[Exception], base: type[Exception]
) -> None:
    """`except ProcownError` catches every library error; `except RuntimeError` still works."""
    assert issubclass(error, trio_procown.ProcownError)
    assert issubclass(error, base)


def test_the_root_is_a_plain_exception() -> None:
    """ProcownError is an Exception, not a RuntimeError: the root promises nothing more."""
    assert issubclass(trio_procown.ProcownError, Exception)
    assert not issubclass(trio_procown.ProcownError, RuntimeError)


def test_owner_closed_is_a_handoff_error_and_a_service_error() -> None:
    """OwnerClosed matches both ways into a closed owner: hand_off and start."""
    assert issubclass(trio_procown.OwnerClosed, trio_procown.HandoffError)
    assert issubclass(trio_procown.OwnerClosed, trio_procown.ServiceError)
    assert not issubclass(trio_procown.OwnerClosed, trio_procown.ServiceNotReady)


def test_service_not_ready_carries_its_evidence() -> None:
    """ServiceNotReady keeps the message, the receipt and the output it was given."""
    exc = trio_procown.ServiceNotReady("not ready after 1s", None, b"out", b"err")
    assert str(exc) == "not ready after 1s"
    assert (exc.receipt, exc.stdout, exc.stderr) == (None, b"out", b"err")


def test_public_errors_are_exported_as_trio_procown_names() -> None:
    """The public errors are in __all__ and show as trio_procown.X in tracebacks."""
    for name in ("ProcownError", "DomainUnavailable", "HandoffError", "OwnerClosed", "ServiceError"):
        assert name in trio_procown.__all__
        assert getattr(trio_procown, name).__module__ == "trio_procown"
    assert "ServiceNotReady" in trio_procown.__all__
    assert "CliError" not in trio_procown.__all__  # procown's own, reported as exit status 125


def test_old_modules_still_name_the_same_classes() -> None:
    """Internal users importing an error from its old module get the one class."""
    assert _domain.DomainUnavailable is trio_procown.DomainUnavailable
    assert _command.HandoffError is trio_procown.HandoffError
    assert _service.ServiceError is trio_procown.ServiceError  # type: ignore[attr-defined]
    assert _service.ServiceNotReady is trio_procown.ServiceNotReady  # type: ignore[attr-defined]
    assert _cli.CliError is _errors.CliError  # type: ignore[attr-defined]
