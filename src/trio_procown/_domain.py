# Ownership domains: what holds every process an owned command starts.
#
# A domain is driven by the teardown (_command.py) through a small interface:
# prepare the spawn, attach the spawned leader, signal gracefully, force,
# wait until empty, list what is left, release. The process group below is
# the portable domain; the cgroup v2 domain lives in _cgroup.py; later ones
# (a Windows Job Object, a container, a remote lease) implement the same
# methods and the teardown does not change.
#
# Process group. The command starts in a new session, so its leader's pid is
# also its session and process-group id. The leader stays unreaped until the
# teardown is over (see _leader.py), which keeps that id from being recycled:
# killpg() on it can only reach our command's group. A member that calls
# setsid() or setpgid() leaves the group; the census finds it.
#
# "Empty" means no *live* member: zombies count as dead, because an orphan's
# zombie waits for PID 1 to reap it (up to ~2 s on these machines) and the
# teardown must not wait on somebody else's reaping. Waiting is event driven:
# we open a pidfd per live member (they become readable at exit), wait for
# them, then scan again for members forked meanwhile, until a scan finds none.

from __future__ import annotations

import abc
import errno
import functools
import os
import signal
from collections.abc import Callable, Sequence
from typing import NamedTuple

import trio

from . import _clock, _pidfd, _procfs
from ._errors import DomainUnavailable as DomainUnavailable
from ._leader import Leader
from ._procfs import ProcessTable, ProcInfo
from ._receipt import signame

# While waiting for a member to exit, how often to check that it is still a
# member.
RECHECK_INTERVAL = 0.05


def signal_names(sigs: tuple[int, ...]) -> str:
    """ "SIGTERM+SIGCONT"; "no signal" for an empty stage (GNU timeout's -s 0)."""
    return "+".join(signame(s) for s in sigs) or "no signal"


def describe_error(exc: OSError) -> str:
    """An OSError as its errno name and message: "EPERM (Operation not permitted)"."""
    name = errno.errorcode.get(exc.errno or 0, "error")
    return f"{name} ({exc.strerror or exc})"


class Sent(NamedTuple):
    """What one signalling action of the teardown did, and what the OS
    refused (`failed`, "" when nothing was). A refusal never stops the
    teardown: it becomes evidence in the receipt."""

    detail: str
    failed: str = ""


# Ends the detail of a signal step the caller asked for (OwnedCommand.signal_domain),
# not one of the teardown's stages.
BY_THE_CALLER = ", sent by the caller"


def unchanged(sent: Sent) -> Sent:
    """A second stage that adds nothing (see Domain.graceful_stages)."""
    return sent


