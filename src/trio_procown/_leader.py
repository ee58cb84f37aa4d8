# The direct process ("leader") of an owned command.
#
# We spawn through the spawner (_shim/spawn_into.c: clone3 with CLONE_VFORK
# and CLONE_PIDFD, as posix_spawn, with setsid, the stdio and cwd), which
# hands back the pidfd with the pid, or with subprocess.Popen (vfork + exec)
# where the spawner cannot be built or clone3 is refused, and then hold the
# child through a pidfd. The leader is *never reaped before the domain teardown is
# over*: while it is an unreaped zombie its pid, and so the process-group id
# equal to it, cannot be handed to another process, which is what makes
# killpg() on that id safe. Its exit status is read with
# waitid(P_PIDFD, WNOWAIT), which reports the status and leaves the zombie in
# place; the one real reap happens at the very end of the teardown.

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from . import _pidfd, _placement, _procfs
from ._pidfd import status_to_returncode
from ._placement import CloneRefused

# Leaders that were still alive when their teardown ended (a process we may
# not signal, one stuck in uninterruptible sleep): we stay their reaper, and
# reap them without waiting at each later spawn, so they never linger as
# zombies for the life of the program and never trip Popen's warning.
# Each is held by its pidfd where there is one, so the reap can only ever
# take that very process, never a later child that got its pid.
_DEFERRED: dict[int, int | None] = {}  # pid -> pidfd
# Held while a leader's pidfd is taken from it to be closed, and while a
# thread outside the trio run (the drop-in's Popen.wait) duplicates it: a
# duplicate is then always of the leader's own pidfd, never of a descriptor
# that reused its number after the close.
_PIDFD_HANDOVER = threading.Lock()


def reap_deferred() -> None:
    """Reap, without waiting, leaders left alive by an earlier teardown."""
    for pid, fd in list(_DEFERRED.items()):
        try:
            if fd is not None:
                res = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
                done = res is not None and res.si_pid != 0
            else:
                done = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            done = True
        if done:
            del _DEFERRED[pid]
            if fd is not None:
                os.close(fd)


