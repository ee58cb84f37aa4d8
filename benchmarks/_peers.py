# The peers: the ways Python programs commonly run a command under a
# deadline, written the way their documentation (or their users) write them,
# next to trio_procown. Every benchmark that compares against peers calls
# them from here, so the correctness table, the spawn cost, the drain and the
# scaling runs all measure the same code.
#
# Each peer takes a command (a str runs under /bin/sh -c, a list is exec'd)
# and a deadline in seconds, and returns what the *caller* gets back: the
# captured output (stdout then stderr) or None when the call hands back no
# output at all (the caller was cancelled, or the recipe drops it). Whether
# it returns at all, and what it leaves running, is for the caller to see.
#
#   subprocess.run      subprocess.run(timeout=, capture_output=True); on
#                       TimeoutExpired the output so far is in the exception.
#   communicate         Popen.communicate(timeout) -> kill() -> communicate(),
#                       the recipe in the subprocess documentation.
#   trio                trio.run_process(capture_stdout=True) inside
#                       trio.move_on_after.
#   anyio               anyio.run_process (trio backend: we run inside trio)
#                       inside anyio.move_on_after.
#   asyncio             asyncio wait_for(communicate()) -> kill() -> wait().
#   adk                 ADK-style teardown, re-implemented here from the
#                       published description of the one Google ADK's Python
#                       LocalEnvironment adopted (for comparison only, not
#                       its code): a new session; one drain task for the
#                       whole call; at the deadline SIGTERM to the group,
#                       wait 5 s for the drain; SIGKILL to the group, wait
#                       5 s more; then give up and return empty output.
#   procown-cgroup /    trio_procown.run_owned(timeout=) with the domain
#   procown-pg          forced; default grace (2 s), kill_wait, drain_wait.
#   procown-cancel      trio_procown.open_owned_command (domain "auto")
#                       inside trio.move_on_after, the outer-cancel path.
#
# The asyncio-based peers run on an asyncio event loop that the caller
# provides; inside the benchmarks' trio.run they are driven with
# loop.run_until_complete from the trio thread (asyncio does not see trio as
# a running loop), which blocks trio for the duration, like subprocess.run.

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import trio

import trio_procown

Command = str | Sequence[str]
Kind = Literal["sync", "trio", "asyncio"]

# Receipts of the trio_procown peers, for the one-shot runner to report;
# callers that run peers many times clear it.
LAST_RECEIPTS: list[trio_procown.Receipt] = []

# The bound ADK's description gives each of its two teardown waits.
ADK_WAIT = 5.0


@dataclass(frozen=True)
class Peer:
    """One way of running a command under a deadline."""

    key: str
    label: str
    kind: Kind
    call: Callable[[Command, float], Any]  # returns bytes | None, or an awaitable of it
    needs: str = ""  # optional module this peer imports


def _shell(command: Command) -> bool:
    return isinstance(command, str)


def _joined(out: bytes | None, err: bytes | None) -> bytes:
    return (out or b"") + (err or b"")


# -- blocking peers ------------------------------------------------------------------


def subprocess_run(command: Command, timeout: float) -> bytes | None:
    try:
        r = subprocess.run(command, shell=_shell(command), timeout=timeout, capture_output=True, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, bytes) else None
        err = exc.stderr if isinstance(exc.stderr, bytes) else None
        return _joined(out, err)
    return _joined(r.stdout, r.stderr)


