"""Output and input: the single drain, streaming, bounded memory, routing, stdin."""

from __future__ import annotations

import errno
import os

import pytest
import trio

import trio_procown
from conftest import py
from helpers import ESCAPEE, kill_and_wait


async def test_stream_from_the_start_then_live() -> None:
    """A stream subscribed after output began still sees it from the first byte, then follows live."""
    async with trio_procown.open_owned_command(
        "echo one; echo two; read x; echo three", stdin=b"go\n"
    ) as run:
        got = b"".join([chunk async for chunk in run.stream("stdout")])
    assert got == b"one\ntwo\nthree\n"
    assert run.stdout == got


async def test_lines_follow_output_while_the_command_runs() -> None:
    """Lines arrive while the command is still running (before it exits)."""
    seen: list[str] = []
    async with trio_procown.open_owned_command("echo first; sleep 30", timeout=1) as run:
        async for line in run.lines():
            seen.append(line)
            break
        assert run.returncode is None  # still running: the line came live
    assert seen == ["first\n"]
    assert run.receipt is not None
    assert run.receipt.cause == "timed_out"


async def test_consumer_that_stops_halfway_does_not_hang_or_lose_bytes() -> None:
    """A consumer that stops reading halfway: no hang, the record keeps every byte."""
    code = "import sys\nfor i in range(20000):\n    sys.stdout.write(f'line {i}\\n')\n"
    async with trio_procown.open_owned_command(py(code)) as run:
        n = 0
        async for _ in run.lines():
            n += 1
            if n == 10:
                break
        receipt = await run.wait()
    assert receipt.output == "complete"
    assert run.stdout.count(b"\n") == 20000
    assert run.stdout.endswith(b"line 19999\n")


async def test_lines_decode_utf8_split_between_writes() -> None:
    """A UTF-8 character written in two separate writes decodes whole."""
    code = (
        "import os, time\n"
        "euro = '€'.encode()\n"
        "os.write(1, b'price: ' + euro[:1]); time.sleep(0.2); os.write(1, euro[1:] + b'5')\n"
    )
    async with trio_procown.open_owned_command(py(code)) as run:
        lines = [line async for line in run.lines()]
    assert lines == ["price: €5"]


async def test_one_gigabyte_with_one_mib_limit_keeps_head_and_tail() -> None:
    """1 GB through a 1 MiB limit: head and tail kept, dropped bytes counted exactly, truncated."""
    total = 1_000_000_000
    code = (
        "import os\n"
        "block = bytes(range(256)) * 4096\n"  # 1 MiB of a repeating pattern
        f"left = {total}\n"
        "os.write(1, b'HEAD')\n"
        "left -= 4\n"
        "while left > 4:\n"
        "    n = min(len(block), left - 4)\n"
        "    os.write(1, block[:n]); left -= n\n"
        "os.write(1, b'TAIL')\n"
    )
    limit = 1 << 20
    result = await trio_procown.run_owned(py(code), max_output=limit, timeout=120)
    r = result.receipt
    assert r.output == "truncated"
    (stdout,) = [s for s in r.streams if s.name == "stdout"]
    assert stdout.captured == total
    assert stdout.kept == limit
    assert stdout.dropped == total - limit
    assert len(result.stdout) == limit
    assert result.stdout.startswith(b"HEAD")
    assert result.stdout.endswith(b"TAIL")
    assert any("dropped by the size limit" in c for c in r.claims())


async def test_merged_stderr_keeps_write_order() -> None:
    """stderr="stdout" merges both into one pipe, in the order written."""
    code = "import os\nfor i in range(50):\n    os.write(1 + i % 2, b'%d\\n' % i)\n"
    result = await trio_procown.run_owned(py(code), stderr=trio_procown.STDOUT)
    assert result.stdout == b"".join(b"%d\n" % i for i in range(50))
    assert result.stderr == b""


async def test_output_to_files_and_devnull(tmp_path: object) -> None:
    """stdout and stderr can go to files (written by the command) or be discarded."""
    out = os.path.join(str(tmp_path), "out.txt")
    err = os.path.join(str(tmp_path), "err.txt")
    result = await trio_procown.run_owned("echo to-out; echo to-err >&2", stdout=out, stderr=err)
    assert (result.stdout, result.stderr) == (b"", b"")
    with open(out, "rb") as f:
        assert f.read() == b"to-out\n"
    with open(err, "rb") as f:
        assert f.read() == b"to-err\n"
    dropped = await trio_procown.run_owned("echo x; echo y >&2", stdout="devnull", stderr="devnull")
    assert (dropped.stdout, dropped.stderr, dropped.returncode) == (b"", b"", 0)


