# Process handles that cannot be recycled.
#
# A pid names whichever process holds that number now; once a process is
# reaped its number can be handed to a stranger. A pidfd names one process
# for as long as the descriptor is open, so signals sent through it can never
# reach a recycled pid, and it becomes readable when the process exits, which
# lets trio wait for any process (not only our children) without polling.
#
# Where pidfds are missing (not Linux, or an old kernel), waiting falls back
# to polling with a short, growing interval; every such wait runs under the
# caller's cancel scope, which carries the bound.
#
# The same handles serve synchronous callers (the pytest plugin's leak
# teardown, trio_procown.NoLeaks): `close` works inside a trio run or not,
# and `wait_all_exited` / `block_until` block the thread, each with its
# bound as an argument.

from __future__ import annotations

import errno
import os
import select
import signal
import time
from collections.abc import Callable, Collection

import trio

from . import _clock

HAVE_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")

# Polling interval bounds for platforms without pidfds.
_POLL_FIRST = 0.001
_POLL_MAX = 0.02


def open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid`, or None if it is gone or pidfds are unavailable."""
    if not HAVE_PIDFD:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.EINVAL, errno.ENOSYS, errno.EPERM):
            return None
        raise


def send(pidfd: int, sig: int) -> bool:
    """Signal the process behind `pidfd`; False if it has already exited."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True


def exited(pidfd: int) -> bool:
    """True once the process behind `pidfd` has terminated (zombie or gone)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


async def wait_exited(pidfd: int) -> None:
    """Wait until the process behind `pidfd` has terminated."""
    await trio.lowlevel.wait_readable(pidfd)


def status_to_returncode(si_code: int, si_status: int) -> int:
    """Map a waitid() result to subprocess's convention (-N for signal N)."""
    if si_code == os.CLD_EXITED:
        return si_status
    return -si_status


def reap_exited(pidfd: int) -> int | None:
    """Reap our child behind `pidfd`, which has exited (else this blocks
    until it does): its returncode (-N for signal N), or None when someone
    else reaped it first (the program ignores SIGCHLD, or waited for any
    child). Through the pidfd, never the pid: a child reaped elsewhere
    leaves its pid free for another of our children."""
    try:
        res = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    except ChildProcessError:
        return None
    if res is None:
        return None
    return status_to_returncode(res.si_code, res.si_status)


def close(pidfd: int) -> None:
    """Close a pidfd that no task is waiting on any more (in a trio run or not)."""
    try:
        trio.lowlevel.notify_closing(pidfd)
    except RuntimeError:
        pass  # no trio run in this thread: no task of one can be waiting on it
    os.close(pidfd)


def wait_all_exited(pidfds: Collection[int], timeout: float) -> bool:
    """Block until every process behind `pidfds` has terminated, at most
    `timeout` seconds; True if they all did."""
    deadline = time.monotonic() + timeout
    pending = [fd for fd in pidfds if not exited(fd)]
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLIN)
        poller.poll(max(1, int(left * 1000)))
        pending = [fd for fd in pending if not exited(fd)]
    return True


def block_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll `predicate()` as poll_until does, blocking the thread, at most
    `timeout` seconds; its last value."""
    deadline = time.monotonic() + timeout
    delay = _POLL_FIRST
    while not predicate():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, _POLL_MAX)
    return True


async def poll_until(predicate: Callable[[], bool]) -> None:
    """Poll `predicate()` with a growing interval until it is true.

    The only bound is the caller's cancel scope, which every caller sets.
    """
    delay = _POLL_FIRST
    while not predicate():
        await _clock.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)
