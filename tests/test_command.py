"""The owned-command lifecycle: every way out runs the same bounded teardown."""

from __future__ import annotations

import errno
import gc
import math
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

import trio_procown
from conftest import MARKER, py
from helpers import alive, domains, kill_and_wait, pids_in
from trio_procown import _mass
from trio_procown._choice import DomainName
from trio_procown._command import OwnedOptions
from trio_procown._teardown import TEARDOWN_ALLOWANCE

DOMAINS = domains()

# A command that sleeps until stopped (the marker in its shell's argv:
# sleep itself would reject it).
SLEEPER = ["sh", "-c", "sleep 30; :", MARKER]

# Forks a grandchild that prints its pid, then both sleep; "ready" once forked.
FORK_AND_SLEEP = "sleep 30 & echo pid $!; echo early-err >&2; echo ready; sleep 30"


@pytest.fixture(params=DOMAINS)
def domain(request: pytest.FixtureRequest) -> DomainName:
    return cast(DomainName, str(request.param))  # one of domains(): a domain's name


async def _until_line(run: trio_procown.OwnedCommand, text: str) -> None:
    async for line in run.lines("stdout"):
        if line.strip() == text:
            return
    raise AssertionError(f"stream ended before {text!r}")


async def test_natural_exit(domain: DomainName) -> None:
    """A command that exits by itself: status read before any signal, nothing signalled."""
    result = await trio_procown.run_owned(["sh", "-c", "echo out; echo err >&2; exit 3"], domain=domain)
    assert (result.stdout, result.stderr, result.returncode) == (b"out\n", b"err\n", 3)
    r = result.receipt
    assert (r.cause, r.forced, r.domain_empty, r.output, r.domain) == (
        "exited",
        False,
        True,
        "complete",
        domain,
    )
    assert not [s for s in r.steps if s.action is trio_procown.Action.SIGNAL]
    assert r.claims()[0].startswith(f"The command (pid {r.pid}) exited by itself with status 3")


async def test_command_sees_the_name_it_was_given(domain: DomainName) -> None:
    """argv[0] is the name the caller gave, as execvp and subprocess give it:
    GNU tools prefix their messages with it ("ls: cannot access ..."), and a
    script's $0 is what it was called by. The program found on PATH runs."""
    result = await trio_procown.run_owned(["ls", "/nonexistent-procown-argv0"], domain=domain)
    assert result.returncode == 2
    assert result.stderr.startswith(b"ls: cannot access"), result.stderr
    result = await trio_procown.run_owned(["sh", "-c", 'echo "$0"'], domain=domain)
    assert result.stdout == b"sh\n"


async def test_timeout_kills_forked_grandchild_promptly(domain: DomainName) -> None:
    """Own timeout: no exception, grandchild terminated, early output kept, prompt return."""
    start = trio.current_time()
    async with trio_procown.open_owned_command(FORK_AND_SLEEP, timeout=0.5, domain=domain) as run:
        receipt = await run.wait()
    elapsed = trio.current_time() - start
    assert receipt.cause == "timed_out"
    assert receipt.returncode == -signal.SIGTERM
    assert receipt.domain_empty
    assert not receipt.forced
    assert elapsed < 0.5 + 1.0
    (grandchild,) = pids_in(run.stdout)
    assert not alive(grandchild)
    assert b"ready" in run.stdout
    assert run.stderr == b"early-err\n"
    assert run.receipt is receipt


async def test_outer_cancel_without_timeout_keeps_early_output(domain: DomainName) -> None:
    """An outer cancel tears down first, then Cancelled propagates; early stdout/stderr survive."""
    with trio.move_on_after(10) as outer:
        async with trio_procown.open_owned_command(FORK_AND_SLEEP, domain=domain) as run:
            await _until_line(run, "ready")
            outer.cancel()
            await run.wait()
            pytest.fail("wait() returned under a cancelled scope")
    assert outer.cancelled_caught
    assert run.receipt is not None
    assert run.receipt.cause == "cancelled"
    assert run.receipt.domain_empty
    assert b"ready" in run.stdout
    assert run.stderr == b"early-err\n"
    (grandchild,) = pids_in(run.stdout)
    assert not alive(grandchild)


async def test_deadline_in_outer_scope(domain: DomainName) -> None:
    """trio.move_on_after around the block: the receipt says cancelled and the body never resumes."""
    with trio.move_on_after(0.5):
        async with trio_procown.open_owned_command("echo early; sleep 30", domain=domain) as run:
            await run.wait()
    assert run.receipt is not None
    assert run.receipt.cause == "cancelled"
    assert run.stdout == b"early\n"


