"""trio_procown.run_process: trio.run_process's contract, owned.

Most tests are trio's own (trio/_tests/test_subprocess.py, trio 0.35), ported
as they apply: the arguments, results and errors are trio's. What differs is
named in each docstring; the last tests pin down the ownership itself."""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

import trio_procown
from conftest import MARKER
from helpers import alive, kill_and_wait, pids_in
from trio_procown import OwnedProcess, RunProcessOptions, run_process


def python(code: str) -> list[str]:
    return [sys.executable, "-u", "-c", "import sys; " + code, MARKER]


EXIT_TRUE = python("sys.exit(0)")
EXIT_FALSE = python("sys.exit(1)")
CAT = python("sys.stdout.buffer.write(sys.stdin.buffer.read())")
COPY_STDIN_TO_STDOUT_AND_BACKWARD_TO_STDERR = python(
    "data = sys.stdin.buffer.read(); sys.stdout.buffer.write(data); sys.stderr.buffer.write(data[::-1])"
)


def SLEEP(seconds: int) -> list[str]:
    return ["sleep", str(seconds)]


@asynccontextmanager
async def run_process_in_nursery(*args: Any, **kwargs: Any) -> AsyncIterator[OwnedProcess]:
    async with trio.open_nursery() as nursery:
        kwargs.setdefault("check", False)
        proc = await nursery.start(partial(run_process, *args, **kwargs))
        assert isinstance(proc, OwnedProcess)
        yield proc
        nursery.cancel_scope.cancel()


async def test_basic() -> None:
    """trio's test_basic, on the handle: status, repr (trio.Process's words) and no pidfd lent out."""
    async with run_process_in_nursery(EXIT_TRUE) as proc:
        await proc.wait()
    assert isinstance(proc, trio.Process)
    assert proc._pidfd is None
    assert proc.returncode == 0
    assert repr(proc) == f"<trio.Process {EXIT_TRUE}: exited with status 0>"
    async with run_process_in_nursery(EXIT_FALSE) as proc:
        await proc.wait()
    assert proc.returncode == 1
    assert repr(proc) == f"<trio.Process {EXIT_FALSE}: exited with status 1>"


async def test_repr_while_running_and_after_a_signal() -> None:
    """The repr follows trio.Process's through the process's life: its pid while it runs, the signal after."""
    async with run_process_in_nursery(SLEEP(3600)) as proc:
        assert repr(proc) == f"<trio.Process {SLEEP(3600)}: running with PID {proc.pid}>"
        proc.kill()
        await proc.wait()
        assert repr(proc) == f"<trio.Process {SLEEP(3600)}: exited with signal {int(signal.SIGKILL)}>"


async def test_auto_update_returncode() -> None:
    """trio's test_auto_update_returncode: proc._proc.wait() blocks until the process is
    gone, and returncode and repr then say so without a checkpoint (it is not reaped: the
    teardown still owns it)."""
    async with run_process_in_nursery(SLEEP(9999)) as proc:
        assert proc.returncode is None
        assert "running" in repr(proc)
        proc.kill()
        with trio.testing.assert_no_checkpoints():
            assert proc._proc.wait() == -signal.SIGKILL
        assert proc.returncode == -signal.SIGKILL
        assert "exited" in repr(proc)
        assert proc.run.receipt is None  # the teardown, not the wait, reaps it


async def test_private_popen_view_wait_times_out() -> None:
    """proc._proc.wait(timeout) raises subprocess.TimeoutExpired while the process runs, as Popen's does."""
    async with run_process_in_nursery(SLEEP(3600)) as proc:
        with pytest.raises(subprocess.TimeoutExpired):
            proc._proc.wait(timeout=0.05)
        assert proc._proc.poll() is None
        assert proc._proc.pid == proc.pid
        trio.Process.terminate(proc)  # type: ignore[arg-type]  # trio's own method, unbound, reads _proc
        assert await proc.wait() == -signal.SIGTERM


