# Process trees for the teardown benchmarks, and reading receipts.
#
# A tree is one Python leader (started with -S, stdlib only) that forks
# `n` descendants with at most `fanout` children per process (fanout >= n
# gives the flat "leader forks n children" shape; a small fanout gives a
# deeper tree whose inner nodes become orphans when their parents die, the
# case a process-group teardown must get right). Every descendant reports
# its pid on a shared pipe once its own subtree is complete; the leader
# prints "ready <pid> <pid> ..." only when all n have reported, so a
# benchmark knows the whole tree exists before it starts a teardown.
# All members then sleep forever: the default SIGTERM action ends them, or,
# with `ignore`, SIGTERM is ignored (inherited through fork) and only SIGKILL
# works. With `gate`, the leader waits for one byte (or EOF) on stdin before
# forking, so a caller can move it into a cgroup first.

from __future__ import annotations

import sys
from collections.abc import Sequence

import trio_procown

TREE_SOURCE = r"""
import os, signal, struct, sys, time
n, fanout = int(sys.argv[1]), int(sys.argv[2])
ignore, gate = sys.argv[3] == "1", sys.argv[4] == "1"
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if gate:
    os.read(0, 1)
r, w = os.pipe()

def park():
    while True:
        time.sleep(3600)

def grow(count):
    kids = min(fanout, count)
    rest = count - kids
    for i in range(kids):
        share = rest // kids + (1 if i < rest % kids else 0)
        if os.fork() == 0:
            grow(share)
            os.write(w, struct.pack("i", os.getpid()))
            park()

grow(n)
buf = b""
while len(buf) < 4 * n:
    buf += os.read(r, 4 * n - len(buf))
pids = struct.unpack("%di" % n, buf)
sys.stdout.write("ready " + " ".join(map(str, pids)) + "\n")
sys.stdout.flush()
park()
"""


def tree_argv(
    n: int, fanout: int | None = None, *, ignore_term: bool = False, gate: bool = False
) -> list[str]:
    """argv of a tree with a leader and `n` descendants."""
    fan = n if fanout is None else fanout
    return [
        sys.executable,
        "-S",
        "-c",
        TREE_SOURCE,
        str(n),
        str(max(fan, 1)),
        "1" if ignore_term else "0",
        "1" if gate else "0",
    ]


def ready_pids(stdout: bytes) -> list[int] | None:
    """The descendant pids from the ready line, or None if it never came."""
    for line in stdout.splitlines():
        if line.startswith(b"ready"):
            return [int(x) for x in line.split()[1:]]
    return None


def steps_of(receipt: trio_procown.Receipt) -> Sequence[trio_procown.Step]:
    return receipt.steps


def first_step(receipt: trio_procown.Receipt, action: str, *, contains: str = "") -> trio_procown.Step | None:
    for step in receipt.steps:
        if step.action.value == action and contains in step.detail:
            return step
    return None


def force_to_empty(receipt: trio_procown.Receipt) -> float | None:
    """Seconds from the SIGKILL step to the next domain wait that ended
    'empty', or None if the receipt shows no such pair."""
    kill_at = None
    for step in receipt.steps:
        if kill_at is None:
            if (
                step.action.value == "signal"
                and step.target == "domain"
                and ("SIGKILL" in step.detail or "cgroup.kill" in step.detail)
            ):
                kill_at = step.at
        elif step.action.value == "wait" and step.target == "domain":
            return step.at - kill_at if step.outcome == "empty" else None
    return None


def graceful_to_empty(receipt: trio_procown.Receipt) -> float | None:
    """Seconds from the SIGTERM step to the next domain wait, if 'empty'."""
    term_at = None
    for step in receipt.steps:
        if term_at is None:
            if step.action.value == "signal" and step.target == "domain" and "SIGTERM" in step.detail:
                term_at = step.at
        elif step.action.value == "wait" and step.target == "domain":
            return step.at - term_at if step.outcome == "empty" else None
    return None


def phases(receipt: trio_procown.Receipt) -> dict[str, float]:
    """Times (s since spawn) of the teardown's landmarks found in the steps:
    stop, term (SIGTERM sent), kill (SIGKILL sent), empty (last domain wait
    that ended 'empty'), eof (output wait that ended 'eof'), and receipt
    (receipt.duration)."""
    out: dict[str, float] = {"receipt": receipt.duration}
    for step in receipt.steps:
        action = step.action.value
        if action == "stop":
            out.setdefault("stop", step.at)
        elif action == "signal" and step.target == "domain":
            if "SIGTERM" in step.detail:
                out.setdefault("term", step.at)
            elif "SIGKILL" in step.detail or "cgroup.kill" in step.detail:
                out.setdefault("kill", step.at)
        elif action == "wait" and step.target == "domain" and step.outcome == "empty":
            out["empty"] = step.at
        elif action == "wait" and step.target == "output" and step.outcome == "eof":
            out["eof"] = step.at
    return out


def span(ph: dict[str, float], start: str, end: str) -> float | None:
    if start in ph and end in ph:
        return ph[end] - ph[start]
    return None
