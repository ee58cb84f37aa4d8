"""Small helpers shared by the tests (process checks, domain list)."""

from __future__ import annotations

from typing import TypedDict

import psutil

import trio_procown


class Budgets(TypedDict):
    """Teardown budgets for open_owned_command/run_owned (a subset of its
    keyword arguments, so that it can be unpacked beside an explicit
    domain= and timeout=)."""

    grace: float
    kill_wait: float
    drain_wait: float


def alive(pid: int) -> bool:
    """True if `pid` is a live (non-zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def read_ready(run: trio_procown.OwnedCommand) -> None:
    """Read the command's first line: it says "ready"."""
    async for line in run.lines():
        assert line == "ready\n"
        break


def domains() -> list[str]:
    """The domains this machine offers, strongest first."""
    return [d.name for d in trio_procown.available_domains() if d.available]


def pids_in(text: bytes) -> list[int]:
    """Integers printed one per line as 'pid N'."""
    return [int(line.split()[1]) for line in text.decode().splitlines() if line.startswith("pid ")]


# Python code: fork a child that calls setsid() (leaving the process group and
# session) and sleeps, holding stdout; the parent prints "pid N" only once the
# child has left, then goes on with whatever code is appended.
ESCAPEE = (
    "import os, time\n"
    "r, w = os.pipe()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.setsid()\n"
    "    os.write(w, b'x')\n"
    "    time.sleep(30)\n"
    "    os._exit(0)\n"
    "os.read(r, 1)\n"
    "os.write(1, b'pid %d\\n' % pid)\n"
)


def kill_and_wait(pid: int, timeout: float = 5.0) -> None:
    """SIGKILL a process this test started and wait (on its pidfd) until it
    has terminated, so no later check sees it still running."""
    import os
    import select
    import signal

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(int(timeout * 1000))
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)