async def test_pipes() -> None:
    """trio's test_pipes: stdin, stdout and stderr as streams under nursery.start."""
    async with run_process_in_nursery(
        COPY_STDIN_TO_STDOUT_AND_BACKWARD_TO_STDERR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        msg = b"the quick brown fox jumps over the lazy dog"

        async def feed_input() -> None:
            assert proc.stdin is not None
            await proc.stdin.send_all(msg)
            await proc.stdin.aclose()

        async def check_output(stream: trio.abc.ReceiveStream, expected: bytes) -> None:
            seen = bytearray()
            async for chunk in stream:
                seen += chunk
            assert seen == expected

        assert proc.stdout is not None
        assert proc.stderr is not None
        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = trio.current_time() + 30.0
            nursery.start_soon(feed_input)
            nursery.start_soon(check_output, proc.stdout, msg)
            nursery.start_soon(check_output, proc.stderr, msg[::-1])
        assert not nursery.cancel_scope.cancelled_caught
        assert await proc.wait() == 0


async def test_interactive() -> None:
    """trio's test_interactive: back-and-forth through the pipes, receive_some(max_bytes) honoured."""
    code = (
        "idx = 0\n"
        "while True:\n"
        "    line = sys.stdin.readline()\n"
        "    if line == '': break\n"
        "    request = int(line.strip())\n"
        "    print(str(idx * 2) * request)\n"
        "    print(str(idx * 2 + 1) * request * 2, file=sys.stderr)\n"
        "    idx += 1\n"
    )
    async with run_process_in_nursery(
        python(code), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        stdout, stderr, stdin = proc.stdout, proc.stderr, proc.stdin

        async def expect(idx: int, request: int) -> None:
            async def drain_one(stream: trio.abc.ReceiveStream, count: int, digit: int) -> None:
                while count > 0:
                    result = await stream.receive_some(count)
                    assert result == (f"{digit}".encode() * len(result))
                    count -= len(result)
                assert await stream.receive_some(1) == b"\n"

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain_one, stdout, request, idx * 2)
                nursery.start_soon(drain_one, stderr, request * 2, idx * 2 + 1)

        with trio.fail_after(5):
            await stdin.send_all(b"12")
            await trio.sleep(0.1)
            await stdin.send_all(b"345\n")
            await expect(0, 12345)
            await stdin.send_all(b"100\n200\n")
            await expect(1, 100)
            await expect(2, 200)
            await stdin.send_all(b"0\n")
            await expect(3, 0)
            await stdin.send_all(b"999999")
            with trio.move_on_after(0.1) as scope:
                await expect(4, 0)
            assert scope.cancelled_caught
            await stdin.send_all(b"\n")
            await expect(4, 999999)
            await stdin.aclose()
            assert await stdout.receive_some(1) == b""
            assert await stderr.receive_some(1) == b""
            await proc.wait()
    assert proc.returncode == 0


async def test_run() -> None:
    """trio's test_run: bytes in, captured out, and trio's own validation errors word for word."""
    data = bytes(random.Random(0).randint(0, 255) for _ in range(2**18))
    result = await run_process(CAT, stdin=data, capture_stdout=True, capture_stderr=True)
    assert (result.args, result.returncode, result.stdout, result.stderr) == (CAT, 0, data, b"")
    result = await run_process(CAT, capture_stdout=True)
    assert (result.args, result.returncode, result.stdout, result.stderr) == (CAT, 0, b"", None)  # type: ignore[comparison-overlap]  # stderr not captured: None, though typed bytes
    result = await run_process(
        COPY_STDIN_TO_STDOUT_AND_BACKWARD_TO_STDERR, stdin=data, capture_stdout=True, capture_stderr=True
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, data, data[::-1])

    with pytest.raises(UnicodeError):
        await run_process(CAT, stdin="oh no, it's text")  # type: ignore[arg-type]
    pipe_stdin_error = (
        r"^stdin=subprocess\.PIPE is only valid with nursery\.start, since that's the only way to access "
        r"the pipe; use nursery\.start or pass the data you want to write directly$"
    )
    with pytest.raises(ValueError, match=pipe_stdin_error):
        await run_process(CAT, stdin=subprocess.PIPE)
    pipe_stdout_error = (
        r"^stdout=subprocess\.PIPE is only valid with nursery\.start, "
        r"since that's the only way to access the pipe$"
    )
    with pytest.raises(ValueError, match=pipe_stdout_error):
        await run_process(CAT, stdout=subprocess.PIPE)
    with pytest.raises(ValueError, match=pipe_stdout_error.replace("stdout", "stderr", 1)):
        await run_process(CAT, stderr=subprocess.PIPE)
    with pytest.raises(ValueError, match=r"^can't specify both stdout and capture_stdout$"):
        await run_process(CAT, capture_stdout=True, stdout=subprocess.DEVNULL)
    with pytest.raises(ValueError, match=r"^can't specify both stderr and capture_stderr$"):
        await run_process(CAT, capture_stderr=True, stderr=None)


@pytest.mark.parametrize(
    "streams",
    [
        {"stdout": "OUT"},
        {"stdout": "capture"},
        {"stdout": "devnull"},
        {"stderr": "stdout"},
        {"stderr": "OUT"},
        {"stdin": "PATH"},
        {"stdin": 1.5},
        {"stdout": b"OUT"},
    ],
    ids=[
        "stdout-path",
        "stdout-capture",
        "stdout-devnull",
        "stderr-stdout",
        "stderr-path",
        "stdin-path",
        "float",
        "bytes",
    ],
)
async def test_stdio_that_popen_refuses_is_refused_as_trio(streams: dict[str, Any], tmp_path: Path) -> None:
    """A path, a name or any other value without a fileno method for a stream is refused with
    Popen's AttributeError, as trio refuses it, before anything starts: open_owned_command's own
    targets ("devnull", a path) would otherwise drop the output or create and truncate a file."""
    out = tmp_path / "out"
    given: dict[str, Any] = {}
    for name, v in streams.items():
        given[name] = {"OUT": str(out), b"OUT": str(out).encode(), "PATH": Path("/etc/hostname")}.get(v, v)
    value = next(iter(given.values()))
    with pytest.raises(AttributeError, match=rf"^'{type(value).__name__}' object has no attribute 'fileno'$"):
        await run_process(["sh", "-c", "echo out; echo err >&2", MARKER], **given)
    assert not out.exists()


async def test_validation_runs_in_trios_order_with_trios_words() -> None:
    """When a call has several faults, the one trio reports is reported: the capture conflict
    before the text options, those before the command's form; an unknown keyword in Popen's
    words; an empty command as Popen's IndexError."""
    with pytest.raises(ValueError, match=r"^can't specify both stdout and capture_stdout$"):
        await run_process("true", capture_stdout=True, stdout=subprocess.DEVNULL, text=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"the 'text' option is not supported$"):
        await run_process("true", text=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Popen\.__init__\(\) got an unexpected keyword argument 'foo'$"):
        await run_process(["true"], foo=1)  # type: ignore[call-arg]
    with pytest.raises(IndexError, match=r"^list index out of range$"):
        await run_process([])
    with pytest.raises(IndexError, match=r"^tuple index out of range$"):
        await run_process(())


@pytest.mark.parametrize(
    ("command", "options", "expected"),
    [
        (["/nonexistent/procown-x"], {}, "[Errno 2] No such file or directory: '/nonexistent/procown-x'"),
        (
            ["true"],
            {"cwd": "/nonexistent/procown-d"},
            "[Errno 2] No such file or directory: '/nonexistent/procown-d'",
        ),
        (["/etc/passwd"], {}, "[Errno 13] Permission denied: '/etc/passwd'"),
    ],
    ids=["missing", "bad-cwd", "not-executable"],
)
async def test_a_refused_spawn_says_what_popen_says(
    command: list[str], options: dict[str, Any], expected: str
) -> None:
    """A spawn the OS refuses raises the OSError subclass Popen raises, in Popen's words (the
    library's own reason is kept as a note), nothing started."""
    with pytest.raises(OSError, match=f"^{re.escape(expected)}") as caught:
        await run_process(command, **options)
    assert str(caught.value) == expected  # (pytest's match reads the notes too)
    assert type(caught.value) is type(OSError(caught.value.errno, "x"))
    assert any(note.startswith("trio_procown: ") for note in getattr(caught.value, "__notes__", []))


async def test_a_piped_streams_receive_is_trios() -> None:
    """A subprocess.PIPE stream gives an unsized receive_some() at most trio's 65536 bytes,
    refuses a max_bytes that is no int with trio's TypeError, and says what trio says once
    closed."""
    writer = python("sys.stdout.buffer.write(b'x' * 200000); sys.stdout.flush(); sys.stdin.read()")
    async with run_process_in_nursery(writer, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        got = b""
        while len(got) < 200000:
            chunk = await proc.stdout.receive_some()
            assert 0 < len(chunk) <= 65536
            got += chunk
        with pytest.raises(TypeError, match=r"^max_bytes must be integer >= 1$"):
            await proc.stdout.receive_some(1.5)  # type: ignore[arg-type]
        await proc.stdin.aclose()
        await proc.stdout.aclose()
        with pytest.raises(trio.ClosedResourceError, match=r"^file was already closed$"):
            await proc.stdout.receive_some()


async def test_run_check() -> None:
    """trio's test_run_check: CalledProcessError with the output; check=False returns it."""
    cmd = python("sys.stderr.buffer.write(b'test\\n'); sys.exit(1)")
    with pytest.raises(subprocess.CalledProcessError) as excinfo:
        await run_process(cmd, stdin=subprocess.DEVNULL, capture_stderr=True)
    assert excinfo.value.cmd == cmd
    assert excinfo.value.returncode == 1
    assert excinfo.value.stderr == b"test\n"
    assert excinfo.value.stdout is None
    assert excinfo.value.receipt.cause == "exited"  # type: ignore[attr-defined]
    result = await run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    assert (result.args, result.stdout, result.stderr, result.returncode) == (cmd, b"", b"test\n", 1)


async def test_run_with_broken_pipe() -> None:
    """trio's test_run_with_broken_pipe: a command that closes its stdin early is not an error."""
    result = await run_process([sys.executable, "-c", "import sys; sys.stdin.close()"], stdin=b"x" * 131072)
    assert result.returncode == 0
    assert result.stdout is result.stderr is None


async def test_stderr_stdout() -> None:
    """trio's test_stderr_stdout: stderr=STDOUT with a piped stdout, with run_process, and with an fd."""
    async with run_process_in_nursery(
        COPY_STDIN_TO_STDOUT_AND_BACKWARD_TO_STDERR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as proc:
        assert proc.stdio is not None
        assert proc.stdout is not None
        assert proc.stderr is None
        await proc.stdio.send_all(b"1234")
        await proc.stdio.send_eof()
        output = []
        while chunk := await proc.stdio.receive_some(16):
            output.append(chunk)
        assert b"".join(output) == b"12344321"
    assert proc.returncode == 0

    result = await run_process(
        COPY_STDIN_TO_STDOUT_AND_BACKWARD_TO_STDERR,
        stdin=b"1234",
        capture_stdout=True,
        stderr=subprocess.STDOUT,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"12344321", None)  # type: ignore[comparison-overlap]  # stderr=STDOUT: None, though typed bytes

    r, w = os.pipe()
    try:
        async with run_process_in_nursery(
            COPY_STDIN_TO_STDOUT_AND_BACKWARD_TO_STDERR,
            stdin=subprocess.PIPE,
            stdout=w,
            stderr=subprocess.STDOUT,
        ) as proc:
            os.close(w)
            assert proc.stdio is None
            assert proc.stdout is None
            assert proc.stderr is None
            assert proc.stdin is not None
            await proc.stdin.send_all(b"1234")
            await proc.stdin.aclose()
            assert await proc.wait() == 0
            assert os.read(r, 4096) == b"12344321"
            assert os.read(r, 4096) == b""
    finally:
        os.close(r)


async def test_errors() -> None:
    """trio's test_errors: text options refused, and the shell/sequence mismatch (trio's messages)."""
    with pytest.raises(TypeError, match="the 'encoding' option is not supported"):
        await run_process(["ls"], encoding="utf-8")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="command must be a string or bytes"):
        await run_process(["ls"], shell=True)
    with pytest.raises(TypeError, match="command must be a sequence"):
        await run_process("ls", shell=False)


async def test_the_handle_says_its_streams_are_bytes_as_trio_process_does() -> None:
    """OwnedProcess carries trio.Process's text attributes, at trio's values."""
    for name in ("universal_newlines", "encoding", "errors"):
        assert getattr(OwnedProcess, name) == getattr(trio.Process, name)
    async with run_process_in_nursery(EXIT_TRUE) as proc:
        assert (proc.universal_newlines, proc.encoding, proc.errors) == (False, None, None)
        await proc.wait()


async def test_executable_as_in_popen() -> None:
    """executable= as Popen (and so trio) honour it: with shell=False it runs
    in place of the program and args[0] is only its argv[0]; with
    shell=True it runs the line instead of /bin/sh. The result's args are
    the command as given."""
    named = await run_process(
        ["procown-named", "-c", "print(open('/proc/self/cmdline').read().split(chr(0))[0])", MARKER],
        executable=sys.executable,
        capture_stdout=True,
    )
    assert named.stdout == b"procown-named\n"
    assert named.args[0] == "procown-named"
    line = await run_process(
        f"import sys; sys.exit(7)  # {MARKER}", shell=True, executable=sys.executable, check=False
    )
    assert line.returncode == 7  # /bin/sh would have failed on `import`, not exited 7


@pytest.mark.parametrize(
    ("send_it", "signum"),
    [
        (OwnedProcess.kill, signal.SIGKILL),
        (OwnedProcess.terminate, signal.SIGTERM),
        (trio.Process.kill, signal.SIGKILL),  # trio's own, unbound: it reads proc._proc
        (lambda proc: proc.send_signal(signal.SIGUSR1), signal.SIGUSR1),
    ],
)
async def test_signals(send_it: Callable[[OwnedProcess], None], signum: int) -> None:
    """trio's test_signals: kill, terminate and send_signal reach the process."""
    with trio.move_on_after(1.0) as scope:
        async with run_process_in_nursery(SLEEP(3600)) as proc:
            send_it(proc)
            await proc.wait()
    assert not scope.cancelled_caught
    assert proc.returncode == -signum


async def test_custom_deliver_cancel() -> None:
    """trio's test_custom_deliver_cancel: called with the handle, cancelled once the process exited."""
    called = False

    async def custom_deliver_cancel(proc: OwnedProcess) -> None:
        nonlocal called
        called = True
        proc.terminate()
        try:
            await trio.sleep_forever()
        finally:
            assert proc.returncode is not None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(run_process, SLEEP(9999), deliver_cancel=custom_deliver_cancel))
        await wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert called


async def test_run_process_background_fail() -> None:
    """trio's test_run_process_background_fail: check=True under nursery.start raises CalledProcessError."""
    with pytest.RaisesGroup(subprocess.CalledProcessError):
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(run_process, EXIT_FALSE)
    assert proc.returncode == 1


# -- what trio's run_process does not do -------------------------------------------

# A shell that starts a grandchild in its own session (it leaves the process
# group), prints its pid, then waits.
TREE = "setsid sleep 30 & echo pid $!; sleep 30 & wait"


async def test_cancellation_ends_the_whole_tree() -> None:
    """Cancelled: trio kills the direct child only; here every process ends before Cancelled propagates."""
    with trio.move_on_after(1):
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(
                partial(run_process, TREE, shell=True, stdout=subprocess.PIPE, check=False)
            )
            assert proc.stdout is not None
            line = await proc.stdout.receive_some()
    (grandchild,) = pids_in(line)
    try:
        assert not alive(grandchild)
        receipt = proc.run.receipt
        assert receipt is not None
        assert receipt.cause == "cancelled"
    finally:
        kill_and_wait(grandchild)


async def test_deliver_cancel_is_gentler_but_never_leaves_the_tree() -> None:
    """A custom deliver_cancel that ends only the shell: the owned teardown still ends the grandchild,
    and the receipt says the command was stopped (not that it exited by itself)."""

    async def only_the_shell(proc: OwnedProcess) -> None:
        proc.send_signal(signal.SIGKILL)

    holder: dict[str, OwnedProcess] = {}
    with trio.move_on_after(1):
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(
                partial(run_process, TREE, shell=True, stdout=subprocess.PIPE, deliver_cancel=only_the_shell)
            )
            holder["proc"] = proc
            assert proc.stdout is not None
            line = await proc.stdout.receive_some()
    (grandchild,) = pids_in(line)
    try:
        assert not alive(grandchild)
        receipt = holder["proc"].run.receipt
        assert receipt is not None
        assert (receipt.cause, receipt.returncode) == ("cancelled", -signal.SIGKILL)
        assert any("deliver_cancel" in s.outcome for s in receipt.steps)
        assert not any("exited by itself" in c for c in receipt.claims())
    finally:
        kill_and_wait(grandchild)


@pytest.mark.parametrize(
    ("given", "budget"), [({}, "budget 5s (grace)"), ({"grace": 0.5}, "budget 0.5s (grace)")]
)
async def test_the_cancel_window_is_trios_five_seconds(given: RunProcessOptions, budget: str) -> None:
    """trio waits 5 s between SIGTERM and SIGKILL on cancel; the drop-in's
    teardown gives the same grace unless told otherwise (run_owned's is 2 s)."""
    with trio.move_on_after(0.2):
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(partial(run_process, SLEEP(30), check=False, **given))
    receipt = proc.run.receipt
    assert receipt is not None
    assert receipt.cause == "cancelled"
    assert [step.detail for step in receipt.steps if "(grace)" in step.detail] == [budget]


async def test_a_piped_stdin_stays_the_callers_after_the_command_exits() -> None:
    """As in trio, run_process does not close proc.stdin under the caller:
    a write after the command exited raises BrokenResourceError (EPIPE), the
    error trio code catches, not ClosedResourceError; the caller closes it."""
    async with trio.open_nursery() as nursery:
        proc = await nursery.start(partial(run_process, EXIT_TRUE, stdin=subprocess.PIPE, check=False))
        assert await proc.wait() == 0
    assert proc.stdin is not None
    with pytest.raises(trio.BrokenResourceError):
        await proc.stdin.send_all(b"after the end")
    await proc.stdin.aclose()


async def test_completed_process_carries_the_receipt_without_changing_equality_or_repr() -> None:
    """.receipt is an attribute: repr and fields are subprocess's own."""
    done = await run_process(EXIT_TRUE)
    assert isinstance(done, subprocess.CompletedProcess)
    assert repr(done) == f"CompletedProcess(args={EXIT_TRUE!r}, returncode=0)"
    assert done.receipt.cause == "exited"
    assert done.receipt.domain_empty


async def test_the_receipt_is_typed_and_the_error_is_calledprocesserror() -> None:
    """The result and the check error are subclasses that declare .receipt (a
    strict type checker sees it; this module is type-checked), with the
    fields, message, repr and pickling of subprocess's own classes."""
    done = await run_process(EXIT_TRUE, capture_stdout=True)
    assert isinstance(done, trio_procown.OwnedCompletedProcess)
    assert repr(done) == repr(subprocess.CompletedProcess(EXIT_TRUE, 0, b""))
    receipt: trio_procown.Receipt = done.receipt
    assert receipt.returncode == 0
    with pytest.raises(subprocess.CalledProcessError) as info:
        await run_process(EXIT_FALSE, capture_stderr=True)
    error = info.value
    assert isinstance(error, trio_procown.OwnedCalledProcessError)
    plain = subprocess.CalledProcessError(1, EXIT_FALSE, output=None, stderr=b"")
    assert (repr(error), str(error)) == (repr(plain), str(plain))
    assert (error.returncode, error.cmd, error.stdout, error.stderr) == (1, EXIT_FALSE, None, b"")
    assert error.receipt.returncode == 1
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.returncode, again.cmd) == (type(error), 1, EXIT_FALSE)
    assert again.receipt == error.receipt


async def test_a_deliver_cancel_written_for_trio_process_is_accepted() -> None:
    """A callback annotated for trio.Process (code written against trio) is
    called with the handle, a registered trio.Process; it type-checks too."""
    seen: list[bool] = []

    async def gentle(proc: trio.Process) -> None:
        seen.append(isinstance(proc, trio.Process))
        proc.terminate()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(run_process, SLEEP(9999), check=False, deliver_cancel=gentle))
        await wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert seen == [True]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"preexec_fn": os.getpid}, TypeError),
        ({"process_group": 1}, TypeError),
        ({"start_new_session": False}, ValueError),
        ({"close_fds": False}, ValueError),
        ({"no_such_option": 1}, TypeError),
    ],
)
async def test_options_that_would_drop_ownership_are_refused(options: dict[str, Any], error: type) -> None:
    """Options that cannot be honoured while owning the tree raise a clear error, never run unowned."""
    with pytest.raises(error, match=r"preexec_fn|process_group|start_new_session|close_fds|no_such_option"):
        await run_process(EXIT_TRUE, **options)