async def test_sigterm_ignoring_members_holding_pipes_are_forced(domain: DomainName) -> None:
    """Members that ignore SIGTERM and hold the pipes: SIGKILL after grace, bounded, output kept."""
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        os.write(1, b'pid %d\\n' % os.getpid()); time.sleep(60); os._exit(0)\n"
        "time.sleep(0.2); print('ready', flush=True); time.sleep(60)\n"
    )
    start = trio.current_time()
    async with trio_procown.open_owned_command(
        py(code), timeout=1.5, grace=0.3, kill_wait=1.0, domain=domain
    ) as run:
        receipt = await run.wait()
    elapsed = trio.current_time() - start
    assert receipt.cause == "timed_out"
    assert receipt.forced
    assert receipt.domain_empty
    assert receipt.returncode == -signal.SIGKILL
    assert elapsed < 1.5 + 0.3 + 1.0 + 0.5 + 1.0
    members = pids_in(run.stdout)
    assert len(members) == 3
    assert not any(alive(p) for p in members)
    kills = [
        s for s in receipt.steps if s.action is trio_procown.Action.SIGNAL and "KILL" in s.detail.upper()
    ]
    assert kills


async def test_stopped_member_is_terminated_by_sigterm_with_sigcont(domain: DomainName) -> None:
    """A SIGSTOPped member gets SIGCONT with SIGTERM: it dies without the grace being spent."""
    with trio.CancelScope() as outer:
        async with trio_procown.open_owned_command(
            "sleep 30 & echo pid $!; kill -STOP $!; echo ready; sleep 30", grace=5.0, domain=domain
        ) as run:
            await _until_line(run, "ready")
            (member,) = pids_in(run.stdout)
            run_start = trio.current_time()
            outer.cancel()
            await run.wait()
    assert run.receipt is not None
    assert not run.receipt.forced
    assert run.receipt.domain_empty
    assert trio.current_time() - run_start < 2.0  # far below the 5 s grace
    assert not alive(member)


async def test_finished_leader_with_background_job_holding_pipes(domain: DomainName) -> None:
    """The leader exits but its background job holds stdout: prompt return, job terminated and listed."""
    start = trio.current_time()
    result = await trio_procown.run_owned("sleep 30 & echo pid $!; echo bye", domain=domain)
    assert trio.current_time() - start < 2.5
    r = result.receipt
    assert r.cause == "exited"
    assert r.returncode == 0
    (job,) = pids_in(result.stdout)
    assert not alive(job)
    assert [p.pid for p in r.leftovers] == [job]
    assert r.domain_empty
    assert any("outlived the leader" in c for c in r.claims())


async def test_background_daemon_with_redirected_output(domain: DomainName) -> None:
    """A daemon with its output redirected away outlives a clean exit: it is terminated and listed."""
    result = await trio_procown.run_owned("sleep 30 >/dev/null 2>&1 </dev/null & echo pid $!", domain=domain)
    r = result.receipt
    (daemon,) = pids_in(result.stdout)
    assert not alive(daemon)
    assert r.cause == "exited"
    assert r.output == "complete"
    assert [p.pid for p in r.leftovers] == [daemon]


async def test_second_cancel_during_grace_does_not_cut_teardown_short(domain: DomainName) -> None:
    """A second cancellation while the teardown waits out the grace changes nothing."""
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    with trio.CancelScope() as outer, trio.CancelScope() as inner:
        async with trio_procown.open_owned_command(py(code), grace=0.5, domain=domain) as run:
            await _until_line(run, "ready")
            inner.cancel()
            outer.cancel()
            await run.wait()
    assert run.receipt is not None
    assert run.receipt.cause == "cancelled"
    assert run.receipt.forced
    assert run.receipt.domain_empty
    assert not alive(run.pid)


class Boom(Exception):
    pass


async def test_body_exception_propagates_unwrapped_after_teardown(domain: DomainName) -> None:
    """An exception in the body: cause error, teardown done, the exception itself propagates."""
    with pytest.raises(Boom) as info:
        async with trio_procown.open_owned_command(FORK_AND_SLEEP, domain=domain) as run:
            await _until_line(run, "ready")
            raise Boom("body failed")
    assert type(info.value) is Boom
    assert run.receipt is not None
    assert run.receipt.cause == "error"
    (grandchild,) = pids_in(run.stdout)
    assert not alive(grandchild)


async def test_keyboard_interrupt_in_body(domain: DomainName) -> None:
    """KeyboardInterrupt raised in the body: teardown runs, cause cancelled, KI propagates."""
    with pytest.raises(KeyboardInterrupt):
        async with trio_procown.open_owned_command(FORK_AND_SLEEP, domain=domain) as run:
            await _until_line(run, "ready")
            raise KeyboardInterrupt
    assert run.receipt is not None
    assert run.receipt.cause == "cancelled"
    (grandchild,) = pids_in(run.stdout)
    assert not alive(grandchild)


async def test_fifty_concurrent_commands_cancelled_together(domain: DomainName) -> None:
    """50 commands with grandchildren, cancelled by one scope: all torn down, none left."""
    runs: list[trio_procown.OwnedCommand] = []
    ready = trio.Semaphore(0)

    async def one() -> None:
        async with trio_procown.open_owned_command(FORK_AND_SLEEP, domain=domain) as run:
            runs.append(run)
            await _until_line(run, "ready")
            ready.release()
            await run.wait()

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(one)
            for _ in range(50):
                await ready.acquire()
            scope.cancel()
    assert len(runs) == 50
    for run in runs:
        assert run.receipt is not None
        assert run.receipt.cause == "cancelled"
        assert run.receipt.domain_empty
        (grandchild,) = pids_in(run.stdout)
        assert not alive(grandchild)


