"""Small helpers shared by the tests (process checks, domain list)."""

from __future__ import annotations

import psutil

import trio_procown


def alive(pid: int) -> bool:
    """True if `pid` is a live (non-zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def domains() -> list[str]:
    """The domains this machine offers, strongest first."""
    return [d.name for d in trio_procown.available_domains() if d.available]


def pids_in(text: bytes) -> list[int]:
    """Integers printed one per line as 'pid N'."""
    return [int(line.split()[1]) for line in text.decode().splitlines() if line.startswith("pid ")]
