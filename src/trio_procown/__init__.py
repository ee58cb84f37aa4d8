"""Run external commands from Trio so that each invocation owns everything it
starts, tears it all down within a bound, and leaves a receipt."""

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
from ._leaks import NoLeaks as NoLeaks
from ._ready import ready_file as ready_file
from ._ready import ready_line as ready_line
from ._ready import ready_port as ready_port
from ._ready import ready_when as ready_when
from ._receipt import Action as Action
from ._receipt import HandoffReceipt as HandoffReceipt
from ._receipt import ProcessRecord as ProcessRecord
from ._receipt import Receipt as Receipt
from ._receipt import Step as Step
from ._receipt import StreamRecord as StreamRecord
from ._run_process import OwnedProcess as OwnedProcess
from ._run_process import run_process as run_process
from ._service import Service as Service
from ._service import ServiceOwner as ServiceOwner
from ._service import open_service_owner as open_service_owner
from ._subreaper import enable_subreaper as enable_subreaper

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
    "NoLeaks",
    "OwnedCommand",
    "OwnedProcess",
    "OwnedResult",
    "OwnerClosed",
    "ProcessLeakError",
    "ProcessRecord",
    "ProcownError",
    "Receipt",
    "Service",
    "ServiceError",
    "ServiceNotReady",
    "ServiceOwner",
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

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("trio_procown."):
        try:
            _obj.__module__ = "trio_procown"
        except (AttributeError, TypeError):
            pass
del _name, _obj