class Domain(abc.ABC):
    """An ownership domain for one owned command (one instance per command)."""

    kind: str = ""
    # Whether the domain may still be ending after its leader exited with
    # no member of it left in sight (a Slurm job is COMPLETING for a moment
    # after srun exits): the teardown then awaits settle() before it calls
    # the domain empty.
    settles: bool = False

    def __init__(self) -> None:
        self.leader: Leader | None = None
        self._started = 0.0
        # Every member seen by a scan (the leader excluded), pid -> start
        # time: zombies are looked for among them at the end, since a
        # cgroup's listing never shows zombies; the start time tells a
        # member from a stranger that got its pid later.
        self.seen: dict[int, int] = {}

    # -- lifecycle ----------------------------------------------------------
    def prepare(self, argv: Sequence[str]) -> list[str]:
        """The argv to spawn so that the command starts inside the domain."""
        return list(argv)

    def command_line(self, argv: Sequence[str], name: str) -> tuple[str, list[str]]:
        """The program to execute and its argv, so that the command starts
        inside the domain; `argv[0]` is the program's path and `name` what
        the caller called it (the command's argv[0] where the domain can
        keep it, as execvp does: `ls: cannot access ...`, not `/usr/bin/ls`)."""
        args = self.prepare(argv)
        if args == list(argv):
            return args[0], [name, *args[1:]]
        return args[0], args

    def spawn_cgroup_fd(self) -> int | None:
        """A cgroup directory, open, to create the leader in (clone3's
        CLONE_INTO_CGROUP), or None: spawn as prepared."""
        return None

    def attach(self, leader: Leader, started: float) -> None:
        """Take hold of the spawned leader."""
        self.leader = leader
        self._started = started

    def abort_spawn(self) -> None:
        """Undo prepare() after a failed spawn."""
        self.release()

    @property
    @abc.abstractmethod
    def ident(self) -> str:
        """What identifies the domain: a pgid, a cgroup path."""

    # -- teardown -----------------------------------------------------------
    @abc.abstractmethod
    def members(self, snap: list[ProcInfo] | None = None) -> list[ProcInfo]:
        """Processes of the domain other than the leader, zombies included.

        `snap` is a process-table snapshot the caller already took, if any.
        """

    @abc.abstractmethod
    def signal_graceful(self, sigs: tuple[int, ...] = (signal.SIGTERM, signal.SIGCONT)) -> Sent:
        """Send `sigs` (by default SIGTERM then SIGCONT) to every member;
        describe what was sent.
        Never raises for a refused signal: that is reported in the result."""

    def graceful_stages(self, sigs: tuple[int, ...]) -> tuple[Callable[[], Sent], Callable[[Sent], Sent]]:
        """signal_graceful(sigs) in two stages, for a teardown that sends
        the first from the signaller thread: `first()` reaches most members
        in a few system calls (a process group's signal); `then(sent)`, run
        on the event loop with the first stage's evidence, does the rest
        (members found by listing, each a few more system calls that would
        queue behind the loop for the interpreter lock) and returns the
        evidence of the whole. By default the first stage is the whole."""
        return functools.partial(self.signal_graceful, sigs), unchanged

    @abc.abstractmethod
    def force(self) -> Sent:
        """Kill every member with SIGKILL; describe what was done. Never
        raises for a refused signal or write: that is reported."""

    @abc.abstractmethod
    def is_empty(self, snap: list[ProcInfo] | None = None) -> bool:
        """True when no live process (leader included) is in the domain."""

    @abc.abstractmethod
    async def wait_empty(self, hint: list[ProcInfo] | None = None) -> ProcessTable | None:
        """Wait until is_empty(); the caller's cancel scope bounds it.

        `hint` is a recent process-table snapshot: members alive in it are
        waited for before the domain is scanned again. Returns the scan that
        showed the domain empty, if one was taken (callers may reuse it).
        """

    def read_failures(self) -> list[str]:
        """Reads of the domain's own state that failed (each is evidence)."""
        return []

    def placement_pending(self) -> bool:
        """True while verify() could not yet decide."""
        return False

    def verify(self) -> str:
        """Check that the leader is held by the domain as intended; a
        sentence for the receipt when it is not (or not provably), else ""."""
        return ""

    def left(self) -> str:
        """After a teardown that signalled: did a leader the domain held
        leave it meanwhile? A sentence for the receipt if so, else ""."""
        return ""

    def pgid_inside(self) -> int:
        """A process group wholly inside this domain (-1 if none): the
        census need not read its members."""
        return -1

    def empties_without_scan(self) -> bool:
        """Does wait_empty() learn that the domain is empty without a scan
        of the process table (the kernel says so)?"""
        return False

    @property
    def escape_evidence(self) -> str:
        """How processes that left the domain are known (receipt field):
        "census" unless the kernel keeps them in (see CgroupDomain)."""
        return "census"

    def contains(self, pid: int) -> bool:
        """Is the process `pid` inside the domain right now? (read fresh)"""
        return any(m.pid == pid for m in self.members()) or (
            self.leader is not None and self.leader.pid == pid
        )

    def release(self) -> str:
        """Give back what the domain held (e.g. remove the cgroup)."""
        return ""

    # -- shared helpers -----------------------------------------------------
    def live_members(self, snap: list[ProcInfo] | None = None) -> list[ProcInfo]:
        members = self.members(snap)
        return [m for m in members if not m.zombie] if members else []

    async def settle(self, within: float) -> None:  # noqa: B027 (a default that does nothing)
        """Wait, at most `within` seconds, until the domain has ended after
        its leader's exit with nothing of it left in sight (see settles)."""


def own_group(leader: Leader) -> int:
    """The process group a leader spawned in a new session leads (its pid);
    refuses one that is the caller's own or init's."""
    pgid = leader.pid
    if pgid == os.getpgrp() or pgid <= 1:
        msg = f"refusing to own process group {pgid}: it is the caller's own"
        raise RuntimeError(msg)
    return pgid


