# Signals sent off the event loop.
#
# Why: signalling a domain wakes its members, and on the project's 2-vCPU
# machines the woken processes run (and exit) on the core of the thread that
# signalled them: a killpg() of a 5-process group costs that thread
# ~150-400 us of wall time of which ~15 us is its own CPU (the rest is
# preemption). When 2,000 commands are cancelled together their teardowns
# all signal in one batch of the loop: the loop did not run for 0.8-2.5 s.
#
# So the teardown hands its signalling actions (the domain's own synchronous
# signal_graceful / force, unchanged, so the evidence they return is the
# same) to one long-lived worker thread fed by a queue, and awaits each
# one's completion while the loop goes on running. One worker keeps the
# actions of all teardowns in the order they were asked for; the queue is
# unbounded, its wait is bounded by each teardown's own deadline.
#
# Safety: an action that has not started when its teardown stops waiting
# (the teardown's deadline passed) is cancelled and never starts; one that
# has started cannot be recalled: `running` tells the teardown it must not
# reap the leader yet (its pid, and so the pgid, must not be recycled while
# a signal to it may still be sent).

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import trio

T = TypeVar("T")

# How many worker threads. One: the actions queue behind each other, and a
# second thread only adds contention for the interpreter lock (measured:
# 2,000 cgroup actions took 2.7 s with two, 1.3 s with one).
WORKERS = 1
# A worker wakes the loop once per this many finished actions (or when it
# has nothing more to do), not once per action.
REPORT_EVERY = 16
# A worker with nothing to do for this long ends (as trio's own thread
# cache does): a program that signalled once does not keep a thread for
# the rest of its life, and a test suite's thread-leak check sees none
# between teardowns that are this far apart.
IDLE_EXIT = 2.0
# The worker's thread name: a leak check can count it apart (it comes and
# goes with mass teardowns, and is not a leak of any one of them).
THREAD_NAME = "trio_procown signaller"
# The same machinery runs the shared process-table scans (_procfs: the
# spawner's C scanner, which holds no interpreter lock) in a worker of
# their own: a scan of 10,000 processes takes 0.1-1.5 s, and signals must
# not queue behind it.
SCANNER_NAME = "trio_procown scanner"


class Job(Generic[T]):
    """One action for the worker: `fn()`, its result or exception, when it
    started (time.perf_counter()), and `done` (a trio.Event of the run that
    submitted it)."""

    __slots__ = ("_lock", "_state", "_token", "done", "error", "fn", "result", "started")

    def __init__(self, fn: Callable[[], T], token: trio.lowlevel.TrioToken) -> None:
        self.fn = fn
        self.done = trio.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.started = 0.0
        self._token = token
        self._lock = threading.Lock()
        self._state = "queued"  # -> "running" -> "finished", or -> "cancelled"

    def cancel(self) -> bool:
        """Withdraw the job if it has not started; True if it never will."""
        with self._lock:
            if self._state == "queued":
                self._state = "cancelled"
            return self._state == "cancelled"

    @property
    def running(self) -> bool:
        """Started and not finished (its action may still be under way)."""
        return self._state == "running"

    def _start(self) -> bool:
        with self._lock:
            if self._state != "queued":
                return False
            self._state = "running"
            return True

    def _run(self) -> bool:
        """Perform the action unless it was cancelled; True if it ran."""
        if not self._start():
            return False
        self.started = time.perf_counter()
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed back to the teardown, which records it
            self.error = exc
        with self._lock:
            self._state = "finished"
        return True


def _set_all(jobs: list[Job[Any]]) -> None:
    for job in jobs:
        job.done.set()


def _report(finished: list[Job[Any]]) -> None:
    """Wake the tasks waiting for `finished`: one callback per trio run
    (each wakeup of the loop costs it a system call)."""
    by_token: dict[trio.lowlevel.TrioToken, list[Job[Any]]] = {}
    for job in finished:
        by_token.setdefault(job._token, []).append(job)
    for token, jobs in by_token.items():
        try:
            token.run_sync_soon(_set_all, jobs)
        except trio.RunFinishedError:
            pass  # nobody is waiting any more


class _Worker:
    def __init__(self, name: str = THREAD_NAME) -> None:
        self.name = name
        self._jobs: deque[Job[Any]] = deque()
        self._wake = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []

    def submit(self, job: Job[Any]) -> None:
        """Queue `job`. Raises RuntimeError, with nothing queued, when no
        worker runs and none can be started (the process's thread limit):
        the caller then does the work itself."""
        with self._wake:
            self._jobs.append(job)
            if len(self._threads) < WORKERS:
                thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._threads.append(thread)
                try:
                    thread.start()
                except RuntimeError:
                    self._threads.remove(thread)
                    if not self._threads:  # nobody would take the job
                        self._jobs.remove(job)
                        raise
            else:
                self._wake.notify()

    def _loop(self) -> None:
        jobs = self._jobs
        finished: list[Job[Any]] = []
        while True:
            with self._wake:
                while not jobs:
                    if not self._wake.wait(IDLE_EXIT) and not jobs:
                        # Under the lock: submit() starts a new worker for
                        # any job queued after this one has left the list.
                        self._threads.remove(threading.current_thread())
                        return
                job = jobs.popleft()
                more = bool(jobs)
            if job._run():
                finished.append(job)
            if finished and (not more or len(finished) >= REPORT_EVERY):
                _report(finished)
                finished = []

    def after_fork(self) -> None:
        # The worker threads do not exist in a forked child: start afresh.
        self._jobs = deque()
        self._wake = threading.Condition(threading.Lock())
        self._threads = []


_WORKER = _Worker()
_SCANNER = _Worker(SCANNER_NAME)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER.after_fork)
    os.register_at_fork(after_in_child=_SCANNER.after_fork)


def pending() -> bool:
    """Are actions queued for the worker (not yet started)?"""
    return bool(_WORKER._jobs)


def other_threads() -> int:
    """How many threads run in this process, the signaller's, the scanner's
    and the cloner's workers left out, and trio's idle cached workers (a
    spawn beside live commands clones in one, as trio's own spawn does;
    trio ends each after 10 s idle)."""
    from ._cloner import THREAD_NAME as CLONER_NAME

    ours = (THREAD_NAME, SCANNER_NAME, CLONER_NAME)
    return sum(1 for t in threading.enumerate() if t.name not in ours and not t.name.startswith(TRIO_CACHED))


TRIO_CACHED = "Trio thread "  # the name of an idle thread of trio's thread cache (trio 0.35)


def submit(fn: Callable[[], T]) -> Job[T]:
    """Queue `fn()` for the worker thread; await `job.done`, then read
    `job.result` / `job.error`. Call from a trio run."""
    job = Job(fn, trio.lowlevel.current_trio_token())
    _WORKER.submit(job)
    return job


def submit_scan(fn: Callable[[], T]) -> Job[T]:
    """As submit(), for the scanner's worker thread."""
    job = Job(fn, trio.lowlevel.current_trio_token())
    _SCANNER.submit(job)
    return job
