# Raw references for the teardown benchmarks: the same process trees torn
# down without the library, with the fewest syscalls that still *prove* the
# tree is gone. They give the kernel's own cost (how long 50 Python
# processes take to die), measured in the same run as the library, so the
# library's overhead is the difference and not a guess.
#
#   raw_killpg: killpg(sig) on the tree's process group, then poll() on
#     pidfds of the leader and every descendant until all have exited.
#   raw_cgroup_kill: the leader is moved into a fresh child cgroup before it
#     forks (it waits on stdin for the go), then "1" is written to cgroup.kill
#     and cgroup.events is poll()ed (POLLPRI) until "populated 0".
# Both start their clock just before the kill call.

from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import time

from ._trees import ready_pids, tree_argv

_counter = itertools.count()


def _wait_pidfds(fds: list[int]) -> None:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left = set(fds)
    while left:
        for fd, _ev in poller.poll(5000):
            poller.unregister(fd)
            left.discard(fd)


def raw_killpg(n: int, *, ignore_term: bool, sig: int, problems: list[str]) -> float:
    """killpg(sig) of a tree of `n` descendants, until every member exited."""
    argv = tree_argv(n, ignore_term=ignore_term)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    pids = ready_pids(proc.stdout.readline()) or []
    fds = [os.pidfd_open(pid) for pid in [proc.pid, *pids]]
    try:
        start = time.perf_counter()
        os.killpg(proc.pid, sig)
        _wait_pidfds(fds)
        elapsed = time.perf_counter() - start
    finally:
        for fd in fds:
            os.close(fd)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    if len(pids) != n:
        problems.append(f"raw killpg: tree not ready ({len(pids)} pids)")
    return elapsed


def raw_cgroup_kill(root: str, tag: str, n: int, problems: list[str]) -> float:
    """cgroup.kill of a fresh child cgroup holding a tree of `n`
    descendants (ignoring SIGTERM), until 'populated 0'."""
    path = os.path.join(root, f"bench-{tag}-{next(_counter)}")
    os.mkdir(path)
    argv = tree_argv(n, ignore_term=True, gate=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdin is not None
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        proc.stdin.write(b"g")  # the leader forks only now, inside the cgroup
        proc.stdin.close()
        pids = ready_pids(proc.stdout.readline()) or []
        events = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY)
        try:
            poller = select.poll()
            poller.register(events, select.POLLPRI)
            os.read(events, 4096)
            start = time.perf_counter()
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
            while b"populated 0" not in os.pread(events, 4096, 0):
                poller.poll(5000)
            elapsed = time.perf_counter() - start
        finally:
            os.close(events)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        try:
            os.rmdir(path)
        except OSError as exc:
            problems.append(f"raw cgroup: rmdir {path}: {exc}")
    if len(pids) != n:
        problems.append(f"raw cgroup: tree not ready ({len(pids)} pids)")
    return elapsed
