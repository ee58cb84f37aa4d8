# The census: finding processes that left the domain.
#
# Every owned command gets a unique token in its environment
# (TRIO_PROCOWN_COOKIE), which descendants inherit unless they scrub their
# environment, the way Jenkins' process-tree killer finds the processes of a
# build. Owners nest: a command may itself own commands (a test runner
# under a CI harness, both using this library), so the variable holds a
# ":"-separated chain, each owner appending its token to the chain it
# inherited; every enclosing owner still finds what its command started.
#
# At teardown the census lists live processes that carry our token but are
# not inside the domain: they called setsid() or setpgid(), or were
# double-forked into daemons. The leader is never one of them, even when it
# is caught before it entered its domain (the cgroup shim has not written
# itself into cgroup.procs yet): the domain signals and waits for the leader
# itself. Under the "terminate" policy escapees get the same TERM / grace /
# KILL ladder as the domain, through pidfds re-verified after opening, so a
# recycled pid is never signalled; under "report" they are only listed.
# Either way, any still alive at the end are named in receipt.escaped.
#
# The census cannot see a descendant that removed the token from its
# environment, nor one whose environment we may not read (a setuid program
# run by an unprivileged owner); receipts say "found by the census", never
# "none escaped", and say when some environments could not be read.

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Mapping
from typing import Literal

from . import _pidfd, _procfs
from ._domain import Domain, wait_for_processes
from ._fates import Fates
from ._procfs import ProcessTable, ProcInfo
from ._receipt import ProcessRecord, signame

COOKIE_VAR = "TRIO_PROCOWN_COOKIE"
EscapeePolicy = Literal["terminate", "report"]

_KEY = COOKIE_KEY = f"{COOKIE_VAR}=".encode()  # as the process table is asked about it


class Census:
    """The token of one owned command and the escapees found with it."""

    def __init__(self, policy: EscapeePolicy, inherited: str | None = None) -> None:
        if policy not in ("terminate", "report"):
            msg = f"escapees must be 'terminate' or 'report', not {policy!r}"
            raise ValueError(msg)
        self.policy = policy
        self.token = os.urandom(12).hex()  # secrets.token_hex, without its import
        # The chain the command's environment carries: the owners' above us
        # first, ours last.
        self.value = f"{inherited}:{self.token}" if inherited else self.token
        self._token = self.token.encode()
        self.fates = Fates()
        self.found: set[int] = set()  # every escapee seen
        self.unreadable: set[int] = set()  # environments we could not read
        self._signalled: set[int] = set()
        self.failures: list[str] = []  # signals the OS refused

    @staticmethod
    def inherited(*envs: Mapping[str, str] | None) -> str | None:
        """The chain of enclosing owners' tokens found in `envs`, merged."""
        tokens: list[str] = []
        for env in envs:
            if env is None:
                continue
            for token in env.get(COOKIE_VAR, "").split(":"):
                if token and token not in tokens:
                    tokens.append(token)
        return ":".join(tokens) or None

    def scan(self, domain: Domain, table: ProcessTable) -> list[ProcInfo]:
        """Live processes carrying our token that are outside the domain."""
        leader = domain.leader
        since = leader.start if leader is not None else 0
        leader_pid = leader.pid if leader is not None else -1
        skip = domain.pgid_inside()
        hits = table.carrying(_KEY, self._token, since, skip, self.unreadable)
        if not hits:
            return []
        outside = []
        for hit in hits:
            if hit.pid == leader_pid or domain.contains(hit.pid):
                continue
            # Alive *after* the membership check: it was outside then (a
            # process cannot re-enter the domain, nor come back to life).
            now = _procfs.read_stat(hit.pid)
            if now is not None and not now.zombie:
                outside.append(now)
        for info in outside:
            self.found.add(info.pid)
            self.fates.watch(info)
        return outside

    def still_marked(self, info: ProcInfo) -> bool:
        now = _procfs.read_stat(info.pid)
        return now is not None and not now.zombie and _procfs.has_token(info.pid, _KEY, self._token)

    def signal(self, escapees: list[ProcInfo], sigs: tuple[int, ...]) -> int:
        """Send `sigs` to each escapee through a verified pidfd; count reached.

        A signal the OS refuses (EPERM) is recorded in `failures` and the
        next escapee is tried: a failure is evidence, never a stop."""
        reached = 0
        self.fates.before_signal({e.pid for e in escapees}, kill=signal.SIGKILL in sigs)
        for info in escapees:
            try:
                fd = _pidfd.open_pidfd(info.pid)
            except OSError as exc:
                self._failed(info.pid, sigs, exc)
                continue
            try:
                if fd is None:
                    if _pidfd.HAVE_PIDFD or not self.still_marked(info):
                        continue
                    for sig in sigs:
                        os.kill(info.pid, sig)
                elif self.still_marked(info):
                    for sig in sigs:
                        _pidfd.send(fd, sig)
                else:
                    continue
            except ProcessLookupError:
                continue
            except OSError as exc:
                self._failed(info.pid, sigs, exc)
                continue
            finally:
                if fd is not None:
                    _pidfd.close(fd)
            reached += 1
            self._signalled.add(info.pid)
        return reached

    def _failed(self, pid: int, sigs: tuple[int, ...], exc: OSError) -> None:
        names = "+".join(signame(s) for s in sigs)
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.failures.append(f"{names} to escapee {pid}: {code} ({exc.strerror})")

    def unsignalled(self, escapees: list[ProcInfo]) -> list[ProcInfo]:
        """The escapees that have not been signalled yet."""
        return [e for e in escapees if e.pid not in self._signalled]

    async def wait_gone(self, escapees: list[ProcInfo]) -> None:
        await wait_for_processes(escapees, self.still_marked)

    def records(self) -> tuple[ProcessRecord, ...]:
        """Every escapee found, with the fate its own evidence shows."""
        return tuple(self.fates.record(pid) for pid in sorted(self.found))