class ProcessGroupDomain(Domain):
    """The command's own session and process group (POSIX)."""

    kind = "process-group"

    def __init__(self) -> None:
        super().__init__()
        self.pgid = 0

    def attach(self, leader: Leader, started: float) -> None:
        super().attach(leader, started)
        self.pgid = own_group(leader)

    @property
    def ident(self) -> str:
        return f"pgid {self.pgid}"

    def members(self, snap: list[ProcInfo] | None = None) -> list[ProcInfo]:
        leader_pid = self.leader.pid if self.leader else None
        if snap is None:
            snap = _procfs.snapshot(self.leader.mark if self.leader else None)
        elif not snap:
            return []  # (a quiet table, see _procfs.quiet_since)
        group = snap.in_group(self.pgid) if isinstance(snap, _procfs.Rows) else snap
        found = [m for m in group if m.pgrp == self.pgid and m.pid != leader_pid]
        self.seen.update((m.pid, m.start) for m in found)
        return found

    def pgid_inside(self) -> int:
        return self.pgid

    def contains(self, pid: int) -> bool:
        info = _procfs.read_stat(pid)
        return info is not None and info.pgrp == self.pgid

    def _killpg(self, sig: int) -> bool:
        # The leader is unreaped for the whole teardown (see module comment),
        # so the id cannot have been recycled; still refuse our own group.
        # A leader reaped by someone else (lost: the program ignores
        # SIGCHLD, say) no longer holds it, but each member left in the
        # group does: the id is handed out again only once the group is
        # empty and the pid counter has gone round pid_max since, so its
        # members are still signalled.
        # Raises OSError (EPERM, ...) for the caller to record.
        leader = self.leader
        assert leader is not None
        return killpg_owned(self.pgid, sig) if not leader.reaped or leader.lost else False

    def _send_group(self, sigs: tuple[int, ...]) -> Sent:
        detail = f"{signal_names(sigs)} to process group {self.pgid}"
        sent = False
        failed = []
        for sig in sigs:
            try:
                sent = self._killpg(sig) or sent
            except OSError as exc:
                failed.append(f"{signame(sig)}: {describe_error(exc)}")
        if not sent and not failed:
            detail += " (no process)"
        return Sent(detail, "; ".join(failed))

    def signal_graceful(self, sigs: tuple[int, ...] = (signal.SIGTERM, signal.SIGCONT)) -> Sent:
        return self._send_group(sigs)

    def force(self) -> Sent:
        return self._send_group((signal.SIGKILL,))

    def is_empty(self, snap: list[ProcInfo] | None = None) -> bool:
        assert self.leader is not None
        return not self.leader.alive and not self.live_members(snap)

    async def wait_empty(self, hint: list[ProcInfo] | None = None) -> ProcessTable | None:
        assert self.leader is not None
        if hint is not None:
            await wait_for_processes(
                self.live_members(hint), functools.partial(_still_in_group, pgid=self.pgid)
            )
        while True:
            await self.leader.wait()
            await trio.lowlevel.checkpoint()  # the bound (the caller's scope) can always fire
            known = 0 if self.leader.reaped else self.leader.pid  # held unreaped: its pid is its own
            table = await _procfs.table_for(self.leader.mark, known=known)
            live = self.live_members(table.rows)
            if not live:
                return table
            await wait_for_processes(live, lambda info: _still_in_group(info, self.pgid))


def killpg_owned(pgid: int, sig: int) -> bool:
    """killpg() for a group we own, never our own group; False if the group
    has no process. Other errors (EPERM) propagate for the caller to record."""
    if pgid <= 1 or pgid == os.getpgrp():
        return False
    fn = _libc_killpg()
    if fn is not None and os.killpg is _OS_KILLPG:
        import ctypes

        if fn(pgid, sig) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.ESRCH:
            return False
        raise OSError(err, os.strerror(err))
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


_OS_KILLPG = os.killpg


@functools.cache
def _libc_killpg() -> Callable[[int, int], int] | None:
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).killpg
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _still_in_group(info: ProcInfo, pgid: int) -> bool:
    now = _procfs.read_stat(info.pid)
    return now is not None and now.pgrp == pgid and not now.zombie


def _gone(verify: Callable[[ProcInfo], bool], info: ProcInfo) -> bool:
    return not verify(info)


async def wait_for_processes(procs: Sequence[ProcInfo], verify: Callable[[ProcInfo], bool]) -> None:
    """Wait until each of `procs` has terminated (zombie or gone).

    `verify(info)` is checked after the pidfd is opened, so the handle is
    known to name the process we scanned and not a recycled pid.
    """
    for info in procs:
        try:
            fd = _pidfd.open_pidfd(info.pid)
        except OSError:  # EMFILE, say: no handle, so poll instead
            fd = None
        if fd is None:
            # Gone (ESRCH), or no handle could be had: poll while it is
            # still there (poll_until checkpoints, so a caller's loop
            # always yields and its cancel scope can fire).
            await _pidfd.poll_until(functools.partial(_gone, verify, info))
            continue
        try:
            # Most members are gone by the time we look: poll before paying
            # for a wait (a scheduling round trip each).
            # Re-check membership now and then: a member that leaves the
            # domain while we wait (setsid in its SIGTERM handler, say) is
            # no longer the domain's to wait for; the census takes it over.
            while not _pidfd.exited(fd) and verify(info):
                with _clock.after(RECHECK_INTERVAL):
                    await _pidfd.wait_exited(fd)
        finally:
            _pidfd.close(fd)