async def test_body_that_does_not_wait_still_waits_for_the_command(domain: DomainName) -> None:
    """Leaving the block normally waits for the command (bounded by its timeout)."""
    async with trio_procown.open_owned_command("echo done", domain=domain) as run:
        pass
    assert run.receipt is not None
    assert run.receipt.cause == "exited"
    assert run.stdout == b"done\n"


async def test_stdin_bytes_and_default_devnull(domain: DomainName) -> None:
    """bytes are fed to stdin; the default stdin is /dev/null, never ours."""
    fed = await trio_procown.run_owned(["cat"], stdin=b"hello\n" * 1000, domain=domain)
    assert fed.stdout == b"hello\n" * 1000
    empty = await trio_procown.run_owned(["cat"], domain=domain)
    assert empty.stdout == b""
    assert empty.returncode == 0


async def test_missing_executable_raises_before_anything_runs() -> None:
    """A missing executable raises FileNotFoundError (an OSError)."""
    with pytest.raises(FileNotFoundError):
        await trio_procown.run_owned(["no-such-command-procown-test"])
    with pytest.raises(FileNotFoundError):
        await trio_procown.run_owned(["/no/such/path/cmd"])


async def test_not_executable_raises_permission_error(tmp_path: object) -> None:
    """A file without execute permission raises PermissionError."""
    path = os.path.join(str(tmp_path), "script")
    with open(path, "w") as f:
        f.write("#!/bin/sh\necho hi\n")
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError):
        await trio_procown.run_owned([path])


async def test_bad_cwd_raises() -> None:
    """A cwd that does not exist raises FileNotFoundError; a file as cwd NotADirectoryError."""
    with pytest.raises(FileNotFoundError):
        await trio_procown.run_owned(["true"], cwd="/no/such/dir")
    with pytest.raises(NotADirectoryError):
        await trio_procown.run_owned(["true"], cwd=sys.executable)


async def test_cwd_is_used(tmp_path: object) -> None:
    """The command runs in the given directory."""
    result = await trio_procown.run_owned(["pwd"], cwd=str(tmp_path))
    assert result.stdout.decode().strip() == os.path.realpath(str(tmp_path))


@pytest.mark.parametrize("name", ["timeout", "grace", "kill_wait", "drain_wait"])
@pytest.mark.parametrize("value", [-1, -0.001, math.nan])
async def test_bad_budgets_raise_value_error(name: str, value: float) -> None:
    """Negative or NaN budgets raise ValueError before anything is spawned."""
    with pytest.raises(ValueError, match=name):
        await trio_procown.run_owned(["true"], **cast(OwnedOptions, {name: value}))


@pytest.mark.parametrize("name", ["grace", "kill_wait", "drain_wait"])
async def test_infinite_teardown_budgets_are_refused(name: str) -> None:
    """An infinite grace, kill_wait or drain_wait would make the teardown unbounded: ValueError."""
    with pytest.raises(ValueError, match=name):
        await trio_procown.run_owned(["true"], **cast(OwnedOptions, {name: math.inf}))


async def test_infinite_timeout_means_no_deadline() -> None:
    """timeout=math.inf is no deadline of its own (like None); the teardown stays bounded."""
    result = await trio_procown.run_owned(["true"], timeout=math.inf)
    assert result.receipt.cause == "exited"


@pytest.mark.parametrize("value", [True, False, 1.5, "1024"])
async def test_non_integer_max_output_is_refused(value: object) -> None:
    """max_output takes an int of bytes: a bool, a float or a str raises ValueError before spawning."""
    with pytest.raises(ValueError, match="max_output"):
        await trio_procown.run_owned(["true"], max_output=value)  # type: ignore[arg-type]


async def test_zero_timeout_times_out_immediately(domain: DomainName) -> None:
    """timeout=0 is legal: the command is torn down at once."""
    result = await trio_procown.run_owned("sleep 30", timeout=0, domain=domain)
    assert result.receipt.cause == "timed_out"
    assert result.receipt.domain_empty


async def test_phase_goes_running_tearing_down_done(domain: DomainName) -> None:
    """run.phase moves through running, tearing down, done."""
    seen: list[str] = []
    async with trio_procown.open_owned_command("sleep 30", timeout=0.2, domain=domain) as run:
        seen.append(run.phase.value)
        await run.phase.wait_value("tearing down")
        seen.append("tearing down")
        await run.wait()
        seen.append(run.phase.value)
    assert seen == ["running", "tearing down", "done"]