async def test_stream_of_uncaptured_output_is_an_error() -> None:
    """Streaming a stream that is not captured raises a clear ValueError."""
    async with trio_procown.open_owned_command("true", stderr="devnull") as run:
        with pytest.raises(ValueError, match="not captured"):
            run.stream("stderr")


async def test_stdin_from_path(tmp_path: object) -> None:
    """stdin as a path: the command reads the file."""
    path = os.path.join(str(tmp_path), "in.txt")
    with open(path, "wb") as f:
        f.write(b"from a file\n")
    result = await trio_procown.run_owned(["cat"], stdin=path)
    assert result.stdout == b"from a file\n"


async def test_stdin_from_open_fd_shares_its_offset(tmp_path: object) -> None:
    """stdin as an open fd: inherited as is, reading on from (and moving) its offset; it stays open."""
    path = os.path.join(str(tmp_path), "in.txt")
    with open(path, "wb") as f:
        f.write(b"abcdef")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.read(fd, 3) == b"abc"
        result = await trio_procown.run_owned(["cat"], stdin=fd)
        assert result.stdout == b"def"
        assert os.lseek(fd, 0, os.SEEK_CUR) == 6  # the same open file description
    finally:
        os.close(fd)  # still ours: closing it again would raise EBADF
    with open(path, "rb", buffering=0) as raw:
        assert raw.read(2) == b"ab"
        result = await trio_procown.run_owned(["cat"], stdin=raw)
        assert result.stdout == b"cdef"
        assert not raw.closed


async def test_stdin_fd_that_is_not_open_raises_before_spawning() -> None:
    """A closed or negative stdin fd raises at once (EBADF / ValueError), and no command is started."""
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(OSError, match=os.strerror(errno.EBADF)) as info:
        await trio_procown.run_owned(["cat"], stdin=r)
    assert info.value.errno == errno.EBADF
    with pytest.raises(ValueError, match="file descriptor"):
        await trio_procown.run_owned(["cat"], stdin=-1)
    with pytest.raises(TypeError):
        await trio_procown.run_owned(["cat"], stdin=True)


async def test_stdin_from_receive_stream() -> None:
    """stdin from a trio ReceiveStream: the feeder copies it through."""
    send, receive = trio.testing.memory_stream_pair()

    async def produce() -> None:
        for i in range(3):
            await send.send_all(b"chunk %d\n" % i)
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        result = await trio_procown.run_owned(["cat"], stdin=receive)
    assert result.stdout == b"chunk 0\nchunk 1\nchunk 2\n"


async def test_command_exiting_without_reading_large_stdin() -> None:
    """A command that exits without reading a large stdin: no hang, normal receipt."""
    big = b"x" * (16 << 20)
    start = trio.current_time()
    result = await trio_procown.run_owned(["true"], stdin=big)
    assert result.receipt.cause == "exited"
    assert result.returncode == 0
    assert trio.current_time() - start < 5


async def test_command_that_stops_reading_stdin_does_not_hang_teardown() -> None:
    """A command that never reads its stdin and runs on: the timeout tears it down promptly."""
    big = b"x" * (16 << 20)
    start = trio.current_time()
    result = await trio_procown.run_owned("sleep 30", stdin=big, timeout=0.3)
    assert result.receipt.cause == "timed_out"
    assert trio.current_time() - start < 3


async def test_abandoned_drain_when_escapee_holds_the_pipe() -> None:
    """A reported escapee holds the pipe: the drain is abandoned after drain_wait, bytes kept."""
    result = await trio_procown.run_owned(
        py(ESCAPEE + "os.write(1, b'kept\\n')\n"),
        domain="process-group",
        escapees="report",
        drain_wait=0.2,
    )
    pid = int(result.stdout.split()[1])
    try:
        assert result.receipt.output == "abandoned"
        assert b"kept" in result.stdout
        assert any("abandoned" in c for c in result.receipt.claims())
    finally:
        kill_and_wait(pid)


