"""Services: handoff to a longer-lived owner, readiness, restarts, bounded stop."""

from __future__ import annotations

import ipaddress
import os
import shlex
import socket
import sys
from pathlib import Path

import pytest
import trio

import trio_procown
from conftest import py
from helpers import alive, read_ready
from trio_procown import _ready


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_handed_off_command_survives_its_block_until_owner_exit() -> None:
    """A command handed off outlives its block; the owner's exit stops it with a receipt."""
    async with trio_procown.open_service_owner("session") as owner:
        async with trio_procown.open_owned_command("echo up; sleep 30") as run:
            async for line in run.lines():
                assert line == "up\n"
                break
            handoff = await run.hand_off(owner, reason="shared by the session")
        assert alive(run.pid)  # the block is over, the service runs on
        assert run.receipt is None
        assert handoff.to_owner == "session"
        assert handoff.reason == "shared by the session"
        assert handoff.pid == run.pid
        assert "bounded teardown" in handoff.termination
        (svc,) = owner.services
        assert svc.handoff is handoff
    assert not alive(run.pid)
    assert run.receipt is not None
    assert run.receipt.cause == "stopped"
    assert run.receipt.domain_empty
    assert owner.receipts == [(svc.name, run.receipt)]
    assert any("handed off" in c for c in run.receipt.claims())


async def test_command_not_handed_off_is_torn_down_with_its_block() -> None:
    """Without a handoff, leaving the block tears the command down as usual."""
    async with trio_procown.open_service_owner() as owner:
        with trio.move_on_after(0.2):
            async with trio_procown.open_owned_command("sleep 30") as run:
                await run.wait()
        assert not alive(run.pid)
        assert owner.services == []


async def test_output_keeps_its_single_drain_across_the_handoff() -> None:
    """Bytes written before and after the handoff all land in the same record."""
    code = (
        "import sys, time\nprint('before', flush=True)\nsys.stdin.readline()\n"
        "print('after', flush=True)\ntime.sleep(30)\n"
    )
    send, receive = trio.testing.memory_stream_pair()
    async with trio_procown.open_service_owner() as owner:
        async with trio_procown.open_owned_command(py(code), stdin=receive) as run:
            lines = run.lines()
            assert await lines.__anext__() == "before\n"
            await send.send_all(b"go\n")
            await trio.sleep(0)
            await run.hand_off(owner, reason="test")
        with trio.fail_after(10):
            async for _ in run.stream():
                if run.stdout.endswith(b"after\n"):
                    break
    assert run.stdout == b"before\nafter\n"


async def test_handoff_twice_or_after_exit_is_an_error() -> None:
    """A second handoff, or a handoff of an ended command, raises HandoffError."""
    async with trio_procown.open_service_owner() as owner:
        async with trio_procown.open_owned_command("sleep 30") as run:
            await run.hand_off(owner, reason="first")
            with pytest.raises(trio_procown.HandoffError, match="already handed off"):
                await run.hand_off(owner, reason="second")
        async with trio_procown.open_owned_command("true") as done:
            await done.wait()
            with pytest.raises(trio_procown.HandoffError, match="no longer running"):
                await done.hand_off(owner, reason="too late")
    async with trio_procown.open_owned_command("sleep 30", timeout=1) as late:
        with pytest.raises(trio_procown.OwnerClosed, match="closed"):
            await late.hand_off(owner, reason="owner gone")
        await late.terminate()


async def test_ready_by_line() -> None:
    """start() returns once a stdout line matches."""
    async with trio_procown.open_service_owner() as owner:
        svc = await owner.start(
            "echo booting; echo listening on 1234; sleep 30",
            ready=trio_procown.ready_line(r"listening on \d+"),
        )
        assert svc.state.value == "ready"
        assert b"listening on 1234" in svc.stdout
    assert svc.receipt is not None
    assert svc.receipt.cause == "stopped"


async def test_ready_by_port_with_a_real_http_server(tmp_path: object) -> None:
    """A real http.server is ready when its port accepts connections, and is stopped at owner exit."""
    port = _free_port()
    async with trio_procown.open_service_owner() as owner:
        web = await owner.start(
            py(
                "import http.server\n"
                "http.server.test(http.server.SimpleHTTPRequestHandler,"
                f" port={port}, bind='127.0.0.1')\n"
            ),
            ready=trio_procown.ready_port(port),
            cwd=str(tmp_path),
        )
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET / HTTP/1.0\r\n\r\n")
        reply = await stream.receive_some()
        await stream.aclose()
        assert reply.startswith(b"HTTP/1.0 200")
    assert web.receipt is not None
    assert web.receipt.domain_empty
    assert not alive(web.receipt.pid)


NEEDS_PROC_NET = pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp"), reason="telling whose listener it is needs /proc/net (Linux)"
)