async def test_phase_asked_for_late_says_where_the_command_is(domain: DomainName) -> None:
    """run.phase is made on first use: asked for only after the command
    ended, it says "done" at once, and a program that never asks for it
    runs commands without importing trio_util."""
    async with trio_procown.open_owned_command("exit 0", domain=domain) as run:
        await run.wait()
    assert run.phase.value == "done"
    with trio.fail_after(5):
        await run.phase.wait_value("done")
    code = (
        "import sys, trio, trio_procown\n"
        f"trio.run(lambda: trio_procown.run_owned(['true'], domain={domain!r}))\n"
        "assert 'trio_util' not in sys.modules\n"
    )
    done = await trio.run_process([sys.executable, "-c", code], check=False, capture_stderr=True)
    assert done.returncode == 0, done.stderr.decode()


async def test_receipt_to_dict_is_json_ready(domain: DomainName) -> None:
    """to_dict() round-trips through JSON with the documented keys."""
    import json

    result = await trio_procown.run_owned("echo hi", domain=domain)
    data = json.loads(json.dumps(result.receipt.to_dict()))
    for key in (
        "cause",
        "returncode",
        "domain",
        "forced",
        "domain_empty",
        "output",
        "escaped",
        "steps",
        "claims",
    ):
        assert key in data
    assert data["cause"] == "exited"


async def test_owned_command_cannot_be_built_directly() -> None:
    """OwnedCommand has a private constructor."""
    with pytest.raises(TypeError):
        trio_procown.OwnedCommand(object())  # type: ignore[call-arg]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
async def test_first_signal_is_the_callers_choice(domain: DomainName, sig: int) -> None:
    """first_signal replaces SIGTERM in the graceful stage (SIGCONT still follows); the step says so."""
    name = signal.Signals(sig).name
    code = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"signal.signal(signal.{name}, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    async with trio_procown.open_owned_command(py(code), domain=domain, grace=5, first_signal=sig) as run:
        await _until_line(run, "ready")
        receipt = await run.terminate()
    assert (receipt.returncode, receipt.forced) == (7, False)
    graceful = next(s for s in receipt.steps if s.action is trio_procown.Action.SIGNAL)
    assert graceful.signals == (name, "SIGCONT")


async def test_first_signal_zero_sends_nothing_then_forces() -> None:
    """first_signal=0 (GNU timeout's -s 0) sends no graceful signal: after the grace, SIGKILL."""
    result = await trio_procown.run_owned(["sleep", "30"], timeout=0.1, grace=0.2, first_signal=0)
    r = result.receipt
    assert (r.forced, r.returncode) == (True, -signal.SIGKILL)
    first = next(s for s in r.steps if s.action is trio_procown.Action.SIGNAL)
    assert first.signals == ()


@pytest.mark.parametrize("value", [9999, -1])
async def test_unknown_first_signal_is_refused(value: int) -> None:
    """A number that is no signal raises ValueError before anything is spawned."""
    with pytest.raises(ValueError, match="first_signal"):
        await trio_procown.run_owned(["true"], first_signal=value)


async def test_spawn_errors_are_the_oses_own(tmp_path: Path) -> None:
    """A program or cwd that cannot be used raises the OSError subclass
    exec(2) would (as subprocess does), naming the file once; a NUL inside
    an argument or the cwd is a ValueError, before anything runs."""
    with pytest.raises(NotADirectoryError) as not_dir:
        await trio_procown.run_owned(["/etc/passwd/x"])
    assert str(not_dir.value).count("/etc/passwd/x") == 1
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OSError, match="symbolic links") as looped:
        await trio_procown.run_owned([str(loop / "x")])
    assert looped.value.errno == errno.ELOOP
    with pytest.raises(ValueError, match="null byte"):
        await trio_procown.run_owned(["tr\0ue"])
    with pytest.raises(ValueError, match="null byte"):
        await trio_procown.run_owned(["true"], cwd="/tm\0p")
    with pytest.raises(FileNotFoundError) as bad_cwd:
        await trio_procown.run_owned(["./x"], cwd=str(tmp_path / "nowhere"))
    assert bad_cwd.value.filename == str(tmp_path / "nowhere")  # the cwd is to blame, not ./x
    with pytest.raises(FileNotFoundError) as missing:
        await trio_procown.run_owned(["no-such-command-procown-test"])
    assert str(missing.value).count("no-such-command-procown-test") == 1
    # The OS's words first (what subprocess says, and code written for it matches), then which input:
    assert missing.value.strerror == "No such file or directory (executable not found on PATH)"
    assert bad_cwd.value.strerror == "No such file or directory (cwd does not exist)"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "plain").write_text("not a program\n")
    with pytest.raises(PermissionError, match=r"^\[Errno 13\] Permission denied"):  # EACCES, as execvp
        await trio_procown.run_owned(["plain"], env={"PATH": str(tmp_path / "bin")})