async def test_lossless_stream_slows_the_command_instead_of_losing_bytes() -> None:
    """A lossless consumer far slower than the command receives every byte, in order."""
    total = 4 << 20
    code = (
        "import os\n"
        "block = bytes(range(256)) * 256\n"
        f"for _ in range({total} // len(block)):\n"
        "    os.write(1, block)\n"
    )
    received = bytearray()
    async with trio_procown.open_owned_command(py(code), max_output=64 << 10) as run:
        async with run.stream("stdout", lossless=True) as chunks:
            async for chunk in chunks:
                received += chunk
                await trio.sleep(0.001)  # a slow consumer (the point of the test)
            assert chunks.skipped == 0
        receipt = await run.wait()
    assert len(received) == total
    assert bytes(received) == (bytes(range(256)) * 256) * (total // 65536)
    assert receipt.output == "truncated"  # the record kept head and tail only


async def test_closing_a_lossless_stream_releases_the_command() -> None:
    """A lossless consumer that stops early and closes no longer holds the command back."""
    code = "import os\nfor _ in range(200):\n    os.write(1, b'x' * 65536)\n"
    async with trio_procown.open_owned_command(py(code), max_output=1 << 16, timeout=30) as run:
        async with run.stream("stdout", lossless=True) as chunks:
            async for _ in chunks:
                break
        receipt = await run.wait()
    assert receipt.cause == "exited"
    (stdout,) = [s for s in receipt.streams if s.name == "stdout"]
    assert stdout.captured == 200 * 65536


@pytest.mark.parametrize("target", ["devnull", "file"])
async def test_uncaptured_output_is_not_claimed_complete(target: str, tmp_path: object) -> None:
    """Nothing captured (devnull, a file): output is "not captured", and claims() says so per stream."""
    import os

    dest = "devnull" if target == "devnull" else os.path.join(str(tmp_path), "out.txt")
    result = await trio_procown.run_owned(["sh", "-c", "echo hi; echo err >&2"], stdout=dest, stderr=dest)
    r = result.receipt
    assert r.output == "not captured"
    assert {s.name: s.state for s in r.streams} == {"stdout": "not captured", "stderr": "not captured"}
    claims = " ".join(r.claims())
    assert "stdout: not captured" in claims
    assert "end of output reached" not in claims
    assert r.to_dict()["output"] == "not captured"


async def test_one_captured_stream_decides_the_output_state() -> None:
    """stdout captured, stderr to devnull: output reflects stdout, and stderr is listed as not captured."""
    result = await trio_procown.run_owned(["sh", "-c", "echo hi; echo err >&2"], stderr="devnull")
    r = result.receipt
    assert r.output == "complete"
    assert {s.name: s.state for s in r.streams} == {"stdout": "eof", "stderr": "not captured"}


async def test_output_to_an_open_fd_and_a_file_object(tmp_path: object) -> None:
    """stdout to an open fd and stderr to a file object: written there, not closed, "not captured"."""
    import os

    path = os.path.join(str(tmp_path), "out.txt")
    with open(path, "wb") as err_file:
        err_fd = err_file.fileno()
        fd = os.open(os.path.join(str(tmp_path), "fd.txt"), os.O_WRONLY | os.O_CREAT)
        try:
            result = await trio_procown.run_owned(
                ["sh", "-c", "echo to-fd; echo to-file >&2"], stdout=fd, stderr=err_file
            )
            os.fstat(fd)  # still open: the fd stays the caller's
        finally:
            os.close(fd)
    with open(os.path.join(str(tmp_path), "fd.txt")) as f:
        assert f.read() == "to-fd\n"
    with open(path) as f:
        assert f.read() == "to-file\n"
    r = result.receipt
    assert r.output == "not captured"
    assert {s.name: s.target for s in r.streams} == {
        "stdout": f"fd {fd}",
        "stderr": f"fd {err_fd}",
    }


async def test_inherit_passes_the_callers_stream() -> None:
    """stdout="inherit": the command writes to our own fd 1 (here a pipe we read), not captured."""
    import os
    import subprocess
    import sys

    code = (
        "import functools, trio, trio_procown\n"
        "r = trio.run(functools.partial(trio_procown.run_owned, ['echo', 'through'], stdout='inherit'))\n"
        "print(r.receipt.streams[0].state, r.receipt.streams[0].target, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=30, check=True, env=os.environ
    )
    assert done.stdout.decode().splitlines() == ["through", "not captured inherited"]


@pytest.mark.parametrize("target", [-1, True, 3.5])
async def test_bad_output_fd_is_refused_before_spawning(target: object) -> None:
    """A negative fd, a bool or a float as an output target raises before anything runs."""
    with pytest.raises((ValueError, TypeError), match="stdout"):
        await trio_procown.run_owned(["true"], stdout=target)  # type: ignore[arg-type]


async def test_stop_reading_lets_the_command_see_a_broken_pipe() -> None:
    """stop_reading(): the read end closes, `yes` dies of SIGPIPE by itself (no signal from us), and
    the receipt says the caller closed the stream, not that the drain was abandoned after its bound."""
    import signal

    async with trio_procown.open_owned_command(["yes"], timeout=30) as run:
        async for _ in run.stream("stdout"):
            break
        run.stop_reading("stdout")
        receipt = await run.wait()
    assert (receipt.cause, receipt.returncode, receipt.output) == ("exited", -signal.SIGPIPE, "closed")
    assert not [s for s in receipt.steps if s.action is trio_procown.Action.SIGNAL]
    assert {s.name: s.state for s in receipt.streams}["stdout"] == "closed"
    claims = " ".join(receipt.claims())
    assert "reading was stopped by the caller" in claims
    assert "abandoned" not in claims
