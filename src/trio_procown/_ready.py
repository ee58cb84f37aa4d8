# Readiness: when has a service started far enough to be used?
#
# A probe is an async function of the service's OwnedCommand that returns
# once the service is ready (what it returns is informative only) and raises
# when it knows the service will not become ready. A probe polls without a
# bound of its own: await_ready bounds it by the owner's `ready_timeout` and
# races it against the command's exit, which gives the probe READY_AFTER_EXIT
# more to read what the command printed just before it ended.
#
# ready_port and the owner of a listener. An accepted TCP connection proves
# only that *something* listens on the port: a server left over from an
# earlier run, or another program's, would make a service that never
# listens look ready. Where the platform can tell (Linux), the probe
# accepts a connection only once it has found that the listener is held by a
# process of the service's domain:
#
#   1. the connection's peer address is the address that accepted it; the
#      LISTEN entries of /proc/net/tcp and /proc/net/tcp6 for the port whose
#      local address is that address, or the wildcard, are the sockets that
#      could have accepted it, each named by its socket inode;
#   2. a process of the domain (the domain, not only the leader: a server
#      that forks its workers, or daemonises, is still in it) whose fds
#      include one of those inodes (/proc/PID/fd/N -> "socket:[INODE]") is
#      the service, listening.
#
# Step 2 asks of every process whether it is in the domain (one small read
# each; the leader first, as it usually is the listener) and lists the fds
# of those that are: milliseconds on a busy machine, so it runs in a worker
# thread, not on the event loop. It has three answers:
#
#   - the service's own listener: ready;
#   - someone else's: not yet; look again every FOREIGN_RECHECK (the service
#     may still listen beside it, or take the port over) until ready_timeout;
#   - cannot tell, which keeps the plain rule "a connection was accepted":
#     no /proc/net (not Linux); no LISTEN entry for that address in this
#     network namespace (a remote host, another namespace); a process of the
#     domain whose fds cannot be read.
#
# A listener in this namespace held by a process outside the domain (a
# container runtime's port proxy, say) is someone else's; `any_listener=True`
# accepts it.

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Literal, TypeAlias

import trio

from ._errors import ServiceError

if TYPE_CHECKING:
    from ._command import OwnedCommand

__all__ = [
    "FOREIGN_RECHECK",
    "READY_AFTER_EXIT",
    "Readiness",
    "await_ready",
    "listener_in_domain",
    "ready_file",
    "ready_line",
    "ready_port",
    "ready_when",
]

# After the command ended, how long a readiness probe may still take to
# finish (e.g. to read the last lines the command printed).
READY_AFTER_EXIT = 0.1

Readiness: TypeAlias = "Callable[[OwnedCommand], Awaitable[object]]"

IPAddress: TypeAlias = "ipaddress.IPv4Address | ipaddress.IPv6Address"

# While the port's listener is someone else's, how often to look again.
# Finding out scans the processes (~10-20 ms for a few hundred), so this
# is slower than the probe's own interval.
FOREIGN_RECHECK = 0.5

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN = "0A"  # the st column of a listening socket


def ready_line(pattern: str | re.Pattern[str], stream: Literal["stdout", "stderr"] = "stdout") -> Readiness:
    """Ready when a line of `stream` matches `pattern` (re.search).

    Synopsis::

        svc = await owner.start(cmd, ready=trio_procown.ready_line(r"listening on"))
    """
    regex = re.compile(pattern)

    async def probe(run: OwnedCommand) -> object:
        async for line in run.lines(stream):
            if regex.search(line):
                return line
        msg = f"{stream} ended before a line matched {regex.pattern!r}"
        raise ServiceError(msg)

    return probe


def ready_port(
    port: int, host: str = "127.0.0.1", interval: float = 0.02, *, any_listener: bool = False
) -> Readiness:
    """Ready when a TCP connection to (host, port) is accepted by the
    service itself.

    On Linux, a listener that does not belong to the service's domain (a
    server left over from an earlier run, say) does not count; where that
    cannot be told (another platform, a remote `host`), any accepted
    connection does. `any_listener=True` accepts any listener, e.g. the port
    proxy of a container runtime that the command asked to start a
    container.

    Synopsis::

        svc = await owner.start([sys.executable, "-m", "http.server", "8123"],
                                ready=trio_procown.ready_port(8123))
    """

    async def probe(run: OwnedCommand) -> object:
        while True:
            peer = await _accepted_by(host, port)
            if peer is None:
                await trio.sleep(interval)
                continue
            if any_listener:
                return port
            ours = await trio.to_thread.run_sync(listener_in_domain, run, peer, port, abandon_on_cancel=True)
            if ours is not False:
                return port
            await trio.sleep(max(interval, FOREIGN_RECHECK))

    return probe