def test_a_bare_name_is_found_as_execvp_finds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup on PATH skips a folder of that name, a file we may not
    execute and a missing folder, takes the first program, and reads an
    empty entry as the current folder: shutil.which's answers."""
    from trio_procown._spawn import on_path

    (tmp_path / "a" / "prog").mkdir(parents=True)  # a folder called prog
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "prog").write_text("#!/bin/sh\n")  # not executable
    for name in ("c", "d"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "prog").write_text("#!/bin/sh\n")
        (tmp_path / name / "prog").chmod(0o755)
    path = os.pathsep.join(str(tmp_path / n) for n in ("missing", "a", "b", "c", "d"))
    found = on_path("prog", path)
    assert found is not None
    assert os.path.samefile(found, tmp_path / "c" / "prog")
    assert shutil.which("prog", path=path) == str(tmp_path / "c" / "prog")
    assert on_path("nothing", path) is None
    monkeypatch.chdir(tmp_path / "d")
    empty = on_path("prog", os.pathsep + str(tmp_path / "c"))
    assert empty is not None
    assert os.path.samefile(empty, tmp_path / "d" / "prog")
    assert on_path("prog", "") is not None  # PATH set but empty: the current folder, as execvp
    monkeypatch.chdir(tmp_path)
    assert on_path("prog", "", cwd=tmp_path / "d") == "./prog"  # counted from where the command runs
    assert on_path("prog", "", cwd=tmp_path / "b") is None


def test_a_name_not_found_reports_what_execvp_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare name found nowhere raises what execvp(3) and subprocess
    report: EACCES (PermissionError) when a folder on PATH could not be
    searched or a file of that name cannot be run, even if another folder
    said ENOENT or ENOTDIR; an error of another kind (a symlink loop)
    stops the search with itself; ENOENT only when every folder said so.
    procown timeout's status follows (126, not 127). Root may search any
    folder, so the unsearchable one is an os.stat that answers EACCES."""
    from trio_procown._spawn import resolve_argv
    from trio_procown._timeout import exec_error

    locked = tmp_path / "locked"
    locked.mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path).startswith(f"{locked}{os.sep}"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    name = "procown-nowhere"
    folders = [str(tmp_path / "missing"), str(tmp_path / "file"), str(locked), str(tmp_path / "empty")]
    path = os.pathsep.join(folders)
    with pytest.raises(PermissionError) as denied:
        resolve_argv([name], None, path)
    assert denied.value.filename == str(locked / name)
    assert denied.value.strerror == "Permission denied (not found on PATH; a folder on it cannot be searched)"
    assert exec_error(name, {"PATH": path}) == errno.EACCES
    with pytest.raises(OSError, match="while looking on PATH") as looped:
        resolve_argv([name], None, os.pathsep.join([str(tmp_path / "loop" / "x"), str(locked)]))
    assert looped.value.errno == errno.ELOOP
    everywhere_enoent = os.pathsep.join(folders[:2] + folders[3:])
    with pytest.raises(FileNotFoundError):
        resolve_argv([name], None, everywhere_enoent)
    assert exec_error(name, {"PATH": everywhere_enoent}) == errno.ENOENT


async def test_every_command_form_a_user_would_pass(tmp_path: Path) -> None:
    """A path-like alone is one program; bytes and path-like arguments are
    decoded; any iterable is read once; a bytes cwd and a bytes-keyed PATH
    work as in subprocess. A bytes or int command is a clear TypeError."""
    true = Path(shutil.which("true") or "/bin/true")
    assert (await trio_procown.run_owned(true)).returncode == 0
    assert (await trio_procown.run_owned([b"echo", Path("x"), "y"])).stdout == b"x y\n"
    assert (await trio_procown.run_owned(a for a in ["echo", "once"])).stdout == b"once\n"  # type: ignore[arg-type]
    assert (await trio_procown.run_owned(["pwd"], cwd=os.fsencode(tmp_path))).stdout == os.fsencode(  # type: ignore[arg-type]
        f"{tmp_path}\n"
    )
    (tmp_path / "bin").mkdir()
    only = tmp_path / "bin" / "only-here"
    only.write_text("#!/bin/sh\necho found\n")
    only.chmod(0o755)
    found = await trio_procown.run_owned(["only-here"], env={b"PATH": os.fsencode(tmp_path / "bin")})  # type: ignore[dict-item]
    assert found.stdout == b"found\n"
    with pytest.raises(TypeError, match="not bytes"):
        await trio_procown.run_owned(b"echo hi")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not int"):
        await trio_procown.run_owned(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("domain", domains())
async def test_a_mass_cancel_beyond_a_wake_chunk_ends_every_command_within_its_bound(
    domain: DomainName, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More commands than _mass.WAKE_CHUNK cancelled together by one scope
    (their teardowns are woken by the turns' pump, not in the cancel's own
    batch): every block returns within its teardown bound, every receipt says
    cancelled, and each domain was proved empty."""
    from trio_procown import _mass

    put_off: list[bool] = []
    real_wake_soon = _mass.wake_soon

    def counting_wake_soon(wake: Any) -> None:
        put_off.append(_mass.under_way() + _mass._asked > _mass.WAKE_CHUNK)
        real_wake_soon(wake)

    monkeypatch.setattr(_mass, "wake_soon", counting_wake_soon)
    count = _mass.WAKE_CHUNK + 24
    runs: list[trio_procown.OwnedCommand] = []
    ends: list[float] = []
    ready = 0
    all_ready = trio.Event()

    async def one() -> None:
        nonlocal ready
        try:
            async with trio_procown.open_owned_command(
                ["sh", "-c", "sleep 30 & echo ready; wait", MARKER],
                domain=domain,
                grace=1.0,
                kill_wait=0.5,
                drain_wait=0.5,
                stderr="devnull",
            ) as run:
                runs.append(run)
                async for _ in run.lines():
                    break
                ready += 1
                if ready == count:
                    all_ready.set()
                await trio.sleep_forever()
        finally:
            ends.append(trio.current_time())

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
            await all_ready.wait()
            cancelled_at = trio.current_time()
            nursery.cancel_scope.cancel()
    assert len(ends) == count
    bound = runs[0].teardown_bound
    assert max(ends) - cancelled_at <= bound + TEARDOWN_ALLOWANCE  # the documented scheduling noise
    receipts = [run.receipt for run in runs]
    assert all(r is not None and r.cause == "cancelled" for r in receipts)
    assert all(r is not None and r.domain_empty for r in receipts)
    assert put_off.count(True) >= 20  # the pump woke those


