# The census: finding processes that left the domain.
#
# Every owned command gets a unique cookie in its environment
# (TRIO_PROCOWN_COOKIE=<random>), which descendants inherit unless they
# scrub their environment, the way Jenkins' process-tree killer finds the
# processes of a build. At teardown the census lists live processes that
# carry the cookie but are not inside the domain: they called setsid() or
# setpgid(), or were double-forked into daemons. Under the "terminate"
# policy they get the same TERM / grace / KILL ladder as the domain, through
# pidfds re-verified after opening, so a recycled pid is never signalled;
# under "report" they are only listed. Either way, any still alive at the end
# are named in receipt.escaped.
#
# The census cannot see a descendant that removed the cookie from its
# environment; receipts say "found by the census", never "none escaped".

from __future__ import annotations

import os
import secrets
import signal
from typing import Literal

from . import _pidfd, _procfs
from ._domain import Domain, wait_for_processes
from ._procfs import ProcessTable, ProcInfo
from ._receipt import ProcessRecord

COOKIE_VAR = "TRIO_PROCOWN_COOKIE"
EscapeePolicy = Literal["terminate", "report"]


class Census:
    """The cookie of one owned command and the escapees found with it."""

    def __init__(self, policy: EscapeePolicy) -> None:
        if policy not in ("terminate", "report"):
            msg = f"escapees must be 'terminate' or 'report', not {policy!r}"
            raise ValueError(msg)
        self.policy = policy
        self.value = secrets.token_hex(12)
        self.entry = f"{COOKIE_VAR}={self.value}".encode()
        self.found: dict[int, ProcessRecord] = {}  # every escapee seen, by pid
        self._signalled: set[int] = set()

    def scan(self, domain: Domain, table: ProcessTable) -> list[ProcInfo]:
        """Live processes carrying our cookie that are outside the domain."""
        leader = domain.leader
        since = leader.start if leader is not None else 0
        skip = domain.pgid_inside()
        hits = table.carrying(self.entry, since, skip)
        if not hits:
            return []
        outside = []
        for hit in hits:
            if domain.contains(hit.pid):
                continue
            # Alive *after* the membership check: it was outside then (a
            # process cannot re-enter the domain, nor come back to life).
            now = _procfs.read_stat(hit.pid)
            if now is not None and not now.zombie:
                outside.append(now)
        for info in outside:
            if info.pid not in self.found:
                self.found[info.pid] = ProcessRecord(info.pid, _procfs.cmdline(info.pid), "found")
        return outside

    def still_marked(self, info: ProcInfo) -> bool:
        now = _procfs.read_stat(info.pid)
        return now is not None and not now.zombie and _procfs.has_cookie(info.pid, self.entry)

    def signal(self, escapees: list[ProcInfo], sigs: tuple[int, ...]) -> int:
        """Send `sigs` to each escapee through a verified pidfd; count reached."""
        reached = 0
        for info in escapees:
            fd = _pidfd.open_pidfd(info.pid)
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
            finally:
                if fd is not None:
                    _pidfd.close(fd)
            reached += 1
            self._signalled.add(info.pid)
            fate = "killed" if signal.SIGKILL in sigs else "terminated"
            old = self.found.get(info.pid)
            self.found[info.pid] = ProcessRecord(info.pid, old.cmdline if old else "", fate)
        return reached

    def unsignalled(self, escapees: list[ProcInfo]) -> list[ProcInfo]:
        """The escapees that have not been signalled yet."""
        return [e for e in escapees if e.pid not in self._signalled]

    async def wait_gone(self, escapees: list[ProcInfo]) -> None:
        await wait_for_processes(escapees, self.still_marked)

    def records(self) -> tuple[ProcessRecord, ...]:
        return tuple(self.found[pid] for pid in sorted(self.found))
