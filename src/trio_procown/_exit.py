# Ending a procown command-line process quickly.
#
# By the time `procown run` or `procown timeout` has its exit status, the
# command is torn down and the receipt written; what is left of a normal
# interpreter exit is tens of milliseconds of finalisation (module and
# object teardown) that nothing needs, paid *after the deadline* by a
# caller that waits for procown. The console scripts therefore end with
# exit_now(): flush what was written, end the keeper (killed at once when
# no domain is open, else told goodbye, bounded: see _end_idle_keeper and
# _keeper.retire), then os._exit. Library code never calls it: main()
# returns the status, so tests and callers in-process are unaffected.

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

# Python's own status when flushing stdout at exit fails (Py_FinalizeEx).
_FLUSH_FAILED = 120


def exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, let the keeper go, and end the process with `code`."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            if code == 0 and stream is sys.stdout:
                code = _FLUSH_FAILED
    from . import _keeper

    _end_idle_keeper()
    _keeper.at_exit()
    os._exit(code)


def _end_idle_keeper() -> None:
    """SIGKILL this process's keeper if no domain is open, before at_exit's
    goodbye. With nothing open it has nothing to end, and a command as short
    as `procown run -- true` is over before its keeper's interpreter has
    started: at_exit would wait for the rest of that start-up (~7 ms here)
    only to see it read "bye" and exit. Killed, it is gone at once and
    at_exit still reaps it, so no keeper outlives procown either way. With
    domains open nothing changes (at_exit closes the pipe and the keeper
    ends them)."""
    import signal

    from . import _keeper

    client = _keeper._client
    if client is None or client.owner != os.getpid() or client.fd < 0 or client.pidfd is None:
        return
    with client.lock:
        if client.open or client.pidfd is None:
            return
        try:
            signal.pidfd_send_signal(client.pidfd, signal.SIGKILL)
        except OSError:
            pass  # already gone; at_exit reaps it


def run_and_exit(main: Callable[[], int]) -> NoReturn:
    """The console scripts' entry: `main()`'s status, through exit_now."""
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    exit_now(code)
