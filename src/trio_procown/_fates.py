# What became of each process a receipt names, from that process's own
# evidence.
#
# A receipt names processes of two kinds: members that outlived a leader
# that exited by itself (leftovers), and processes the census found outside
# the domain (escapees). "The teardown was forced" says nothing about one of
# them: SIGTERM may have ended it long before SIGKILL was sent to whatever
# remained. So each named process is watched on its own (pid plus start
# time, so a recycled pid is never mistaken for it) and its liveness is
# recorded at the two moments that matter, just before the graceful signal
# and just before the kill. Its fate is then the weakest statement that
# evidence supports:
#
#   alive       still alive (not a zombie) at the end
#   killed      alive when SIGKILL was sent to it, gone at the end
#   terminated  alive when SIGTERM was sent to it, gone before SIGKILL was
#   exited      gone before anything was sent to it
#
# "killed" is the honest reading of "alive at SIGKILL, gone after": a
# process may in principle have ended by itself in that window, which the
# docs say.

from __future__ import annotations

from . import _procfs
from ._procfs import ProcInfo
from ._receipt import ProcessRecord


class _Watched:
    """One watched process and what was seen of it. (A plain class, not a
    dataclass: a dataclass costs about a millisecond to create at import.)"""

    __slots__ = ("alive_at_kill", "alive_at_term", "cmdline", "gone", "pid", "start")

    def __init__(self, pid: int, start: int, cmdline: str) -> None:
        self.pid = pid
        self.start = start
        self.cmdline = cmdline
        self.alive_at_term = False
        self.alive_at_kill = False
        self.gone = False

    def __repr__(self) -> str:
        return (
            f"_Watched(pid={self.pid!r}, start={self.start!r}, cmdline={self.cmdline!r}, "
            f"alive_at_term={self.alive_at_term!r}, alive_at_kill={self.alive_at_kill!r}, gone={self.gone!r})"
        )


class Fates:
    """The processes a receipt will name, watched one by one."""

    def __init__(self) -> None:
        self._procs: dict[int, _Watched] = {}

    def watch(self, info: ProcInfo, cmdline: str | None = None) -> None:
        """Start watching `info` (no-op if it is watched already)."""
        if info.pid not in self._procs:
            name = _procfs.cmdline(info.pid) if cmdline is None else cmdline
            self._procs[info.pid] = _Watched(info.pid, info.start, name)

    def __contains__(self, pid: int) -> bool:
        return pid in self._procs

    def _alive(self, w: _Watched) -> bool:
        if w.gone:
            return False
        info = _procfs.process_info(w.pid)
        if info is None or info.zombie or (w.start and info.start != w.start):
            w.gone = True
            return False
        return True

    def before_signal(self, pids: set[int] | None, *, kill: bool) -> None:
        """Record who is alive just before a signal reaches `pids` (None:
        every watched process, as a domain-wide signal does)."""
        for w in self._procs.values():
            if pids is not None and w.pid not in pids:
                continue
            if self._alive(w):
                if kill:
                    w.alive_at_kill = True
                else:
                    w.alive_at_term = True

    def fate(self, pid: int) -> str:
        w = self._procs[pid]
        if self._alive(w):
            return "alive"
        if w.alive_at_kill:
            return "killed"
        if w.alive_at_term:
            return "terminated"
        return "exited"

    def record(self, pid: int) -> ProcessRecord:
        w = self._procs[pid]
        return ProcessRecord(pid, w.cmdline, self.fate(pid))