def communicate_recipe(command: Command, timeout: float) -> bytes | None:
    with subprocess.Popen(
        command, shell=_shell(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return _joined(out, err)


# -- trio peers --------------------------------------------------------------------------


async def trio_run_process(command: Command, timeout: float) -> bytes | None:
    with trio.move_on_after(timeout):
        r = await trio.run_process(command, shell=_shell(command), capture_stdout=True, check=False)
        return bytes(r.stdout)
    return None


async def anyio_run_process(command: Command, timeout: float) -> bytes | None:
    import anyio

    with anyio.move_on_after(timeout):
        r = await anyio.run_process(command if isinstance(command, str) else list(command), check=False)
        return _joined(r.stdout, r.stderr)
    return None


async def procown_run(command: Command, timeout: float, domain: Literal["cgroup", "process-group"]) -> bytes:
    r = await trio_procown.run_owned(command, timeout=timeout, domain=domain)
    LAST_RECEIPTS.append(r.receipt)
    return _joined(r.stdout, r.stderr)


async def procown_cgroup(command: Command, timeout: float) -> bytes | None:
    return await procown_run(command, timeout, "cgroup")


async def procown_pg(command: Command, timeout: float) -> bytes | None:
    return await procown_run(command, timeout, "process-group")


async def procown_cancel(command: Command, timeout: float) -> bytes | None:
    run: trio_procown.OwnedCommand | None = None
    with trio.move_on_after(timeout):
        async with trio_procown.open_owned_command(command) as run:
            await run.wait()
    if run is not None and run.receipt is not None:
        LAST_RECEIPTS.append(run.receipt)
    return None if run is None else _joined(run.stdout, run.stderr)


# -- asyncio peers --------------------------------------------------------------------------


async def _asyncio_spawn(command: Command, *, new_session: bool = False) -> asyncio.subprocess.Process:
    pipe = asyncio.subprocess.PIPE
    if isinstance(command, str):
        return await asyncio.create_subprocess_shell(
            command, stdout=pipe, stderr=pipe, start_new_session=new_session
        )
    return await asyncio.create_subprocess_exec(
        *command, stdout=pipe, stderr=pipe, start_new_session=new_session
    )


async def asyncio_recipe(command: Command, timeout: float) -> bytes | None:
    proc = await _asyncio_spawn(command)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        # What the cancelled communicate() had read went with it.
        return None
    return _joined(out, err)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


async def adk_style(command: Command, timeout: float) -> bytes | None:
    """ADK-style teardown, re-implemented from its published description
    (see the module comment). Comparison only."""
    proc = await _asyncio_spawn(command, new_session=True)
    drain = asyncio.ensure_future(proc.communicate())
    try:
        out, err = await asyncio.wait_for(asyncio.shield(drain), timeout)
    except TimeoutError:
        pass
    else:
        return _joined(out, err)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_group(proc.pid, sig)
        done, _ = await asyncio.wait({drain}, timeout=ADK_WAIT)
        if done:
            out, err = drain.result()
            return _joined(out, err)
    drain.cancel()
    return b""  # gives up: empty output


# -- the table of peers ------------------------------------------------------------------------

PEERS: list[Peer] = [
    Peer("subprocess.run", "subprocess.run(timeout=, capture_output=True)", "sync", subprocess_run),
    Peer("communicate", "communicate(timeout) → kill() → communicate()", "sync", communicate_recipe),
    Peer("trio", "trio.run_process(capture_stdout=True) in move_on_after", "trio", trio_run_process),
    Peer(
        "anyio",
        "anyio.run_process (trio backend) in anyio.move_on_after",
        "trio",
        anyio_run_process,
        needs="anyio",
    ),
    Peer("asyncio", "asyncio wait_for(communicate()) → kill() → wait()", "asyncio", asyncio_recipe),
    Peer("adk", "ADK-style, re-implemented from its published description", "asyncio", adk_style),
    Peer("procown-cgroup", "trio_procown run_owned(timeout=), cgroup", "trio", procown_cgroup),
    Peer("procown-pg", "trio_procown run_owned(timeout=), process-group", "trio", procown_pg),
    Peer("procown-cancel", "trio_procown open_owned_command in move_on_after", "trio", procown_cancel),
]
BY_KEY = {p.key: p for p in PEERS}
OURS = ("procown-cgroup", "procown-pg", "procown-cancel")


def missing_module(peer: Peer) -> str:
    """The optional module this peer needs and that is not installed, or ''."""
    if not peer.needs:
        return ""
    try:
        __import__(peer.needs)
    except ImportError:
        return peer.needs
    return ""


def usable(peer: Peer) -> bool:
    """Whether the peer can run here (its module is installed, its domain available)."""
    if missing_module(peer):
        return False
    options = {o.name: o.available for o in trio_procown.available_domains()}
    if peer.key == "procown-cgroup":
        return options.get("cgroup", False)
    if peer.key == "procown-pg":
        return options.get("process-group", False)
    return True


def call_blocking(
    peer: Peer, loop: asyncio.AbstractEventLoop | None
) -> Callable[[Command, float], bytes | None]:
    """A blocking callable for a sync or asyncio peer."""
    if peer.kind == "sync":
        fn: Callable[[Command, float], bytes | None] = peer.call
        return fn
    if peer.kind == "asyncio":
        if loop is None:
            msg = f"peer {peer.key!r} needs an asyncio loop"
            raise ValueError(msg)
        running = loop

        def drive(command: Command, timeout: float) -> bytes | None:
            result: bytes | None = running.run_until_complete(peer.call(command, timeout))
            return result

        return drive
    msg = f"peer {peer.key!r} runs under trio"
    raise ValueError(msg)


def call_async(peer: Peer) -> Callable[[Command, float], Awaitable[bytes | None]]:
    """The awaitable callable of a trio peer."""
    if peer.kind != "trio":
        msg = f"peer {peer.key!r} is not a trio peer"
        raise ValueError(msg)
    fn: Callable[[Command, float], Awaitable[bytes | None]] = peer.call
    return fn
