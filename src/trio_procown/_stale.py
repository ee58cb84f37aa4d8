# Stale domains: procown-* cgroups whose owner is gone.
#
# A cgroup outlives its owner when the owner died and nothing ended its
# command: no keeper (opted out, or killed with its owner, see _keeper.py),
# or a library from before the keeper. Such a cgroup keeps whatever still
# runs in it, and its directory, forever.
#
# Whose is it? The name says: a command's domain is
# procown-<owner pid>-<n>-<random>-s<owner start time>; the start time (clock
# ticks since boot, as in /proc/PID/stat) tells the owner from a later
# process that got its pid. The owner is gone when no process has that pid
# and start time (a zombie counts as gone: it ends nothing). Names without a
# start time (made before it was recorded, and the leak check's windows and
# probes, procown-test-<pid>-..., procown-probe-<pid>-...) are stale only
# when no process with that pid exists at all. Names that match none of
# these are not ours to judge and are left alone. Pids are read in our own
# pid namespace: an owner in another pid namespace that shares this cgroup
# tree (without a cgroup namespace of its own) would be misjudged.
#
# Where: the library's sweep looks only at the children of the root it is
# about to use; `procown doctor` at TRIO_PROCOWN_CGROUP_ROOT's subtree if
# set, else at the whole cgroup v2 tree (not inside a stale one: it is
# ended whole).
#
# Ending a stale domain is the keeper's ladder (_keeper.end_domains) on its
# cgroup only: SIGTERM+SIGCONT to each member through pidfds, grace,
# cgroup.kill, a bounded wait, then rmdir, deepest first. `procown doctor
# --clean` gives the library's default grace; the library's own sweep, at
# the first use of a cgroup root in a process, gives SWEEP_GRACE and
# SWEEP_KILL_WAIT so that it stays bounded (and cheap: a directory listing
# when nothing is stale).

from __future__ import annotations

import functools
import os
import re
from typing import NamedTuple

from . import _keeper

SWEEP_GRACE = 0.2
SWEEP_KILL_WAIT = 0.2

_NAMES = (
    (re.compile(r"procown-(\d+)-\d+-[0-9a-f]+(?:-s(\d+))?"), "command domain"),
    (re.compile(r"procown-(?:test|session|block)-(\d+)-[0-9a-f]+()"), "leak-check window"),
    (re.compile(r"procown-(?:pytest-)?probe-(\d+)-[0-9a-f]+()"), "probe"),
)

_swept: set[str] = set()


def cgroup_name(n: int) -> str:
    """The name of this process's `n`-th command cgroup (module comment)."""
    pid = os.getpid()
    return f"procown-{pid}-{n}-{os.urandom(3).hex()}{_owner_suffix(pid)}"


@functools.cache
def _owner_suffix(pid: int) -> str:
    """ "-s<our start time>" (keyed by pid: a forked child has its own)."""
    start = _keeper.process_start(pid)
    return f"-s{start}" if start else ""


def parse(name: str) -> tuple[str, int, int] | None:
    """What a procown-* cgroup name says: (what, owner pid, owner start or
    0); None for a name that is not ours."""
    for pattern, what in _NAMES:
        match = pattern.fullmatch(name)
        if match:
            return what, int(match[1]), int(match[2] or 0)
    return None


def owner_gone(pid: int, start: int) -> bool:
    """Is the owner `pid` (started at `start`, 0: unknown) gone?"""
    row = _keeper.stat(pid)
    if row is None:
        return True
    if not start:
        return False  # no start time to compare: a live pid may still be the owner
    return row.zombie or row.start != start


class StaleDomain(NamedTuple):
    """A procown-* cgroup whose owner is gone."""

    path: str
    what: str  # "command domain", "leak-check window", "probe"
    owner: int
    owner_start: int  # 0: not recorded in the name
    pids: tuple[int, ...]  # processes in it (its subtree) when found

    def describe(self) -> str:
        owner = f"pid {self.owner}" + (f" started at tick {self.owner_start}" if self.owner_start else "")
        running = f"{len(self.pids)} process(es) still in it" if self.pids else "empty"
        return f"{self.path}: {self.what} of {owner}, which is gone; {running}"


def find(top: str, *, deep: bool = True) -> list[StaleDomain]:
    """The stale procown-* cgroups under `top` (its children, and with
    `deep` their descendants too, except inside a stale one)."""
    found = []
    stack = [top]
    while stack:
        where = stack.pop()
        try:
            entries = sorted(e.name for e in os.scandir(where) if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
        for name in entries:
            path = os.path.join(where, name)
            parsed = parse(name)
            if parsed is not None and owner_gone(parsed[1], parsed[2]):
                what, owner, start = parsed
                found.append(StaleDomain(path, what, owner, start, tuple(_keeper.tree_pids(path))))
            elif deep:
                stack.append(path)
    return sorted(found, key=lambda s: s.path)


def clean(stale: list[StaleDomain], grace: float, kill_wait: float) -> list[str]:
    """End every process of `stale` (the keeper's ladder) and remove the
    cgroups; per domain, "removed" or "NOT removed: ..."."""
    entries = [_keeper.Entry(grace, cgroup=s.path) for s in stale]
    return _keeper.end_domains(entries, kill_wait) if entries else []


def remove_empty(root: str) -> list[str]:
    """Remove the empty stale command cgroups directly under `root` (rmdir
    only: nothing is signalled); the paths removed."""
    removed = []
    for stale in find(root, deep=False):
        if stale.what != "command domain" or stale.pids:
            continue
        try:
            os.rmdir(stale.path)
        except OSError:
            continue  # (a child cgroup of its own, or a member that came meanwhile: the sweep's)
        removed.append(stale.path)
    return removed


def sweep_once(root: str) -> None:
    """At the first use of `root` in this process: end and remove the stale
    command cgroups directly under it, bounded by SWEEP_GRACE +
    SWEEP_KILL_WAIT. Never raises."""
    if root in _swept:
        return
    _swept.add(root)
    try:
        clean(find(root, deep=False), SWEEP_GRACE, SWEEP_KILL_WAIT)
    except Exception:  # a sweep that fails leaves them for `procown doctor --clean`
        pass
