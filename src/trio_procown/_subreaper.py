# Optional subreaper mode (Linux).
#
# Orphans of an owned command normally go to PID 1, which on some machines
# reaps them only every few seconds; until then they are zombies, and the
# receipt can only say "terminated, left for someone else to reap". With
# PR_SET_CHILD_SUBREAPER our process adopts them instead, and the teardown
# reaps the zombies it finds in the domain whose parent is now us.
#
# This is process-wide and cannot be undone per command: every orphan of
# every descendant of this program (not only owned commands) is re-parented
# to us. We reap only zombies that a teardown found in its own domain; any
# other adopted orphan stays a zombie until something else in the program
# reaps it, so enable this only in a program that owns its commands.

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

from ._procfs import ProcInfo

_PR_SET_CHILD_SUBREAPER = 36
_enabled = False


def enable_subreaper() -> None:
    """Make this process the subreaper of its descendants' orphans (Linux).

    Synopsis::

        trio_procown.enable_subreaper()
        receipt = (await trio_procown.run_owned(cmd)).receipt
    """
    global _enabled
    if _enabled:
        return
    libc = ctypes.CDLL(None, use_errno=True)  # the symbols already loaded: libc's among them
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")
    _enabled = True


def reap_orphans(zombies: Sequence[ProcInfo]) -> int:
    """Reap the zombies of a domain that were re-parented to us."""
    me = os.getpid()
    reaped = 0
    for z in zombies:
        if z.ppid != me:
            continue
        try:
            pid, _ = os.waitpid(z.pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if pid == z.pid:
            reaped += 1
    return reaped