def _listener(reuse_port: bool = False) -> socket.socket:
    """A TCP socket listening on a free port of 127.0.0.1, opened by the test."""
    sock = socket.socket()
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


# A service listening on 127.0.0.1:{port} with SO_REUSEPORT; it says so once it does.
REUSEPORT_SERVER = (
    "import socket, time\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
    "s.bind(('127.0.0.1', {port}))\n"
    "s.listen()\n"
    "print('listening', flush=True)\n"
    "time.sleep(30)\n"
)


@NEEDS_PROC_NET
async def test_ready_port_ignores_a_listener_that_was_there_before() -> None:
    """A port someone else listens on does not make a service that never listens ready."""
    with _listener() as stale:
        port = stale.getsockname()[1]
        async with trio_procown.open_service_owner() as owner:
            with pytest.raises(trio_procown.ServiceNotReady, match="not ready after") as info:
                await owner.start("echo up; sleep 30", ready=trio_procown.ready_port(port), ready_timeout=0.5)
    assert info.value.receipt is not None
    assert info.value.receipt.domain_empty


@NEEDS_PROC_NET
async def test_ready_port_finds_the_services_listener_beside_another() -> None:
    """A service's child listening beside an older listener on the same port (SO_REUSEPORT) is ready."""
    with _listener(reuse_port=True) as stale:
        port = stale.getsockname()[1]
        async with trio_procown.open_service_owner() as owner:
            server = shlex.join(py(REUSEPORT_SERVER.format(port=port))) + "; exit $?"  # sh's child
            svc = await owner.start(server, ready=trio_procown.ready_port(port), ready_timeout=10)
            assert b"listening" in svc.stdout
    assert svc.receipt is not None
    assert svc.receipt.domain_empty


async def test_ready_port_any_listener_accepts_someone_elses() -> None:
    """any_listener=True is satisfied by a listener outside the service's domain."""
    with _listener() as other:
        port = other.getsockname()[1]
        async with trio_procown.open_service_owner() as owner:
            svc = await owner.start(
                "sleep 30", ready=trio_procown.ready_port(port, any_listener=True), ready_timeout=10
            )
            assert svc.state.value == "ready"


@NEEDS_PROC_NET
def test_listening_inodes_and_socket_inodes_name_the_same_socket() -> None:
    """/proc/net/tcp's LISTEN entry for a port and the holder's fd show one socket inode."""
    with _listener() as sock:
        port = sock.getsockname()[1]
        inode = os.fstat(sock.fileno()).st_ino
        assert _ready.listening_inodes("127.0.0.1", port) == {inode}
        held = _ready.socket_inodes(os.getpid())
        assert held is not None
        assert inode in held
        # An address this machine does not listen on: nothing to tell.
        assert not _ready.listening_inodes("192.0.2.1", port)


def test_proc_net_address_reads_the_kernels_word_order() -> None:
    """/proc/net/tcp{,6} addresses are 32-bit words in host byte order."""
    little = sys.byteorder == "little"
    v4 = "0100007F" if little else "7F000001"
    v6 = "00000000000000000000000001000000" if little else "00000000000000000000000000000001"
    assert _ready.proc_net_address(v4) == ipaddress.ip_address("127.0.0.1")
    assert _ready.proc_net_address(v6) == ipaddress.ip_address("::1")


async def test_ready_by_file_and_predicate(tmp_path: object) -> None:
    """Readiness by a file appearing and by a custom predicate."""
    flag = os.path.join(str(tmp_path), "ready")
    async with trio_procown.open_service_owner() as owner:
        a = await owner.start(f"sleep 0.1; touch {flag}; sleep 30", ready=trio_procown.ready_file(flag))
        assert os.path.exists(flag)
        b = await owner.start(
            "echo hello; sleep 30", ready=trio_procown.ready_when(lambda run: b"hello" in run.stdout)
        )
        assert b.state.value == a.state.value == "ready"


async def test_readiness_timeout_tears_down_with_receipt_and_output() -> None:
    """A service that never becomes ready: torn down, ServiceNotReady with receipt and output."""
    async with trio_procown.open_service_owner() as owner:
        with pytest.raises(trio_procown.ServiceNotReady, match="not ready after") as info:
            await owner.start(
                "echo partial; sleep 30", ready=trio_procown.ready_line("never"), ready_timeout=0.3
            )
    err = info.value
    assert err.stdout == b"partial\n"
    assert err.receipt is not None
    assert err.receipt.domain_empty
    assert not alive(err.receipt.pid)


async def test_service_that_dies_before_ready() -> None:
    """A service that exits during readiness fails fast with its status."""
    async with trio_procown.open_service_owner() as owner:
        with pytest.raises(trio_procown.ServiceNotReady, match="ended first"):
            await owner.start("echo oops >&2; exit 3", ready=trio_procown.ready_port(_free_port()))