async def test_owned_options_are_accepted() -> None:
    """trio_procown's own knobs (grace, domain, ...) pass through to the owned command."""
    done = await run_process(EXIT_TRUE, grace=0.5, kill_wait=0.5, domain="process-group")
    assert done.receipt.domain == "process-group"
    assert trio_procown.run_process is run_process


async def test_closing_a_piped_stdout_stops_reading_as_trio_does() -> None:
    """Closing handle.stdout closes the pipe's read end: a writer that never
    stops (`yes`) gets SIGPIPE, as with trio's own pipe; a receive after the
    close raises ClosedResourceError."""
    writer = python(
        "import signal; signal.signal(signal.SIGPIPE, signal.SIG_DFL)\nwhile True: print('y' * 100)"
    )
    with trio.fail_after(10):
        async with run_process_in_nursery(writer, stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            assert await proc.stdout.receive_some(10)
            await proc.stdout.aclose()
            with pytest.raises(trio.ClosedResourceError):
                await proc.stdout.receive_some()
            assert await proc.wait() == -signal.SIGPIPE
    steps = [(step.target, step.outcome) for step in proc.run.receipt.steps]  # type: ignore[union-attr]
    assert ("stdout", "closed by the caller") in steps


async def test_closing_stdout_after_its_end_is_not_a_cut() -> None:
    """`async with proc.stdout` around a read to the end closes a stream that
    already ended: the receipt does not claim the caller cut it short."""
    async with run_process_in_nursery(python("print('done')"), stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        seen = b""
        async with proc.stdout:
            async for chunk in proc.stdout:
                seen += chunk
        assert seen == b"done\n"
        assert await proc.wait() == 0
    assert all(step.outcome != "closed by the caller" for step in proc.run.receipt.steps)  # type: ignore[union-attr]


async def test_two_tasks_receiving_at_once_is_a_busy_resource() -> None:
    """As on trio's streams, a second concurrent receive raises BusyResourceError."""
    reader = python("sys.stdin.read()")
    async with run_process_in_nursery(reader, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        stdout = proc.stdout
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stdout.receive_some)
            await wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await stdout.receive_some()
            await proc.stdin.aclose()  # the command exits; the first receive sees the end
        with pytest.raises(ValueError, match="max_bytes"):
            await stdout.receive_some(0)


@pytest.mark.parametrize("entry", ["run_process", "run_owned"])
async def test_an_already_cancelled_scope_starts_nothing(entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like trio.run_process, entering under a scope that is already cancelled
    raises Cancelled before anything is spawned: the spawner is never called."""
    from trio_procown import _command, _spawn

    calls: list[object] = []
    real_spawn = _spawn.spawn_steps

    def counting_spawn(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return real_spawn(*args, **kwargs)

    monkeypatch.setattr(_command, "spawn_steps", counting_spawn)
    for _ in range(5):
        with trio.CancelScope() as scope:
            scope.cancel()
            if entry == "run_process":
                await run_process(EXIT_TRUE)
            else:
                await trio_procown.run_owned(EXIT_TRUE)
        assert scope.cancelled_caught
    assert calls == []
    await run_process(EXIT_TRUE)  # and outside the cancelled scope it does spawn
    assert len(calls) == 1


async def test_popen_defaults_spelled_out_are_accepted() -> None:
    """Code that spells out Popen's defaults (umask=-1, restore_signals=True,
    pass_fds=(), ...) runs; a value the owned spawn cannot honour is refused,
    saying why."""
    done = await run_process(  # type: ignore[call-arg]
        EXIT_TRUE,
        umask=-1,
        restore_signals=True,
        pipesize=-1,
        pass_fds=(),
        user=None,
        group=None,
        extra_groups=None,
        process_group=None,
        creationflags=0,
        startupinfo=None,
        bufsize=0,
        text=False,
    )
    assert done.returncode == 0
    with pytest.raises(TypeError, match="umask"):
        await run_process(EXIT_TRUE, umask=0o077)
    with pytest.raises(TypeError, match="restore_signals"):
        await run_process(EXIT_TRUE, restore_signals=False)


async def test_process_group_zero_is_honoured_by_the_commands_own_session() -> None:
    """process_group=0 asks for a new group led by the command, as the
    session it always starts in gives it: the command runs, its process
    group id is its pid, and os.killpg(proc.pid, ...) reaches it."""
    done = await run_process(
        python("import os; print(os.getpgid(0) == os.getpid())"), process_group=0, capture_stdout=True
    )
    assert done.stdout == b"True\n"


async def test_pass_fds_is_honoured() -> None:
    """pass_fds, as in trio (through Popen): the named descriptor reaches the command."""
    r, w = os.pipe()
    try:
        os.write(w, b"passed")
        os.close(w)
        done = await run_process(
            python(f"sys.stdout.write(open({r}).read())"), pass_fds=(r,), capture_stdout=True
        )
        assert done.stdout == b"passed"
    finally:
        os.close(r)


async def test_the_command_forms_trio_takes(tmp_path: Any) -> None:
    """As trio.run_process (through Popen): a path-like program alone, bytes
    arguments, a bytes cwd."""
    true = shutil.which("true")
    assert true is not None
    assert (await run_process(Path(true))).returncode == 0
    done = await run_process([b"pwd"], cwd=os.fsencode(tmp_path), capture_stdout=True)
    assert done.stdout == os.fsencode(f"{tmp_path}\n")


def test_a_closed_stdin_or_stdout_of_ours_is_not_handed_on() -> None:
    """A daemon that closed its fds 0 and 1 (so trio's own fds took their
    numbers) runs a command with stdin=None and stdout inherited: the command
    gets /dev/null there, never trio's epoll or wakeup fd."""
    code = (
        "import os, sys, trio, trio_procown\n"
        "report = os.dup(1)\n"
        "os.close(0); os.close(1)\n"
        "async def main():\n"
        "    done = await trio_procown.run_process(\n"
        "        ['sh', '-c', 'echo $(readlink /proc/$$/fd/0) $(readlink /proc/$$/fd/1) >&2', sys.argv[1]],\n"
        "        stdin=None, capture_stderr=True)\n"
        "    os.write(report, done.stderr)\n"
        "trio.run(main)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, MARKER], capture_output=True, timeout=60, check=True)
    assert done.stdout.decode().split() == ["/dev/null", "/dev/null"], done.stderr


@pytest.mark.usefixtures("sigchld_ignored")
async def test_wait_returns_when_the_kernel_reaped_the_process() -> None:
    """trio's own case (test_wait_reapable_fails): with SIGCHLD ignored, a killed process's
    wait() returns, with returncode 0 since its status is unknowable, as trio and subprocess say."""
    async with trio.open_nursery() as nursery:
        proc = await nursery.start(partial(run_process, ["sh", "-c", "sleep 3600; :", MARKER], check=False))
        assert isinstance(proc, trio.Process)  # registered as a virtual subclass
        proc.kill()
        with trio.fail_after(5):
            assert await proc.wait() == 0
    assert proc.returncode == 0


async def test_wait_returns_when_the_process_exits_while_its_domain_is_torn_down() -> None:
    """trio's wait() returns once the process has exited. Ours too, also when
    the teardown that ended it goes on for what it started (here a sibling
    that ignores SIGTERM, waited for up to the grace): wait() is not the
    teardown's end."""
    ignorer = "trap '' TERM; echo ready; sleep 30; :"
    command = ["sh", "-c", f'sh -c "{ignorer}" {MARKER} & exec sleep 30', MARKER]
    seen: dict[str, object] = {}

    async def waiter(proc: OwnedProcess) -> None:
        seen["code"] = await proc.wait()
        seen["torn down"] = proc.run.receipt is not None
        proc.run.signal_domain(signal.SIGKILL)  # the teardown need not wait out its grace

    with trio.fail_after(20):
        async with trio.open_nursery() as outer, trio.open_nursery() as nursery:
            proc = await nursery.start(
                partial(run_process, command, stdout=subprocess.PIPE, check=False, grace=30)
            )
            assert proc.stdout is not None
            assert await proc.stdout.receive_some() == b"ready\n"  # its trap is set
            outer.start_soon(waiter, proc)
            await wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert seen == {"code": -signal.SIGTERM, "torn down": False}
    assert proc.run.receipt is not None
    assert proc.run.receipt.domain_empty


async def test_captured_output_is_kept_whole_as_trio_keeps_it() -> None:
    """trio.run_process keeps every captured byte; so does the drop-in, past
    the 64 MiB that bounds run_owned's capture, unless max_output is given."""
    size = (64 << 20) + 1
    command = ["sh", "-c", f"head -c {size} /dev/zero", MARKER]
    done = await run_process(command, capture_stdout=True)
    assert len(done.stdout) == size
    assert done.receipt.output == "complete"
    bounded = await run_process(command, capture_stdout=True, max_output=1024)
    assert len(bounded.stdout) == 1024
    assert bounded.receipt.output == "truncated"


@pytest.mark.parametrize(
    ("ignores", "warned"),
    [("trap '' TERM; ", True), ("", False)],
    ids=["leader-ignores-sigterm", "leader-ends-on-sigterm"],
)
async def test_a_process_killed_after_ignoring_sigterm_warns_as_trio(ignores: str, warned: bool) -> None:
    """trio's default cancel warns ("ignored SIGTERM for 5 seconds ... Trying
    SIGKILL") when the process outlived SIGTERM and had to be killed; so
    does ours, when the teardown's SIGKILL ended the direct process, and
    not when SIGTERM did (a sibling that ignores it is no business of
    trio's warning)."""
    sibling = "sh -c \"trap '' TERM; echo sibling; sleep 30; :\" & "
    script = f"{sibling}{ignores}echo leader; sleep 30; :"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                proc = await nursery.start(
                    partial(run_process, ["sh", "-c", script, MARKER], stdout=subprocess.PIPE, grace=0.2)
                )
                seen = b""
                while sorted(seen.split()) != [b"leader", b"sibling"]:
                    seen += await proc.stdout.receive_some()  # their traps are set
                nursery.cancel_scope.cancel()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    expected = [
        f"process <trio.Process {['sh', '-c', script, MARKER]!r}: running with PID {proc.pid}> "
        "ignored SIGTERM for 0.2 seconds. (Maybe you should pass a custom deliver_cancel?) Trying SIGKILL."
    ]
    assert messages == (expected if warned else [])
    assert proc.run.receipt is not None
    assert proc.run.receipt.forced  # the sibling ignored SIGTERM either way


async def test_a_custom_deliver_cancel_gets_no_warning() -> None:
    """trio warns only from its default deliver_cancel; a custom one that
    leaves the process to the SIGKILL stage gets no warning."""

    async def ignore(proc: OwnedProcess) -> None:
        await trio.sleep_forever()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(
                partial(
                    run_process,
                    ["sh", "-c", "trap '' TERM; echo ready; sleep 30; :", MARKER],
                    stdout=subprocess.PIPE,
                    deliver_cancel=ignore,
                    grace=0.2,
                    kill_wait=0.2,
                )
            )
            assert await proc.stdout.receive_some() == b"ready\n"
            nursery.cancel_scope.cancel()
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert proc.run.receipt is not None
    assert proc.run.receipt.returncode == -signal.SIGKILL


def test_no_encoding_warning_under_warn_default_encoding() -> None:
    """As trio's own test of run_process: a program run with ``-X
    warn_default_encoding -W error::EncodingWarning`` runs commands through
    us, on every domain and through the drop-in, without an EncodingWarning
    (the cgroup mount was read with the locale's default encoding)."""
    code = (
        "import sys, trio, trio_procown\n"
        "async def main():\n"
        "    for d in sys.argv[2:]:\n"
        "        await trio_procown.run_owned([sys.executable, '-c', '', sys.argv[1]], domain=d)\n"
        "    await trio_procown.run_process([sys.executable, '-c', '', sys.argv[1]])\n"
        "trio.run(main)\n"
    )
    domains = [d.name for d in trio_procown.available_domains() if d.available]
    strict = ["-X", "warn_default_encoding", "-W", "error::EncodingWarning"]
    done = subprocess.run(
        [sys.executable, *strict, "-c", code, MARKER, *domains],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, b"")