class Leader:
    """The spawned direct process, held unreaped until `reap()`."""

    def __init__(
        self,
        pid: int,
        popen: subprocess.Popen[bytes] | None = None,
        pidfd: int | None = None,
        start: int = 0,
    ) -> None:
        self.popen = popen  # None when the spawner started it (no Popen to keep informed)
        self.pid = pid
        self.pidfd = _pidfd.open_pidfd(self.pid) if pidfd is None else pidfd
        if self.pidfd is not None:
            _procfs.hold(self.pid, self.pidfd)  # censuses leave its pid out (until the reap)
        self.returncode: int | None = None
        self.reaped = False
        # Reaped by someone else before us: the kernel, when the program
        # ignores SIGCHLD (or set SA_NOCLDWAIT), or a wait for any child in
        # the program. Its exit status is lost; returncode says 0 then, as
        # subprocess and trio say, and the receipt says it is unknown.
        self.lost = False
        self._start: int | None = start or None  # known from the spawn (0: read when asked)
        self.mark: _procfs.PidMark | None = None  # the pid counter before the spawn

    @property
    def start(self) -> int:
        """The leader's start time, in clock ticks since boot (0: unknown).

        The spawner mostly knows it from the clock around the clone
        (_placement.start_tick); else it is read at first use, not at the
        spawn: /proc/PID/stat of a child still inside its execve() takes
        ~35 us to read, against ~13 us once the exec is done (measured, 2
        cores). The spawn reads it last, for the keeper, while the leader is
        surely unreaped (its pid still its own).
        """
        if self._start is None:
            info = _procfs.read_stat(self.pid) if _procfs.IS_LINUX and not self.reaped else None
            self._start = info.start if info is not None else 0
        return self._start

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        stdin: int,
        stdout: int,
        stderr: int,
        cwd: str | os.PathLike[str] | None,
        env: Sequence[bytes],
        pass_fds: Sequence[int] = (),
        executable: str | None = None,
        cgroup_fd: int | None = None,
    ) -> Leader:
        """Start `argv` in a new session (the file `executable`, by default
        argv[0]; its environment the KEY=value entries `env`); with
        `cgroup_fd`, inside that cgroup from its first instruction. Both go
        through the spawner (clone3, _placement.spawn_into); without a
        cgroup, Popen where there is no spawner or clone3 is refused here.
        The descriptors `pass_fds` (above 2) are passed on, inheritable, as
        in subprocess; every other one above 2 is closed. Raises the OSError
        the OS gave."""
        if cgroup_fd is not None:
            try:
                pid, pidfd, start = _placement.spawn_into(
                    argv[0] if executable is None else executable,
                    argv,
                    env,
                    cwd,
                    (stdin, stdout, stderr),
                    cgroup_fd,
                    pass_fds,
                )
            except CloneRefused as exc:
                # The probe saw clone3 work here: this is what a fork would
                # say now (EAGAIN at RLIMIT_NPROC, ENOMEM), raised as
                # subprocess raises it (OSError picks the subclass).
                raise OSError(exc.errno, os.strerror(exc.errno or 0)) from None
            return cls(pid, pidfd=pidfd, start=start)
        plain = _placement.spawn_plain(
            argv[0] if executable is None else executable, argv, env, cwd, (stdin, stdout, stderr), pass_fds
        )
        if plain is not None:
            return cls(plain[0], pidfd=plain[1], start=plain[2])
        kwargs: dict[str, Any] = {}
        if pass_fds:
            kwargs["pass_fds"] = tuple(pass_fds)
        popen = subprocess.Popen(
            list(argv),
            executable=executable,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env={k: v for k, _, v in (e.partition(b"=") for e in env)},
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )
        return cls(popen.pid, popen)

    def poll(self) -> int | None:
        """The exit status if the leader has terminated, without reaping it."""
        if self.returncode is not None:
            return self.returncode
        try:
            if self.pidfd is not None:
                res = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            else:
                res = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            # Not our child any more (see `lost`): it has terminated, and
            # its pid may already be another process's, so it is never
            # waited for or signalled by pid again.
            if self.returncode is None:
                self.returncode = 0
                self.lost = True
                self.reaped = True
                if self.popen is not None:
                    self.popen.returncode = 0
            return self.returncode
        if res is None or res.si_pid == 0:
            return None
        self.returncode = status_to_returncode(res.si_code, res.si_status)
        return self.returncode

    @property
    def alive(self) -> bool:
        return self.poll() is None

    async def wait(self, *, beside: bool = False) -> int:
        """Wait until the leader terminates; returns its status, unreaped.
        `beside`: while another task may be waiting too (the supervisor's
        wait, or the teardown's, holds the pidfd: trio lets one task at a
        time wait on a descriptor), through a handle of its own on it."""
        while True:
            code = self.poll()
            if code is not None:
                return code
            if self.pidfd is None:
                await _pidfd.poll_until(lambda: self.poll() is not None)
                continue
            # (Not reaped, so the pidfd is open: it is closed only after the reap.)
            fd = os.dup(self.pidfd) if beside else self.pidfd
            try:
                await _pidfd.wait_exited(fd)
            finally:
                if beside:
                    os.close(fd)

    def block_until_exited(self, timeout: float) -> bool:
        """Block the calling thread until the leader terminates, at most
        `timeout` seconds, without reaping it; True if it did."""
        if self.poll() is not None:
            return True
        if self.pidfd is None:
            return _pidfd.block_until(lambda: self.poll() is not None, timeout)
        # Another thread may reap and close the pidfd meanwhile: wait on a
        # duplicate of it, taken while it surely is still ours.
        with _PIDFD_HANDOVER:
            fd = self.pidfd
            if fd is None:
                return self.poll() is not None
            fd = os.dup(fd)
        try:
            return _pidfd.wait_all_exited([fd], timeout) and self.poll() is not None
        finally:
            os.close(fd)

    def signal(self, sig: int) -> bool:
        """Signal the leader itself; False if it has already terminated."""
        if self.reaped:
            return False
        if self.pidfd is not None:
            return _pidfd.send(self.pidfd, sig)
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def reap(self) -> bool:
        """Reap the leader if it has terminated; True when it is reaped.

        Never blocks: a leader that survived SIGKILL (uninterruptible sleep)
        stays with subprocess's own bookkeeping, which reaps it later.
        """
        if self.reaped:
            if self.lost:
                self.close()  # nothing to reap: someone else did (see `lost`)
            return True
        if self.poll() is None:
            return False
        _procfs.release_held(self.pid)  # (before its pid is free again)
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        self.reaped = True
        if self.popen is not None:
            # Tell Popen the child is gone so it neither warns nor reaps again.
            self.popen.returncode = self.returncode
        self.close()
        return True

    def defer(self) -> None:
        """Give up on reaping now: the leader outlived its teardown. It is
        reaped at a later spawn (see _DEFERRED), not by Popen."""
        # A lost leader (see `lost`) is reaped already, but a signal may
        # still be under way through its pidfd: the pidfd is handed over
        # too, and closed at a later spawn.
        if self.reaped and not (self.lost and self.pidfd is not None):
            return
        _procfs.release_held(self.pid)
        with _PIDFD_HANDOVER:
            _DEFERRED[self.pid] = self.pidfd  # the pidfd now belongs to the deferred reaper
            self.pidfd = None
        self.reaped = True
        if self.popen is not None:
            self.popen.returncode = self.returncode if self.returncode is not None else -1

    def close(self) -> None:
        if self.pidfd is not None:
            _procfs.release_held(self.pid)
            with _PIDFD_HANDOVER:
                fd, self.pidfd = self.pidfd, None
            _pidfd.close(fd)

    def kill_now(self) -> None:
        """Last-resort SIGKILL of the leader and its group, used only when
        setting up the command failed after the spawn."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            self.signal(signal.SIGKILL)