@pytest.mark.parametrize("domain", DOMAINS)
async def test_signal_domain_reaches_every_member_and_is_noted(domain: DomainName) -> None:
    """signal_domain sends the signal to the whole tree (the shell and its
    background child both die of SIGUSR1), notes it as the caller's in the
    receipt, and sends nothing once the teardown has released the domain."""
    async with trio_procown.open_owned_command(
        ["sh", "-c", "sleep 30 & echo pid $!; wait", MARKER],
        domain=domain,
    ) as run:
        async for line in run.lines():
            (child,) = pids_in(line.encode() + b"\n")
            break
        assert run.signal_domain(signal.SIGUSR1)
        receipt = await run.wait()
    try:
        assert receipt.returncode == -signal.SIGUSR1
        assert not alive(child)
        caller = [s for s in receipt.steps if s.detail.endswith(", sent by the caller")]
        assert [s.signals for s in caller] == [("SIGUSR1", "SIGCONT")]
        assert receipt.cause == "exited"
        assert not run.signal_domain(signal.SIGUSR1)  # released: nothing of it may be signalled
    finally:
        kill_and_wait(child)


@pytest.mark.parametrize("domain", DOMAINS)
async def test_pass_fds_are_inherited_and_nothing_else(domain: DomainName) -> None:
    """pass_fds: the descriptors named reach the command (readable there), an
    inheritable one not named does not (as subprocess's close_fds); a closed
    one is EBADF before anything runs, and a Slurm job refuses them."""
    from trio_procown._spawn import check_pass_fds

    given_r, given_w = os.pipe()
    other_r, other_w = os.pipe()
    try:
        os.set_inheritable(other_r, True)  # inheritable, yet not named: closed in the command
        os.write(given_w, b"through the fd\n")
        os.close(given_w)
        # (by /proc/self/fd: the shell's redirections take fds 0-9 only)
        script = f"cat /proc/self/fd/{given_r}; if [ -e /proc/self/fd/{other_r} ]; then echo leaked; fi"
        done = await trio_procown.run_owned(
            ["sh", "-c", script, MARKER],
            domain=domain,
            pass_fds=[given_r],
        )
        assert (done.returncode, done.stdout) == (0, b"through the fd\n"), done.stderr
        unused = next(fd for fd in range(900, 1000) if not _is_open(fd))
        with pytest.raises(OSError, match="Bad file descriptor") as closed:
            await trio_procown.run_owned(["true"], domain=domain, pass_fds=[unused])
        assert closed.value.errno == errno.EBADF
        with pytest.raises(TypeError, match="pass_fds"):
            await trio_procown.run_owned(["true"], domain=domain, pass_fds="3")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="Slurm"):
            check_pass_fds([given_r], "slurm")
        assert check_pass_fds([0, 1, 2], "slurm") == ()
    finally:
        for fd in (given_r, other_r, other_w):
            os.close(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


async def test_a_crowds_freeze_holds_what_its_commands_made_once_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Commands started together count towards the crowd's freeze once set up: the freeze at the
    crowd's height holds the scopes their supervisors made, not only what their spawn made."""
    size = 4
    monkeypatch.setattr(_mass, "CROWD_MIN", size)
    monkeypatch.setattr(_mass, "_crowd_next", size)
    assert _mass.live() == 0
    assert not _mass.frozen()
    runs: list[trio_procown.OwnedCommand] = []
    started = trio.Event()
    release = trio.Event()

    async def one() -> None:
        async with trio_procown.open_owned_command(SLEEPER, grace=0.5) as run:
            runs.append(run)
            if len(runs) == size:
                started.set()
            await release.wait()
            await run.terminate()

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(size):
                nursery.start_soon(one)
            await started.wait()
            with trio.fail_after(10):
                while _mass.live() < size:  # each supervisor counts itself at its first step
                    await trio.lowlevel.checkpoint()
            assert _mass.frozen()
            young = {id(obj) for obj in gc.get_objects()}  # every tracked object not frozen
            scopes = [run._life_scope for run in runs]
            assert gc.is_tracked(scopes[0])
            assert [id(scope) in young for scope in scopes] == [False] * size
            release.set()
    finally:
        release.set()
    assert all(run.receipt is not None and run.receipt.domain_empty for run in runs)
    assert not _mass.frozen()


async def test_executable_runs_in_place_of_the_program_named(domain: DomainName) -> None:
    """`executable` (as Popen's): a sequence's first item becomes only the
    program's argv[0], found on PATH like a program; a shell line runs under
    it instead of /bin/sh. Each is owned and receipted as usual."""
    named = await trio_procown.run_owned(
        ["procown-named-shell", "-c", "tr '\\0' ' ' < /proc/$$/cmdline", MARKER],
        executable="sh",
        domain=domain,
    )
    assert named.stdout.decode().split()[0] == "procown-named-shell"
    assert named.receipt.cause == "exited"
    assert named.receipt.domain_empty
    line = await trio_procown.run_owned(  # a Python line: only Python runs it
        f"import os; print(os.readlink('/proc/self/exe'))  # {MARKER}",
        executable=os.fsencode(sys.executable),  # type: ignore[arg-type]
        domain=domain,
    )
    assert line.stdout.decode().strip() == os.path.realpath(sys.executable)
    assert line.receipt.cause == "exited"
    assert line.receipt.domain_empty


async def test_a_bad_executable_raises_before_anything_runs(tmp_path: Path) -> None:
    """A missing or unusable `executable` raises what a missing program
    would (naming the executable, not command[0]); an empty command or a
    non-path executable are refused too."""
    with pytest.raises(FileNotFoundError) as missing:
        await trio_procown.run_owned(["sh", "-c", "true"], executable="no-such-procown-exe")
    assert missing.value.filename == "no-such-procown-exe"
    with pytest.raises(FileNotFoundError):
        await trio_procown.run_owned(["sh"], executable=str(tmp_path / "missing"))
    with pytest.raises(PermissionError):
        await trio_procown.run_owned(["sh"], executable=str(tmp_path))
    with pytest.raises(ValueError, match="empty"):
        await trio_procown.run_owned([], executable="sh")
    with pytest.raises(TypeError, match="executable must be a path"):
        await trio_procown.run_owned(["sh"], executable=3)  # type: ignore[arg-type]


@pytest.mark.usefixtures("sigchld_ignored")
async def test_a_program_that_ignores_sigchld_gets_its_command_back(domain: DomainName) -> None:
    """With SIGCHLD ignored the kernel reaps the leader at its exit: the block still ends when
    it exits (it waited for ever), returncode 0 as subprocess says, and the receipt says the
    status was lost instead of claiming status 0; the domain's rest is still torn down."""
    with trio.fail_after(10):
        result = await trio_procown.run_owned(["sh", "-c", "sleep 30 & echo pid $!; exit 3"], domain=domain)
    r = result.receipt
    (grandchild,) = pids_in(result.stdout)
    assert (result.returncode, r.cause, r.domain_empty) == (0, "exited", True)
    reap = [s for s in r.steps if s.action is trio_procown.Action.REAP and s.target == "leader"]
    assert [s.outcome for s in reap] == ["status lost"]
    assert "nobody could read" in r.claims()[0]
    assert "status 0" not in r.claims()[0]
    assert not alive(grandchild)


@pytest.mark.usefixtures("sigchld_ignored")
async def test_a_program_that_ignores_sigchld_keeps_its_timeout(domain: DomainName) -> None:
    """A timeout with SIGCHLD ignored: the leader, reaped by the kernel once signalled, no
    longer holds the group or the cgroup open, and the teardown still finds them empty."""
    with trio.fail_after(10):
        result = await trio_procown.run_owned(
            ["sh", "-c", "sleep 30 & echo pid $!; echo ready; sleep 30"], domain=domain, timeout=0.5
        )
    r = result.receipt
    (grandchild,) = pids_in(result.stdout)
    assert (r.cause, r.domain_empty, r.forced) == ("timed_out", True, False)
    assert "nobody could read" in " ".join(r.claims())
    assert not alive(grandchild)


def _blocked_signals(status: bytes) -> int:
    """SigBlk of a /proc/PID/status, as a bit mask."""
    (line,) = [row for row in status.splitlines() if row.startswith(b"SigBlk:")]
    return int(line.split()[1], 16)


async def test_a_spawn_beside_live_commands_clones_off_the_loop(
    domain: DomainName, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another command is live, the clone is made in a worker thread
    (the loop serves the others meanwhile); the command still gets the
    loop thread's signal mask, as one cloned on the loop does."""
    from trio_procown import _command

    threads: list[bool] = []
    real = _command._clone_in_worker

    def recording(*args: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(_command, "_clone_in_worker", recording)
    show = ["cat", "/proc/self/status"]  # (a shell would reset its mask; the marker is in its environment)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        alone = await trio_procown.run_owned(show, domain=domain)
        async with trio_procown.open_owned_command(SLEEPER, domain=domain) as live:
            with trio.fail_after(10):
                while _mass.live() == 0:  # its supervisor counts it at its first step
                    await trio.lowlevel.checkpoint()
            beside = await trio_procown.run_owned(show, domain=domain)
            await live.terminate()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert threads == [False]  # only the spawn beside a live command, and not on this thread
    assert _blocked_signals(beside.stdout) == _blocked_signals(alone.stdout)
    assert _blocked_signals(beside.stdout) & (1 << (signal.SIGUSR1 - 1))


async def test_a_cancel_during_an_off_loop_clone_tears_the_command_down(
    domain: DomainName, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that arrives while the worker thread clones waits for the
    clone; the block is then entered cancelled and its teardown owns what
    the clone started: cause cancelled, domain empty, nothing left."""
    from trio_procown import _command

    cloning, proceed = threading.Event(), threading.Event()
    real = _command._clone_in_worker

    def held(*args: Any) -> Any:
        cloning.set()
        proceed.wait(10)
        return real(*args)

    monkeypatch.setattr(_command, "_clone_in_worker", held)
    receipts: list[trio_procown.Receipt | None] = []

    async def second(scope: trio.CancelScope) -> None:
        with scope:
            async with trio_procown.open_owned_command(SLEEPER, domain=domain) as run:
                await run.wait()
        receipts.append(run.receipt)

    with trio.fail_after(20):
        async with trio_procown.open_owned_command(SLEEPER, domain=domain) as live:
            while _mass.live() == 0:
                await trio.lowlevel.checkpoint()
            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()
                nursery.start_soon(second, scope)
                await trio.to_thread.run_sync(cloning.wait, 10)
                scope.cancel()
                proceed.set()
            await live.terminate()
    (receipt,) = receipts
    assert receipt is not None
    assert receipt.cause == "cancelled"
    assert receipt.domain_empty


async def test_a_setup_failure_after_the_clone_leaves_no_zombie_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """When setting up a command fails after its clone (here: its output drains), the command
    is killed, and its leader, if not yet dead enough to reap, is handed to the reaper of a
    later spawn: neither a zombie for the life of the program nor a leader a census skips."""
    from trio_procown import _leader, _procfs, _spawn

    spawned: list[int] = []

    class Refused(Exception):
        pass

    def drain(*args: object, **kwargs: object) -> object:
        raise Refused

    real_leader_init = _leader.Leader.__init__

    def leader_init(self: _leader.Leader, pid: int, *args: Any, **kwargs: Any) -> None:
        spawned.append(pid)
        real_leader_init(self, pid, *args, **kwargs)

    monkeypatch.setattr(_leader.Leader, "__init__", leader_init)
    monkeypatch.setattr(_spawn, "Drain", drain)
    with pytest.raises(Refused):
        await trio_procown.run_owned(py("import time; time.sleep(30)"), domain="process-group")
    (pid,) = spawned
    assert not _procfs.held(pid)
    fd = _leader._DEFERRED.get(pid)
    if fd is not None:  # not dead yet at the reap: wait for its death, then the later spawn's reap
        os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)
        _leader.reap_deferred()
    assert pid not in _leader._DEFERRED
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie of ours left


async def test_a_plain_run_makes_no_reference_cycles(domain: DomainName) -> None:
    """A command that exits at once leaves no cyclic garbage: everything a
    run allocates is freed by reference counting, so a program's collections
    never have to find (and a full one never frees and rebuilds) any of it."""
    command = ["sh", "-c", ":", MARKER]
    await trio_procown.run_owned(command, domain=domain)  # first-use caches
    gc.collect()
    gc.disable()
    try:
        result = await trio_procown.run_owned(command, domain=domain)
        found = gc.collect()
    finally:
        gc.enable()
    assert result.returncode == 0
    assert found == 0


class _Boom(Exception):
    pass


async def test_a_leader_that_exited_before_the_body_raised_is_the_cause(domain: DomainName) -> None:
    """The leader ends by itself while its supervisor waits for it, and the
    body raises before the supervisor has run again: the cause is "exited"
    (what ended the command), the teardown still ends what outlived the
    leader, and the exception propagates unchanged."""
    raised = _Boom()
    go_read, go_write = os.pipe()
    command = ["sh", "-c", "sleep 30 & echo pid $!; read go; exit 7", MARKER]
    try:
        with pytest.raises(_Boom) as info:
            async with trio_procown.open_owned_command(
                command, domain=domain, stdin=go_read, grace=1.0
            ) as run:
                async for line in run.lines():
                    if line.startswith("pid "):
                        break
                await trio.testing.wait_all_tasks_blocked()  # the supervisor waits for the leader
                os.write(go_write, b"go\n")
                # Blocks the loop until the leader has exited, without reaping it: no task runs meanwhile.
                os.waitid(os.P_PID, run.pid, os.WEXITED | os.WNOWAIT)
                raise raised
    finally:
        os.close(go_read)
        os.close(go_write)
    assert info.value is raised
    receipt = run.receipt
    assert receipt is not None
    assert (receipt.cause, receipt.returncode) == ("exited", 7), receipt.steps
    (grandchild,) = pids_in(run.stdout)
    assert not alive(grandchild)
    assert [p.pid for p in receipt.leftovers] == [grandchild]
