# The clone of a process-group command made after an idle gap, by a thread
# of our own.
#
# Why: on the project's 2-vCPU machines, a process-group command spawned
# after 50 ms idle cost 1.39-1.45 x trio.run_process (capturing both
# streams), against 1.15-1.17 x back to back (benchmarks/spawn.py). Traced
# with ftrace: trio's Popen runs in a worker thread, and that thread's
# wakeup of the loop's thread moves the loop's thread to the idle vCPU, so
# trio's Python after the spawn runs beside the child's exec. Ours cloned
# from the loop's thread: the kernel placed the child on the loop's CPU,
# and the work after the spawn shared that CPU with the exec (fork to
# exec done: 579 us against trio's 335 us).
#
# So after the calling thread was idle (see after_idle) the clone is made
# by a worker thread while the calling thread waits for it: the spawn stays
# synchronous (nothing runs in between, as before), only the thread that
# calls clone3 differs. Spawns of `true` one after another, a sleep of G
# before each (medians, x trio.run_process capture): G = 0 (each waits only
# for the previous command): 0.91 x from the loop's thread, 0.96 x through
# the worker; G = 1 ms: 1.29 against 1.15 x; 5 ms: 1.38 / 1.23 x; 20 ms:
# 1.33 / 1.18 x; 50 ms: 1.34 / 1.16 x. A thread that keeps busy between
# spawns (other commands, other work) clones itself: there the handoff
# costs (+0.05 x in the benchmark's interleaved rounds when any spawn 1 ms
# after the previous used it; with the rule of after_idle, +0.03 x: 1.17-1.19
# against 1.14-1.16 x, and 1.24-1.30 against 1.40-1.55 x after 50 ms idle,
# three runs each). Not for the cgroup domain: no gain after idle, and
# 1.35 -> 1.52 x back to back (measured; not explained).
#
# The child restores the signal mask its cloning thread had (the spawner
# blocks every signal around the clone): the worker takes the caller's mask
# before each clone, so the child gets what it would have got from the
# caller. The worker ends after IDLE_EXIT without work, as trio's own thread
# cache does.

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

# A spawn this long after the previous one from the same thread, which ran
# for at most BUSY_SHARE of that time (it slept the rest: its CPU went
# idle), is made by the worker thread.
IDLE_GAP = 0.02
BUSY_SHARE = 0.1
# The worker's thread ends after this long without a clone to make.
IDLE_EXIT = 10.0
# Its name: a leak check can count it apart (_signaller.other_threads).
THREAD_NAME = "trio_procown cloner"


class _Last(threading.local):
    # time.monotonic() of this thread's latest spawn, and time.thread_time()
    # then. Its first spawn clones from the thread itself: nothing says it
    # was idle (a `procown run` has just imported us), and a one-off
    # command would pay for starting the worker. `busy`: the thread is a
    # worker cloning for the event loop's thread (never idle for this).
    wall = float("inf")
    cpu = 0.0
    busy = False


_last = _Last()


@contextlib.contextmanager
def not_idle() -> Iterator[None]:
    """Spawns made meanwhile by this thread clone from it (after_idle
    says no): a worker of the loop's, already off the loop's thread."""
    _last.busy = True
    try:
        yield
    finally:
        _last.busy = False


def after_idle() -> bool:
    """Has the calling thread been idle since its previous spawn (IDLE_GAP or
    more, busy for at most BUSY_SHARE of it)? Counts this spawn."""
    if _last.busy:
        return False
    wall, cpu = time.monotonic(), time.thread_time()
    gap = wall - _last.wall
    idle = gap >= IDLE_GAP and cpu - _last.cpu <= BUSY_SHARE * gap
    _last.wall, _last.cpu = wall, cpu
    return idle


class _Job:
    __slots__ = ("args", "done", "error", "fn", "mask", "result")

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], mask: set[int | signal.Signals]
    ) -> None:
        self.fn = fn
        self.args = args
        self.mask = mask
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()


class _Cloner:
    def __init__(self) -> None:
        self._wake = threading.Condition(threading.Lock())
        self._jobs: deque[_Job] = deque()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) in the worker thread, the caller's signal mask applied
        there first; the calling thread waits. In the calling thread itself
        when no worker can be started."""
        job = _Job(fn, args, signal.pthread_sigmask(signal.SIG_BLOCK, ()))
        with self._wake:
            if self._thread is None:
                thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # the process's thread limit
                    return fn(*args)
                self._thread = thread
            self._jobs.append(job)
            self._wake.notify()
        interrupted: BaseException | None = None
        while True:
            try:
                job.done.acquire()
                break
            except BaseException as exc:  # a signal handler raised (^C): the clone goes on regardless
                interrupted = exc
        if interrupted is not None:
            raise interrupted  # as it would have been, right after an inline spawn
        if job.error is not None:
            raise job.error
        return job.result

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._jobs:
                    if not self._wake.wait(IDLE_EXIT) and not self._jobs:
                        # Under the lock: call() starts a new worker for any
                        # job queued once this one has gone.
                        self._thread = None
                        return
                job = self._jobs.popleft()
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, job.mask)
                job.result = job.fn(*job.args)
            except BaseException as exc:  # handed back to the caller
                job.error = exc
            job.done.release()

    def after_fork(self) -> None:
        # The worker does not exist in a forked child: start afresh.
        self._wake = threading.Condition(threading.Lock())
        self._jobs = deque()
        self._thread = None


_CLONER = _Cloner()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CLONER.after_fork)


def clone_in_worker(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (the spawner's entry), called through the worker thread."""

    def through_worker(*args: Any) -> Any:
        return _CLONER.call(fn, *args)

    return through_worker
