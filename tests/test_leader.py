"""The leader's own bookkeeping (_leader.py), without a teardown."""

from __future__ import annotations

import os
import sys

import pytest

from trio_procown import _procfs
from trio_procown._leader import Leader

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="start times are read from /proc"),
    pytest.mark.timeout(30),
]


def _spawn_true() -> Leader:
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        env = [k + b"=" + v for k, v in os.environb.items()]
        return Leader.spawn(["/bin/true"], stdin=null, stdout=null, stderr=null, cwd=None, env=env)
    finally:
        os.close(null)


def test_start_time_is_read_at_first_use_while_unreaped() -> None:
    """A start time the spawn could not tell (its clock bracket crossed a tick) is read when
    first asked for (not inside the spawn, while the child is still in its execve), from the
    leader itself: the exited, unreaped leader still shows it."""
    leader = _spawn_true()
    leader._start = None  # as after a spawn whose bracket crossed a tick
    try:
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        info = _procfs.read_stat(leader.pid)
        assert info is not None
        assert leader.start == info.start != 0
    finally:
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)
        assert leader.reap()


def test_start_time_unknown_once_reaped() -> None:
    """Not known from the spawn and asked for only after the reap, the start time is unknown
    (0), never read from whatever process got the pid since."""
    leader = _spawn_true()
    leader._start = None  # as after a spawn whose bracket crossed a tick
    os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)
    assert leader.reap()
    assert leader.start == 0


def test_a_start_time_known_from_the_spawn_outlives_the_reap() -> None:
    """The spawner's start time (the clock around the clone) is the leader's own, as the
    kernel shows it while the leader is unreaped, and stays known after the reap."""
    for _ in range(20):  # a bracket across a tick (~1 %) leaves it to /proc: try again
        leader = _spawn_true()
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)
        info = _procfs.read_stat(leader.pid)
        known = leader._start
        assert leader.reap()
        if known is not None:
            break
    assert known is not None
    assert info is not None
    assert known == info.start
    assert leader.start == known


def test_a_wait_from_another_thread_survives_the_pidfd_being_closed_and_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drop-in's Popen.wait() blocks a thread of the caller's on the leader's pidfd
    while the trio thread may reap the leader and close that pidfd, and a new descriptor
    may take its number at once. The wait is on a duplicate taken before: it sees the
    exit, not the readiness of whatever file now has the number."""
    from conftest import MARKER
    from trio_procown import _pidfd

    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        env = [k + b"=" + v for k, v in os.environb.items()]
        leader = Leader.spawn(
            ["/bin/sh", "-c", "read x; exit 0", MARKER], stdin=r, stdout=null, stderr=null, cwd=None, env=env
        )
    finally:
        os.close(null)
        os.close(r)
    number = leader.pidfd
    reused: list[int] = []
    real_wait = _pidfd.wait_all_exited

    def race(pidfds: list[int], timeout: float) -> bool:
        # What the trio thread may do between the check and the wait: the command ends,
        # is reaped, its pidfd closed, and a pipe (never readable) takes the number.
        os.close(w)
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)
        assert leader.reap()
        assert number is not None
        pr, pw = os.pipe()
        reused.extend((pr, pw, os.dup2(pr, number)))
        return real_wait(pidfds, timeout)

    monkeypatch.setattr(_pidfd, "wait_all_exited", race)
    try:
        assert leader.block_until_exited(5.0) is True
        assert leader.returncode == 0
        assert reused  # the race happened as described: the number was taken again
    finally:
        for fd in reused:
            os.close(fd)
