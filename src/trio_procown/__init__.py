"""Run external commands from Trio so that each invocation owns everything it
starts, tears it all down within a bound, and leaves a receipt."""

from __future__ import annotations

import gc as _gc
import sys as _sys

# Nothing else is imported before the console scripts' entry point
# (_entry.py) takes the early signals: typing and importlib, ~4 ms of a
# cold start-up, are imported when first needed.
TYPE_CHECKING = False

# What the collector held frozen when the package was first imported: on
# CPython 3.12, the interpreter's own immortal objects, not the program's
# (see _mass.py). Read here, at the first import, rather than when the
# library's modules load on first use, which may come after the program
# froze its heap.
_FROZEN_AT_IMPORT = _gc.get_freeze_count() if _sys.version_info[:2] == (3, 12) else 0

if TYPE_CHECKING:
    from typing import Any

    from ._census import COOKIE_VAR as COOKIE_VAR
    from ._choice import DomainOption as DomainOption
    from ._choice import auto_choice as auto_choice
    from ._choice import available_domains as available_domains
    from ._command import CAPTURE as CAPTURE
    from ._command import DEVNULL as DEVNULL
    from ._command import INHERIT as INHERIT
    from ._command import STDOUT as STDOUT
    from ._command import OwnedCommand as OwnedCommand
    from ._command import OwnedResult as OwnedResult
    from ._command import open_owned_command as open_owned_command
    from ._command import run_owned as run_owned
    from ._errors import DomainUnavailable as DomainUnavailable
    from ._errors import HandoffError as HandoffError
    from ._errors import OwnerClosed as OwnerClosed
    from ._errors import ProcessLeakError as ProcessLeakError
    from ._errors import ProcownError as ProcownError
    from ._errors import ServiceError as ServiceError
    from ._errors import ServiceNotReady as ServiceNotReady
    from ._handoff import HandoffReceipt as HandoffReceipt
    from ._leaks import LeakedProcess as LeakedProcess
    from ._leaks import NoLeaks as NoLeaks
    from ._ready import ready_file as ready_file
    from ._ready import ready_line as ready_line
    from ._ready import ready_port as ready_port
    from ._ready import ready_when as ready_when
    from ._receipt import Action as Action
    from ._receipt import ProcessRecord as ProcessRecord
    from ._receipt import Receipt as Receipt
    from ._receipt import Step as Step
    from ._receipt import StreamRecord as StreamRecord
    from ._run_process import OwnedCalledProcessError as OwnedCalledProcessError
    from ._run_process import OwnedCompletedProcess as OwnedCompletedProcess
    from ._run_process import OwnedProcess as OwnedProcess
    from ._run_process import RunProcessOptions as RunProcessOptions
    from ._run_process import run_process as run_process
    from ._service import Service as Service
    from ._service import ServiceOwner as ServiceOwner
    from ._service import open_service_owner as open_service_owner
    from ._slurm import SlurmDomain as SlurmDomain
    from ._subreaper import enable_subreaper as enable_subreaper

# Every public name is imported on first use (PEP 562), so that importing
# the package, or one of its modules (the pytest plugin, loaded by every
# pytest run through its entry point), does not import trio and the whole
# library. The first use of any name imports what `import trio_procown`
# used to (_CORE) at once, and gives each public object the package as its
# __module__; rarely used names (the leak tracker, readiness probes,
# run_process, services, the subreaper) wait for their own first use.
_CORE = {
    "COOKIE_VAR": "_census",
    "DomainOption": "_choice",
    "auto_choice": "_choice",
    "available_domains": "_choice",
    "CAPTURE": "_command",
    "DEVNULL": "_command",
    "INHERIT": "_command",
    "STDOUT": "_command",
    "OwnedCommand": "_command",
    "OwnedResult": "_command",
    "open_owned_command": "_command",
    "run_owned": "_command",
    "DomainUnavailable": "_errors",
    "HandoffError": "_errors",
    "OwnerClosed": "_errors",
    "ProcessLeakError": "_errors",
    "ProcownError": "_errors",
    "ServiceError": "_errors",
    "ServiceNotReady": "_errors",
    "Action": "_receipt",
    "HandoffReceipt": "_handoff",
    "ProcessRecord": "_receipt",
    "Receipt": "_receipt",
    "Step": "_receipt",
    "StreamRecord": "_receipt",
}
_LAZY = {
    "LeakedProcess": "_leaks",
    "NoLeaks": "_leaks",
    "ready_file": "_ready",
    "ready_line": "_ready",
    "ready_port": "_ready",
    "ready_when": "_ready",
    "OwnedCalledProcessError": "_run_process",
    "OwnedCompletedProcess": "_run_process",
    "OwnedProcess": "_run_process",
    "RunProcessOptions": "_run_process",
    "run_process": "_run_process",
    "Service": "_service",
    "ServiceOwner": "_service",
    "open_service_owner": "_service",
    "SlurmDomain": "_slurm",
    "enable_subreaper": "_subreaper",
}

__all__ = [
    "CAPTURE",
    "COOKIE_VAR",
    "DEVNULL",
    "INHERIT",
    "STDOUT",
    "Action",
    "DomainOption",
    "DomainUnavailable",
    "HandoffError",
    "HandoffReceipt",
    "LeakedProcess",
    "NoLeaks",
    "OwnedCalledProcessError",
    "OwnedCommand",
    "OwnedCompletedProcess",
    "OwnedProcess",
    "OwnedResult",
    "OwnerClosed",
    "ProcessLeakError",
    "ProcessRecord",
    "ProcownError",
    "Receipt",
    "RunProcessOptions",
    "Service",
    "ServiceError",
    "ServiceNotReady",
    "ServiceOwner",
    "SlurmDomain",
    "Step",
    "StreamRecord",
    "auto_choice",
    "available_domains",
    "enable_subreaper",
    "open_owned_command",
    "open_service_owner",
    "ready_file",
    "ready_line",
    "ready_port",
    "ready_when",
    "run_owned",
    "run_process",
]

__version__ = "0.1.0"


def _public(obj: Any) -> None:
    if getattr(obj, "__module__", "").startswith("trio_procown."):
        try:
            obj.__module__ = "trio_procown"
        except (AttributeError, TypeError):
            pass


def _load(names: dict[str, str]) -> None:
    from importlib import import_module

    for name, module in names.items():
        obj = getattr(import_module(f".{module}", __name__), name)
        _public(obj)
        globals()[name] = obj


def __getattr__(name: str) -> Any:
    if name in _CORE:
        _load(_CORE)
    elif name in _LAZY:
        _load({name: _LAZY[name]})
    elif name.startswith("_") and not name.startswith("__"):
        # A module of the package that nothing has imported yet.
        from importlib import import_module

        try:
            return import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    if name not in globals():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_CORE) | set(_LAZY))
