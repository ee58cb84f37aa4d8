# Choosing an ownership domain.
#
# "auto" takes the strongest domain this machine offers: a cgroup v2 child
# when a writable, delegated cgroup v2 directory is found and a process can
# be moved into a child of it (probed once per process and cached), else the
# POSIX process group. Asking for a domain by name never falls back: it
# raises DomainUnavailable saying why the domain cannot be used.

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

from . import _cgroup
from ._domain import Domain, ProcessGroupDomain
from ._errors import DomainUnavailable

if TYPE_CHECKING:
    from ._slurm import SlurmDomain

# A domain by name, or a SlurmDomain (the Slurm domain with its options).
# _slurm.py is imported only when the Slurm domain is asked for (by name or
# by a SlurmDomain, which cannot exist before that module is imported).
DomainName: TypeAlias = 'Literal["auto", "cgroup", "process-group", "slurm"] | SlurmDomain'


@dataclass(frozen=True, slots=True)
class DomainOption:
    """One ownership domain and whether this machine offers it.

    Synopsis::

        for option in trio_procown.available_domains():
            print(option.name, option.available, option.reason)
    """

    name: str
    available: bool
    reason: str  # why it is unavailable, or what it will use


def is_posix() -> bool:
    """True on POSIX platforms (the process-group domain needs one)."""
    return os.name == "posix"


def available_domains() -> list[DomainOption]:
    """Every domain this library knows, strongest first, with availability.

    Synopsis::

        names = [d.name for d in trio_procown.available_domains() if d.available]
    """
    root = _cgroup.default_root()
    why = _cgroup.unavailable_reason(root)
    cgroup = DomainOption(
        "cgroup",
        why is None,
        f"child cgroups under {os.path.realpath(root)}" if why is None and root else (why or ""),
    )
    posix = is_posix()
    group = DomainOption(
        "process-group",
        posix,
        "a new session and process group per command" if posix else "not a POSIX platform",
    )
    return [cgroup, group]


def auto_choice() -> DomainOption:
    """The domain "auto" picks here (the strongest available).

    Synopsis::

        print(trio_procown.auto_choice().name)   # "cgroup" or "process-group"
    """
    for option in available_domains():
        if option.available:
            return option
    msg = "no ownership domain is available on this platform"
    raise DomainUnavailable(msg)


async def bind_domain(choice: DomainName, timeout: float | None, budgets: float) -> DomainName:
    """The domain choice for one command, given its deadline: a Slurm
    domain gets the job's time limit (timeout + the teardown budgets) and is
    checked with the controller (bounded, without blocking the loop); names
    of local domains are returned as they are."""
    if choice == "slurm" or not isinstance(choice, str):
        from ._slurm import SlurmDomain

        if choice == "slurm":
            choice = SlurmDomain()
        if isinstance(choice, SlurmDomain):
            spec = choice.bound(timeout, budgets)
            return await spec.checked_for(["true"])
    return choice


def make_domain(choice: DomainName) -> Domain:
    """A fresh domain instance for one command."""
    if choice == "slurm" or not isinstance(choice, str):
        from ._slurm import SlurmDomain

        if isinstance(choice, SlurmDomain):
            return choice.make()
        if choice == "slurm":
            return SlurmDomain().make()
    if choice == "auto":
        choice = auto_choice().name  # type: ignore[assignment]
    if choice == "cgroup":
        return _cgroup.CgroupDomain()
    if choice == "process-group":
        if not is_posix():
            msg = "the process-group domain needs a POSIX platform"
            raise DomainUnavailable(msg)
        return ProcessGroupDomain()
    msg = f"domain must be 'auto', 'cgroup', 'process-group', 'slurm' or a SlurmDomain, not {choice!r}"
    raise ValueError(msg)