async def _accepted_by(host: str, port: int) -> str | None:
    """Connect to (host, port) and hang up; the address that accepted, or None."""
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return None
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:  # reset already
        return None
    finally:
        await stream.aclose()


def ready_file(path: str | os.PathLike[str], interval: float = 0.02) -> Readiness:
    """Ready when `path` exists.

    Synopsis::

        svc = await owner.start(["sh", "-c", "sleep 0.1; touch app.ready; exec sleep 30"],
                                ready=trio_procown.ready_file("app.ready"))
    """

    async def probe(run: OwnedCommand) -> object:
        while not os.path.exists(path):
            await trio.sleep(interval)
        return path

    return probe


def ready_when(
    predicate: Callable[[OwnedCommand], bool | Awaitable[bool]], interval: float = 0.02
) -> Readiness:
    """Ready when `predicate(run)` (sync or async) returns true, polled.

    Synopsis::

        svc = await owner.start(cmd, ready=trio_procown.ready_when(lambda run: b"up" in run.stdout))
    """

    async def probe(run: OwnedCommand) -> object:
        while True:
            result = predicate(run)
            if not isinstance(result, bool):
                result = await result
            if result:
                return True
            await trio.sleep(interval)

    return probe


async def await_ready(run: OwnedCommand, ready: Readiness | None, timeout: float) -> str | None:
    """Wait at most `timeout` for `ready(run)`; None when ready, else why not."""
    if ready is None:
        return None
    outcome: list[str] = []
    probed = trio.Event()
    with trio.move_on_after(timeout) as scope:
        async with trio.open_nursery() as nursery:

            async def probe() -> None:
                try:
                    await ready(run)
                except Exception as exc:  # a failing probe means "not ready"
                    outcome.append(f"the readiness probe failed: {exc}")
                probed.set()
                nursery.cancel_scope.cancel()

            async def died() -> None:
                receipt = await run.wait()
                # A probe reading output printed just before the exit (a
                # ready line) still gets a short, bounded chance to match.
                with trio.move_on_after(READY_AFTER_EXIT):
                    await probed.wait()
                if not probed.is_set():
                    outcome.append(
                        f"the command ended first ({receipt.cause}, returncode {receipt.returncode})"
                    )
                nursery.cancel_scope.cancel()

            nursery.start_soon(probe)
            nursery.start_soon(died)
    if scope.cancelled_caught:
        return f"not ready after {timeout:g}s"
    return outcome[0] if outcome else None


# -- whose listener? -------------------------------------------------------------


def listener_in_domain(run: OwnedCommand, peer: str, port: int) -> bool | None:
    """Is the listener that accepted a connection to (peer, port) held by a
    process of `run`'s domain? None when this platform cannot tell."""
    inodes = listening_inodes(peer, port)
    if not inodes:  # no /proc/net, or no such listener in this namespace
        return None
    unreadable = False
    for pid in _pids(first=run.pid):
        if not _in_domain(run, pid):
            continue
        held = socket_inodes(pid)
        if held is None:
            unreadable = True
        elif held & inodes:
            return True
    return None if unreadable else False


def _in_domain(run: OwnedCommand, pid: int) -> bool:
    return run.owns_pid(pid)


def listening_inodes(peer: str, port: int) -> set[int] | None:
    """Socket inodes of the TCP listeners on `port` that a connection to
    `peer` can reach (its address, or the wildcard); None without /proc/net."""
    try:
        to = _unmapped(ipaddress.ip_address(peer))
    except ValueError:
        return None
    found: set[int] | None = None
    for table in _TCP_TABLES:
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        found = found or set()
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port:
                continue
            local = _unmapped(proc_net_address(address))
            wildcard = local.is_unspecified and (local.version == 6 or to.version == 4)
            if (local == to or wildcard) and fields[9] != "0":
                found.add(int(fields[9]))
    return found


def proc_net_address(text: str) -> IPAddress:
    """An address as /proc/net/tcp{,6} prints it: each 32-bit word in hex,
    in the host's byte order ("0100007F" is 127.0.0.1 on little-endian)."""
    raw = bytes.fromhex(text)
    words = (int.from_bytes(raw[i : i + 4], "big").to_bytes(4, sys.byteorder) for i in range(0, len(raw), 4))
    return ipaddress.ip_address(b"".join(words))


def _unmapped(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def socket_inodes(pid: int) -> set[int] | None:
    """The socket inodes among the open fds of `pid`: empty if it is gone,
    None if its fds cannot be read."""
    where = f"/proc/{pid}/fd"
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return set()
    except OSError:
        return None
    inodes = set()
    for name in names:
        try:
            target = os.readlink(f"{where}/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _pids(first: int) -> Iterator[int]:
    """`first` (the leader, the likeliest holder), then every other pid."""
    yield first
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit() and int(name) != first:
            yield int(name)
