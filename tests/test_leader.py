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
    """The start time is read when first asked for (not inside the spawn, while the child is
    still in its execve), from the leader itself: the exited, unreaped leader still shows it."""
    leader = _spawn_true()
    try:
        assert leader._start is None  # nothing read yet
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        info = _procfs.read_stat(leader.pid)
        assert info is not None
        assert leader.start == info.start != 0
    finally:
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)
        assert leader.reap()


def test_start_time_unknown_once_reaped() -> None:
    """Asked for only after the reap, the start time is unknown (0), never read from whatever
    process got the pid since."""
    leader = _spawn_true()
    os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)
    assert leader.reap()
    assert leader.start == 0