async def test_service_that_exits_after_ready_is_reported() -> None:
    """A ready service that exits by itself is reported to the owner (state exited, receipt)."""
    async with trio_procown.open_service_owner() as owner:
        svc = await owner.start("echo up; sleep 0.1; exit 4", ready=trio_procown.ready_line("up"))
        with trio.fail_after(10):
            await svc.state.wait_value("exited")
        assert svc.receipt is not None
        assert svc.receipt.cause == "exited"
        assert svc.receipt.returncode == 4


async def test_restart_policy_is_bounded() -> None:
    """on-failure restarts a failing service at most max_restarts times."""
    async with trio_procown.open_service_owner() as owner:
        svc = await owner.start(
            "echo up; exit 1", ready=trio_procown.ready_line("up"), restart="on-failure", max_restarts=2
        )
        with trio.fail_after(10):
            await svc.state.wait_value("exited")
    assert svc.restarts == 2
    assert len(svc.receipts) == 3
    assert all(r.returncode == 1 for r in svc.receipts)


async def test_owner_stop_one_service() -> None:
    """owner.stop() tears one service down and returns its receipt."""
    async with trio_procown.open_service_owner() as owner:
        a = await owner.start("sleep 30")
        b = await owner.start("sleep 30")
        receipt = await owner.stop(a)
        assert receipt is not None
        assert receipt.cause == "stopped"
        assert a.state.value == "stopped"
        assert b.run is not None
        assert alive(b.run.pid)


async def test_owner_exit_under_cancellation_tears_down_all_within_budget() -> None:
    """Cancelling the owner's scope stops every service concurrently within the budget."""
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\ntime.sleep(30)\n"
    )
    services: list[trio_procown.Service] = []
    with trio.move_on_after(20) as outer:
        async with trio_procown.open_service_owner() as owner:
            for _ in range(5):
                services.append(
                    await owner.start(py(code), ready=trio_procown.ready_line("up"), grace=0.3, kill_wait=1.0)
                )
            start = trio.current_time()
            outer.cancel()
            await trio.sleep_forever()
    elapsed = trio.current_time() - start
    assert elapsed < 0.3 + 1.0 + 0.5 + 1.0  # one budget, not five: stopped concurrently
    for svc in services:
        assert svc.receipt is not None
        assert svc.receipt.cause == "cancelled"
        assert svc.receipt.forced
        assert not alive(svc.receipt.pid)


async def test_start_on_a_closed_owner_raises_owner_closed() -> None:
    """start() on an owner whose block is over raises OwnerClosed, a ServiceError; nothing runs."""
    async with trio_procown.open_service_owner("gone") as owner:
        pass
    with pytest.raises(trio_procown.OwnerClosed, match="'gone' is closed") as info:
        await owner.start("sleep 30")
    assert isinstance(info.value, trio_procown.ServiceError)
    assert owner.services == []


async def test_start_rejects_a_timeout() -> None:
    """A service has no timeout; passing one is a ValueError."""
    async with trio_procown.open_service_owner() as owner:
        with pytest.raises(ValueError, match="no timeout"):
            await owner.start("sleep 1", timeout=1)


async def test_handoff_after_a_stream_reached_eof() -> None:
    """A command whose stderr already reached EOF can be handed off: the owner does not restart a
    finished drain (it crashed with AssertionError before)."""
    code = "import os, sys, time\nos.close(2)\nprint('ready', flush=True)\ntime.sleep(30)\n"
    async with trio_procown.open_service_owner() as owner, trio_procown.open_owned_command(py(code)) as run:
        await read_ready(run)
        with trio.fail_after(5):
            async for _ in run.stream("stderr"):
                pass  # ends at EOF: the drain is done
        await run.hand_off(owner, reason="test")
    assert run.receipt is not None
    assert run.receipt.cause == "stopped"


async def test_lines_follow_every_incarnation_until_the_service_ends(tmp_path: Path) -> None:
    """Service.lines() reads each run's output in turn across restarts, and
    ends once the service has ended and its last run's output is read."""
    counter = tmp_path / "runs"
    counter.write_text("0")
    command = py(
        f"import sys; n = int(open({str(counter)!r}).read()); open({str(counter)!r}, 'w').write(str(n + 1))\n"
        "print('run', n, flush=True); print('more', n, flush=True); sys.exit(1)"
    )
    seen: list[str] = []
    async with trio.open_nursery() as nursery, trio_procown.open_service_owner() as owner:
        svc = await owner.start(command, restart="on-failure", max_restarts=2)

        async def follow() -> None:
            async for line in svc.lines():
                seen.append(line)

        nursery.start_soon(follow)
        await svc.state.wait_value("exited")
    assert seen == ["run 0\n", "more 0\n", "run 1\n", "more 1\n", "run 2\n", "more 2\n"]
    assert len(svc.receipts) == 3
