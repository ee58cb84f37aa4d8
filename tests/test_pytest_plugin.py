"""The pytest plugin: tests that leak processes fail (or warn), leaks are terminated.

Most tests run an inner pytest with pytester. Inner tests record every
process they start deliberately (pid and start time) in pids.txt; the
`recorded` fixture kills whatever of it is still alive afterwards (only a
process with the recorded start time), so a keep/warn/off run leaves nothing
behind for the outer suite's own leak check.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio

from trio_procown import _leaks, _procfs, pytest_plugin
from trio_procown.pytest_plugin import COOKIE_ENV, ProcessLeakError

pytest_plugins = ["pytester"]

HEADER = """\
import os, subprocess, sys, time
import psutil
import pytest

PIDS = {pids!r}

def record(pid):
    with open(PIDS, "a") as f:
        f.write(f"{{pid}} {{psutil.Process(pid).create_time()}}\\n")

def spawn(*argv, env=None):
    # posix_spawn: no Popen object, so no ResourceWarning when it is collected
    pid = os.posix_spawnp(argv[0], list(argv), os.environ if env is None else env)
    record(pid)
    return pid
"""

LEAK = """
def test_leak():
    spawn("sleep", "30")
"""

# Double fork with setsid, in an exec'd interpreter: the grandchild is
# re-parented, holds no pipe of ours, and prints nothing but its pid.
DAEMON = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open(os.devnull, os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(fd, n)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        time.sleep(30)
        os._exit(0)
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode())
"""


def _recorded(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        pid, created = line.split()
        rows.append((int(pid), float(created)))
    return rows


def _alive(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _reap_if_child(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


class Recorded:
    """The processes the inner tests recorded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def pids(self) -> list[int]:
        return [pid for pid, _ in _recorded(self.path)]

    def alive(self) -> list[int]:
        return [pid for pid, created in _recorded(self.path) if _alive(pid, created)]

    def cleanup(self) -> None:
        rows = _recorded(self.path)
        for pid, created in rows:
            if _alive(pid, created):
                os.kill(pid, signal.SIGKILL)
        for pid, _ in rows:
            psutil.wait_procs([p for p in [_proc(pid)] if p is not None], timeout=3)
            _reap_if_child(pid)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@pytest.fixture
def recorded(pytester: pytest.Pytester) -> Iterator[Recorded]:
    """Where inner tests record their processes; kills the survivors at the end."""
    pytester.makeini("[pytest]\nfilterwarnings = default\n")
    rec = Recorded(pytester.path / "pids.txt")
    try:
        yield rec
    finally:
        rec.cleanup()


def _source(pytester: pytest.Pytester, body: str) -> str:
    return HEADER.format(pids=str(pytester.path / "pids.txt")) + body


@pytest.fixture(scope="module")
def cgroup_reason() -> str | None:
    """Why the cgroup mechanism is unavailable here (None when it is available)."""
    tracker = _leaks.Tracker()
    return None if tracker.cgroup_base() is not None else tracker.cgroup_note


@pytest.fixture(params=["cgroup", "cookie"])
def mechanism(request: pytest.FixtureRequest, cgroup_reason: str | None) -> str:
    """Each tracking mechanism this machine offers."""
    if request.param == "cgroup" and cgroup_reason is not None:
        pytest.skip(f"no cgroup mechanism: {cgroup_reason}")
    return str(request.param)


def test_leaked_sleep_fails_with_a_report(
    pytester: pytest.Pytester, recorded: Recorded, mechanism: str
) -> None:
    """A test that leaks `sleep 30` errors at teardown with a report naming it and its fate (terminated)."""
    pytester.makepyfile(test_leak=_source(pytester, LEAK))
    before = os.environ.get(COOKIE_ENV)
    result = pytester.runpytest("--procown-leaks=fail", f"--procown-leaks-mechanism={mechanism}")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leak*",
            "*test_leak.py::test_leak left 1 process(es) running:*",
            f"*pid {pid}: sleep 30",
            "*started by: test_leak.py::test_leak (during call); lived * s",
            f"*parent: pid {os.getpid()} (*",
            "*found by: *cookie*; fate: terminated",
        ]
    )
    if mechanism == "cgroup":
        result.stdout.fnmatch_lines(["*found by: cgroup, cookie;*"])
    assert recorded.alive() == []
    assert os.environ.get(COOKIE_ENV) == before


def test_double_forked_daemon_is_caught(
    pytester: pytest.Pytester, recorded: Recorded, mechanism: str
) -> None:
    """A daemon that double-forked and called setsid is still found, reported and terminated."""
    body = f"""
DAEMON = {DAEMON!r}

def test_daemon():
    done = subprocess.run([sys.executable, "-c", DAEMON], capture_output=True, text=True, check=True)
    record(int(done.stdout))
"""
    pytester.makepyfile(test_daemon=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=fail", f"--procown-leaks-mechanism={mechanism}")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*pid {pid}: *python*", "*found by: *cookie*; fate: terminated"])
    assert recorded.alive() == []


def test_fork_without_exec_is_caught_by_the_fork_log(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """A double fork of the test process itself (no exec, so no cookie in /proc) is found by the fork log."""
    body = """
def test_fork():
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(30)
            os._exit(0)
        os._exit(0)
    record(int(os.read(r, 64)))
"""
    pytester.makepyfile(test_fork=_source(pytester, body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail", "--procown-leaks-mechanism=cookie")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*pid {pid}: *", "*found by: fork log; fate: terminated"])
    assert recorded.alive() == []


def test_scrubbed_environment_is_caught_by_the_cgroup(
    pytester: pytest.Pytester, recorded: Recorded, cgroup_reason: str | None
) -> None:
    """A process started with an empty environment carries no cookie; the per-test cgroup still holds it."""
    if cgroup_reason is not None:
        pytest.skip(cgroup_reason)
    body = """
def test_scrubbed():
    spawn("/bin/sleep", "30", env={})
"""
    pytester.makepyfile(test_scrubbed=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=fail")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*pid {pid}: /bin/sleep 30", "*found by: cgroup; fate: terminated"])
    assert recorded.alive() == []


def test_clean_tests_pass(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """Tests that wait for what they start pass in fail mode, and the session is clean."""
    body = """
def test_subprocess():
    subprocess.run(["true"], check=True)
    with subprocess.Popen(["sleep", "0.01"]) as p:
        p.wait()

def test_fork_and_wait():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

def test_nothing():
    pass
"""
    pytester.makepyfile(test_clean=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=fail")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*procown*left*")


def test_warn_mode_passes_with_a_warning(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """Warn mode: the test passes, a ProcessLeakWarning carries the report, the sleep is terminated."""
    pytester.makepyfile(test_leak=_source(pytester, LEAK))
    result = pytester.runpytest("--procown-leaks=warn")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, warnings=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*ProcessLeakWarning: test_leak.py::test_leak left 1 process(es)*", f"*pid {pid}*"]
    )
    assert recorded.alive() == []


def test_keep_reports_without_terminating(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """--procown-leaks-keep: the leak fails the test but keeps running (listed again at the session end)."""
    pytester.makepyfile(test_leak=_source(pytester, LEAK))
    result = pytester.runpytest("--procown-leaks=fail", "--procown-leaks-keep")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*found by: *cookie*; fate: alive (kept running, as asked)"])
    result.stdout.fnmatch_lines(
        ["*procown: processes left behind*", f"still running, as asked (keep): pid {pid}"], consecutive=True
    )
    result.stdout.no_fnmatch_line("*cgroups left behind*")
    assert recorded.alive() == [pid]


def test_markers_choose_the_mode_per_test_and_module(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """Without command-line or ini options only marked tests are watched; the closest marker wins."""
    body = """
pytestmark = pytest.mark.procown_leaks("warn")

def test_module_marker_warns():
    spawn("sleep", "30")

@pytest.mark.procown_leaks("fail")
def test_own_marker_fails():
    spawn("sleep", "30")

@pytest.mark.procown_leaks("off")
def test_marked_off():
    spawn("sleep", "30")
"""
    pytester.makepyfile(test_marked=_source(pytester, body), test_plain=_source(pytester, LEAK))
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=4, errors=1, warnings=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_own_marker_fails*"])
    result.stdout.fnmatch_lines(["*ProcessLeakWarning: test_marked.py::test_module_marker_warns left*"])
    assert len(recorded.alive()) == 2  # the unwatched ones


def test_ini_option_and_command_line_override(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """The ini option activates the check; --procown-leaks=off on the command line turns it off."""
    pytester.makeini("[pytest]\nfilterwarnings = default\nprocown_leaks = fail\n")
    pytester.makepyfile(test_leak=_source(pytester, LEAK))
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["procown: leaks fail the test and are terminated; tracked by *"])
    result = pytester.runpytest("--procown-leaks=off")
    result.assert_outcomes(passed=1)
    assert len(recorded.alive()) == 1


def test_bad_modes_are_usage_errors(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """An unknown mode on the command line, in the ini file or in a marker is refused clearly."""
    body = """
@pytest.mark.procown_leaks("loud")
def test_marked():
    pass
"""
    pytester.makepyfile(test_bad=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=loud")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*procown leak mode must be one of fail, warn, off; not 'loud'*"])
    pytester.makeini("[pytest]\nprocown_leaks = loud\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_session_fixtures_are_not_blamed_but_checked_at_the_end(
    pytester: pytest.Pytester, recorded: Recorded
) -> None:
    """A session fixture's process is not the first test's leak; one never stopped fails the run."""
    body = """
@pytest.fixture(scope="session")
def server():
    p = subprocess.Popen(["sleep", "30"])
    record(p.pid)
    yield p
    p.kill()
    p.wait()

@pytest.fixture(scope="session")
def forgetful():
    spawn("sleep", "31")

def test_one(server, forgetful):
    assert server.poll() is None

def test_two(server):
    assert server.poll() is None
"""
    pytester.makepyfile(test_session=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=fail")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    forgotten = recorded.pids()[1]
    result.stdout.fnmatch_lines(
        [
            "*procown: processes left behind*",
            "the test session (outside any test) left 1 process(es) running:",
            f"*pid {forgotten}: sleep 31",
            "*started by: the test session (outside any test) (during session-scoped fixture forgetful)*",
        ]
    )
    assert recorded.alive() == []


# Pool tests run pytest in a subprocess: an in-process run re-imports
# concurrent.futures, whose pickled work items then fail to match the pool's.
POOL = """
from concurrent.futures import ProcessPoolExecutor

def worker_pid(pool):
    pid = pool.submit(os.getpid).result()
    record(pid)
    return pid
"""


def test_session_pool_workers_are_not_a_tests_leak(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """A session fixture's pool starts its workers lazily inside a test: both tests pass and keep the pool."""
    body = """
@pytest.fixture(scope="session")
def pool():
    with ProcessPoolExecutor(max_workers=1) as pool:
        yield pool

def test_first(pool):
    assert worker_pid(pool) != os.getpid()

def test_second(pool):
    assert pool.submit(pow, 2, 5).result() == 32
"""
    pytester.makepyfile(test_pool=_source(pytester, POOL + body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*left * process(es) running*")
    assert recorded.alive() == []  # shut down by the fixture


def test_a_pool_the_test_created_is_its_leak(
    pytester: pytest.Pytester, recorded: Recorded, cgroup_reason: str | None
) -> None:
    """A pool the test itself created and left running is the test's leak, named as a pool worker
    (found by the per-test cgroup too where one can be made: not as a user without one)."""
    body = """
POOLS = []

def test_own_pool():
    pool = ProcessPoolExecutor(max_workers=1)
    POOLS.append(pool)  # never shut down
    worker_pid(pool)
"""
    pytester.makepyfile(test_pool=_source(pytester, POOL + body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_own_pool*",
            f"*pid {pid}: *",
            "*what: a worker of a concurrent.futures.ProcessPoolExecutor",
            "*started by: test_pool.py::test_own_pool (during call)*",
            f"*found by: {'fork log' if cgroup_reason else 'cgroup, fork log'}; fate: terminated",
        ]
    )
    assert recorded.alive() == []


def test_a_spared_pool_never_shut_down_is_reported_at_the_end(
    pytester: pytest.Pytester, recorded: Recorded
) -> None:
    """A session pool's workers alive after the session are its leak, naming the test that started them."""
    body = """
POOLS = []

@pytest.fixture(scope="session")
def pool():
    POOLS.append(ProcessPoolExecutor(max_workers=1))  # never shut down, still referenced
    return POOLS[-1]

def test_uses_pool(pool):
    worker_pid(pool)
"""
    pytester.makepyfile(test_pool=_source(pytester, POOL + body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*procown: processes left behind*",
            "the test session (outside any test) left 1 process(es) running:",
            f"*pid {pid}: *",
            "*what: a worker of a concurrent.futures.ProcessPoolExecutor held by session-scoped fixture pool",
            "*started by: test_pool.py::test_uses_pool (during call)*",
        ]
    )
    assert recorded.alive() == []


REGISTRY = """
@pytest.fixture(scope="session")
def registry():
    procs = {}
    yield procs
    if STOP_AT_END:
        for p in procs.values():
            p.terminate()
            p.wait()

@pytest.fixture
def server(registry):  # function-scoped, so it runs inside the first test's window
    if "srv" not in registry:
        registry["srv"] = subprocess.Popen(["sleep", "30"])
        record(registry["srv"].pid)
    return registry["srv"]

def test_first(server):
    assert server.poll() is None

def test_second(server):
    assert server.poll() is None
"""


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "never-stopped"])
def test_a_process_a_broader_fixture_holds_is_not_a_tests_leak(
    pytester: pytest.Pytester, recorded: Recorded, stopped: bool
) -> None:
    """execnet's pattern: a function fixture starts a process into a session
    fixture's registry. It is the session's, not the first test's (which
    must not kill it under the second): spared, then checked at the end."""
    pytester.makepyfile(test_registry=_source(pytester, f"STOP_AT_END = {stopped}\n" + REGISTRY))
    result = pytester.runpytest("--procown-leaks=fail")
    result.assert_outcomes(passed=2)
    if stopped:
        assert result.ret == pytest.ExitCode.OK
        result.stdout.no_fnmatch_line("*left * process(es) running*")
    else:
        (pid,) = recorded.pids()
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(
            [
                "the test session (outside any test) left 1 process(es) running:",
                f"*pid {pid}: sleep 30",
                "*what: a subprocess.Popen held by session-scoped fixture registry",
                "*started by: test_registry.py::test_first (during setup)*",
            ]
        )
    assert recorded.alive() == []


# A library's process-wide helper, as jedi keeps its inference subprocess:
# a module-level cache -> an object -> its memo dict -> the Popen, started
# by the first call and reused by every later one, ended at exit.
HELPER_LIB = """
import atexit, subprocess

class Helper:
    def __init__(self):
        self._memo = {}

    def process(self, start):
        if "proc" not in self._memo:
            self._memo["proc"] = start()
            atexit.register(self._memo["proc"].kill)
        return self._memo["proc"]

_CACHE = {}

def helper(start):
    return _CACHE.setdefault("helper", Helper()).process(start)
"""

USES_HELPER = """
def start():
    proc = subprocess.Popen(["sleep", "30"])
    record(proc.pid)
    return proc

def test_first():
    assert helper(start).poll() is None

def test_second():
    assert helper(start).poll() is None
"""


@pytest.mark.parametrize("holder", ["library", "test module"])
def test_a_process_a_librarys_module_holds_is_not_a_tests_leak(
    pytester: pytest.Pytester, recorded: Recorded, holder: str
) -> None:
    """A process a library keeps in its module globals (jedi's helper) is
    the pytest process's, as multiprocessing's forkserver is: not the
    first test's leak, and not killed under the second. The same cache in a
    test module is the tests' own: the first test leaked it."""
    if holder == "library":
        pytester.makepyfile(helperlib=HELPER_LIB)
        pytester.makepyfile(test_helper=_source(pytester, "from helperlib import helper\n" + USES_HELPER))
    else:
        pytester.makepyfile(test_helper=_source(pytester, HELPER_LIB + USES_HELPER))
    result = pytester.runpytest_subprocess("--procown-leaks=fail", "-p", "no:cacheprovider")
    (pid,) = recorded.pids()
    if holder == "library":
        result.assert_outcomes(passed=2)
        assert result.ret == pytest.ExitCode.OK
        result.stdout.no_fnmatch_line("*left * process(es) running*")
        result.stdout.fnmatch_lines(
            [
                "still running, a library's helper (the library's to end at exit): "
                f"pid {pid} (a subprocess.Popen held by module helperlib, not by the tests)"
            ]
        )
    else:
        result.assert_outcomes(passed=1, failed=1, errors=1)
        result.stdout.fnmatch_lines(
            ["*ERROR at teardown of test_first*", f"*pid {pid}: sleep 30", "*fate: terminated"]
        )
    assert recorded.alive() == []  # ended at the inner run's exit, or by the plugin


# loky's resource tracker, as far as the plugin can see it: started once for the
# process on first use, known to loky by its pid alone (no handle), and deaf to SIGTERM.
LOKY_TRACKER = """
import subprocess

class ResourceTracker:
    def __init__(self):
        self._pid = None

    def ensure_running(self, start):
        if self._pid is None:
            self._pid = start()

_resource_tracker = ResourceTracker()
"""

USES_LOKY = """
import sys
from loky.backend import resource_tracker

def start():
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", deaf])
    record(proc.pid)
    return proc.pid

def test_first():
    resource_tracker._resource_tracker.ensure_running(start)

def test_second():
    resource_tracker._resource_tracker.ensure_running(start)
"""


@pytest.mark.parametrize("package", ["loky", "joblib.externals.loky"])
def test_lokys_resource_tracker_is_the_processs_helper(
    pytester: pytest.Pytester, recorded: Recorded, package: str
) -> None:
    """loky's resource tracker (joblib's too), which loky knows only by its pid, is the
    pytest process's helper, as multiprocessing's is: not the first test's leak, nor
    killed under it (killed, it cost every later test the grace and loky's relaunch)."""
    base = pytester.path
    for part in package.split("."):
        base = base / part
        base.mkdir(exist_ok=True)
        (base / "__init__.py").write_text("")
    (base / "backend").mkdir()
    (base / "backend" / "__init__.py").write_text("")
    (base / "backend" / "resource_tracker.py").write_text(LOKY_TRACKER)
    body = USES_LOKY.replace("from loky.backend", f"from {package}.backend")
    pytester.makepyfile(test_tracker=_source(pytester, body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail", "-p", "no:cacheprovider")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*left * process(es) running*")
    assert recorded.alive() == [pid]  # never signalled: its library's, ended by it at exit (here: by us)


def test_a_handle_the_tests_still_hold_is_their_leak(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """A leaked process whose handle is still alive is spared only when the
    run's tests do not hold it: a failed test's local (its frame is kept by
    the traceback), a test class's attribute, and a trio.Process left in a
    finished trio.run (garbage, collected first) are all still leaks."""
    body = """
import trio

def test_fails_holding_it():
    proc = subprocess.Popen(["sleep", "30"])
    record(proc.pid)
    assert False, "boom"

class TestServer:
    server = None

    def test_keeps_it_in_the_class(self):
        TestServer.server = subprocess.Popen(["sleep", "30"])
        record(TestServer.server.pid)

def test_trio_process_never_waited():
    async def main():
        proc = await trio.lowlevel.open_process(["sleep", "30"])
        record(proc.pid)

    trio.run(main)
"""
    pytester.makepyfile(test_held=_source(pytester, body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail", "-p", "no:cacheprovider", "-W", "ignore")
    result.assert_outcomes(passed=2, failed=1, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_fails_holding_it*",
            "*ERROR at teardown of TestServer.test_keeps_it_in_the_class*",
            "*ERROR at teardown of test_trio_process_never_waited*",
        ],
        consecutive=False,
    )
    result.stdout.no_fnmatch_line("*not by the tests*")
    assert recorded.alive() == []


def test_what_a_held_process_starts_is_the_holders_too(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """execnet's proxy gateway: a process a session fixture holds starts a
    child inside a test's window. The child is the holder's as well (not
    the test's leak); the holder's teardown ends both."""
    body = """
import sys

GATEWAY = (
    "import subprocess, sys\\n"
    "child = subprocess.Popen(['sleep', '30'])\\n"
    "print(child.pid, flush=True)\\n"
    "sys.stdin.read()\\n"
    "child.kill(); child.wait()\\n"
)

@pytest.fixture(scope="session")
def group():
    held = []
    yield held
    for p in held:
        p.stdin.close()
        p.wait()

def test_first(group):
    p = subprocess.Popen([sys.executable, "-c", GATEWAY], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    group.append(p)
    record(p.pid)
    record(int(p.stdout.readline()))

def test_second(group):
    assert group[0].poll() is None
"""
    pytester.makepyfile(test_proxy=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=fail")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    assert len(recorded.pids()) == 2
    assert recorded.alive() == []


def test_a_process_on_its_way_out_is_not_a_leak(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """A process the test killed but did not wait for (SIGKILL pending, not
    yet a zombie), or told to exit and did not wait for, is not reported:
    it ends within the window's settle time by itself. One that does not end
    still is."""
    body = """
import sys

@pytest.mark.parametrize("n", range(20))
def test_killed_not_waited(n):
    p = subprocess.Popen(["sleep", "30"])
    record(p.pid)
    p.kill()

def test_told_to_exit_not_waited():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    record(p.pid)
    p.stdin.close()

def test_really_left():
    p = subprocess.Popen(["sleep", "30"])
    record(p.pid)
"""
    pytester.makepyfile(test_exiting=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=fail")
    result.assert_outcomes(passed=22, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_really_left*"])
    assert recorded.alive() == []


def test_no_leaks_in_a_plain_script() -> None:
    """trio_procown.NoLeaks needs no pytest: a script's leaking block raises ProcessLeakError."""
    script = """
import subprocess, sys
import trio_procown

try:
    with trio_procown.NoLeaks(owner="the script's block"):
        proc = subprocess.Popen(["sleep", "30"])
except trio_procown.ProcessLeakError as exc:
    (leak,) = exc.leaks
    assert isinstance(exc, AssertionError) and "the script's block left 1 process(es)" in str(exc)
    print(leak.pid == proc.pid, leak.fate)
    proc.wait()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30, check=False)
    assert done.stdout == b"True terminated\n", done.stderr.decode()


def test_trio_mode_and_procown_command(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """trio_mode: leaks from async tests are caught; procown_command's receipts go to failure reports."""
    pytester.makeini("[pytest]\ntrio_mode = true\nfilterwarnings = default\n")
    body = """
import trio

async def test_fails_and_shows_the_receipt(procown_command):
    run = await procown_command(["sleep", "30"])
    record(run.pid)
    assert False, "boom"

async def test_owned_commands(procown_command):
    result = await procown_command.run(["sh", "-c", "echo hi"])
    assert result.stdout == b"hi\\n"
    run = await procown_command(["sleep", "30"])
    receipt = await procown_command.stop(run)
    assert receipt.cause == "cancelled" and receipt.domain_empty
    assert len(procown_command.receipts) == 2

async def test_async_leak():
    await trio.sleep(0)
    spawn("sleep", "30")
"""
    pytester.makepyfile(test_trio=_source(pytester, body))
    result = pytester.runpytest("--procown-leaks=fail")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*procown receipts*", "$ sleep 30", "cause=cancelled *", "*was cancelled*"], consecutive=False
    )
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_async_leak*"])
    assert recorded.alive() == []


def test_xdist_workers(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """Under pytest-xdist each worker watches its tests; the report reaches the controller."""
    pytest.importorskip("xdist")
    body = """
@pytest.mark.parametrize("n", range(3))
def test_clean(n):
    subprocess.run(["true"], check=True)
"""
    pytester.makepyfile(test_leak=_source(pytester, LEAK), test_clean=_source(pytester, body))
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--procown-leaks=fail")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines([f"*pid {pid}: sleep 30", "*fate: terminated"])
    assert recorded.alive() == []


EXEMPT = """
@pytest.mark.procown_leaks("off")
def test_exempt():
    spawn("sleep", "30")

def test_clean():
    pass
"""


@pytest.mark.parametrize("workers", [(), ("-p", "xdist", "-n", "2")], ids=["one process", "xdist"])
def test_off_marker_under_a_run_wide_check(
    pytester: pytest.Pytester, recorded: Recorded, workers: tuple[str, ...]
) -> None:
    """With the check on for the run, a test marked off is not checked: what it
    leaves running is neither stopped nor blamed on the session, and the end of
    the session names it (under xdist too, where the controller holds the
    session's window)."""
    if workers:
        pytest.importorskip("xdist")
    pytester.makepyfile(test_off=_source(pytester, EXEMPT))
    result = pytester.runpytest_subprocess(*workers, "--procown-leaks=fail")
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "still running, not checked (marked procown_leaks('off')): "
            f"pid {pid} (started by test_off.py::test_exempt)"
        ]
    )
    result.stdout.no_fnmatch_line("*the test session (outside any test) left*")
    assert recorded.alive() == [pid]


def test_kept_leak_under_xdist_is_not_the_sessions(pytester: pytest.Pytester, recorded: Recorded) -> None:
    """--procown-leaks-keep under xdist: the worker's test reports its leak, and
    the controller lists it as kept, not again as the session's own."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_leak=_source(pytester, LEAK))
    result = pytester.runpytest_subprocess(
        "-p", "xdist", "-n", "2", "--procown-leaks=fail", "--procown-leaks-keep"
    )
    (pid,) = recorded.pids()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"still running, as asked (keep): pid {pid}"])
    result.stdout.no_fnmatch_line("*the test session (outside any test) left*")
    assert recorded.alive() == [pid]


def test_no_leaks_block_raises_and_terminates(procown_no_leaks: pytest_plugin.NoLeaksFactory) -> None:
    """A procown_no_leaks block that leaks raises ProcessLeakError naming the process, terminated."""
    with pytest.raises(ProcessLeakError) as info, procown_no_leaks():
        pid = os.posix_spawnp("sleep", ["sleep", "30"], os.environ)
    try:
        (leak,) = info.value.leaks
        assert (leak.pid, leak.cmdline, leak.fate) == (pid, "sleep 30", "terminated")
        assert "a procown_no_leaks block in" in str(info.value)
    finally:
        _kill_child(pid)
    with procown_no_leaks() as block:
        os.waitpid(os.posix_spawnp("true", ["true"], os.environ), 0)
    assert block.leaks == []


def test_no_leaks_block_keep(procown_no_leaks: pytest_plugin.NoLeaksFactory) -> None:
    """keep=True reports the leak (alive, kept as asked) without signalling it."""
    with pytest.raises(ProcessLeakError) as info, procown_no_leaks(keep=True):
        pid = os.posix_spawnp("sleep", ["sleep", "30"], os.environ)
    try:
        assert [(leak.fate, leak.note) for leak in info.value.leaks] == [("alive", "kept running, as asked")]
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        _kill_child(pid)


async def test_no_leaks_block_async(procown_no_leaks: pytest_plugin.NoLeaksFactory) -> None:
    """`async with` works too; the block's own exception wins and carries the report as a note."""
    with pytest.raises(ValueError, match="body") as info:
        async with procown_no_leaks():
            pid = os.posix_spawnp("sleep", ["sleep", "30"], os.environ)
            await trio.sleep(0)
            raise ValueError("body")
    try:
        assert any(f"pid {pid}: sleep 30" in note for note in info.value.__notes__)
    finally:
        _kill_child(pid)


async def test_procown_command_fixture(procown_command: pytest_plugin.OwnedCommands) -> None:
    """The fixture starts owned commands in the background, stops them, and raises spawn errors."""
    run = await procown_command(["sleep", "30"])
    assert psutil.Process(run.pid).status() != psutil.STATUS_ZOMBIE
    receipt = await procown_command.stop(run)
    assert (receipt.cause, receipt.domain_empty) == ("cancelled", True)
    result = await procown_command.run(["true"])
    assert result.returncode == 0
    assert [r.cause for _, r in procown_command.receipts] == ["cancelled", "exited"]
    with pytest.raises(FileNotFoundError):
        await procown_command(["/nonexistent/procown-test"])


def _kill_child(pid: int) -> None:
    """SIGKILL and reap a child of this process started by a test (if still there)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def test_cookie_scan_narrowed_to_new_pids_is_complete() -> None:
    """The cookie scan finds a process created after the mark, narrowed or (without a sound bound) in full."""
    mark = _procfs.pid_mark()
    if mark is None:
        pytest.skip("no /proc")
    token = "feedfacecafebeef"
    env = dict(os.environ, **{COOKIE_ENV: f"other.call:{token}.call"})
    pid = os.posix_spawnp("sleep", ["sleep", "30"], env)
    try:
        assert _leaks.cookie_scan(token, mark) == {pid: "call"}
        assert _leaks.cookie_scan(token) == {pid: "call"}
        # More clones since the mark than pids exist on any Linux (pid_max is at
        # most PID_MAX_LIMIT = 2**22), so no narrow range can be proven complete.
        unsound = _procfs.PidMark(last_pid=mark.last_pid, forks=mark.forks - 2**22, tasks=mark.tasks)
        assert _procfs.ranges_since(unsound) is None
        assert _leaks.cookie_scan(token, unsound) == {pid: "call"}
    finally:
        _kill_child(pid)


def test_cookie_scan_sees_a_leader_an_owned_command_holds() -> None:
    """A command's leader held unreaped by this process (left out of its censuses' tables) is
    still seen by the leak check's narrowed cookie scan: a test can leak an owned command."""
    mark = _procfs.pid_mark()
    if mark is None or not hasattr(os, "pidfd_open"):
        pytest.skip("no /proc or no pidfds")
    token = "feedfacecafebeef"
    env = dict(os.environ, **{COOKIE_ENV: f"{token}.call"})
    pid = os.posix_spawnp("sleep", ["sleep", "30"], env)
    fd = os.pidfd_open(pid)
    _procfs.hold(pid, fd)
    try:
        assert _procfs.held(pid)
        assert _leaks.cookie_scan(token, mark) == {pid: "call"}
    finally:
        _procfs.release_held(pid)
        os.close(fd)
        _kill_child(pid)


def test_pid_mark_is_keyword_only() -> None:
    """PidMark fields cannot be passed positionally (their order was once swapped by a caller)."""
    with pytest.raises(TypeError):
        _procfs.PidMark(1, 2, 3)  # type: ignore[call-arg]
    mark = _procfs.PidMark(last_pid=1, forks=2, tasks=3)
    assert (mark.last_pid, mark.forks, mark.tasks) == (1, 2, 3)


def test_plugin_imports_no_leak_machinery_until_used() -> None:
    """Every pytest run imports the plugin (entry point): with leaks off it
    must not pull in trio, psutil, _leaks or _keeper (whose import registers
    a fork hook, again at each re-import: pytester's in-process runs drop
    the plugin's modules after each run), nor _escalation's enums for the
    two default budgets it shows; its lazy names still resolve."""
    code = (
        "import sys, trio_procown.pytest_plugin as p\n"
        "heavy = ('trio', 'psutil', 'trio_procown._leaks', 'trio_procown._command', 'trio_procown._keeper',\n"
        "         'trio_procown._escalation')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert p.NoLeaks.__name__ == 'NoLeaks' and p.OwnedCommands.__name__ == 'OwnedCommands'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert pytest_plugin._MECHANISMS == _leaks.MECHANISMS


def test_a_fork_from_another_thread_does_not_hold_our_fork_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork log's per-fork sync pipe is closed in every child forked
    meanwhile from another thread: such a child, if long-lived, would
    otherwise hold the write end, and the first fork's parent would wait
    out FORK_SYNC_WAIT for an EOF that only that child's exit gives."""
    import threading

    log = _leaks._FORK_LOG
    log.install()
    monkeypatch.setenv(COOKIE_ENV, "fork-sync-test")
    log._before()  # thread A's fork, in flight: its sync pipe made
    sync = log._local.sync
    assert sync is not None
    log._unlock()  # (as after the lock's bounded wait gave up: the close in the child must do it)
    sync_pipe = f"pipe:[{os.fstat(sync[1]).st_ino}]"
    release_r, release_w = os.pipe()
    ready_r, ready_w = os.pipe()
    forked: list[int] = []

    def fork_b() -> None:
        pid = os.fork()
        if pid == 0:
            os.close(release_w)
            os.write(ready_w, b"+")  # its fork handlers have run and its descriptors are settled
            os.read(release_r, 1)
            os._exit(0)
        forked.append(pid)

    try:
        thread = threading.Thread(target=fork_b)
        thread.start()
        thread.join(30)
        assert forked, "the fork from thread B did not return"
        # Read its descriptors once it says so (before, a listed one could
        # still be closing: ENOENT on a fork-heavy machine).
        assert select.select([ready_r], [], [], 30)[0], "the child of thread B's fork never got going"
        assert os.read(ready_r, 1) == b"+"
        held = {os.readlink(f"/proc/{forked[0]}/fd/{fd}") for fd in os.listdir(f"/proc/{forked[0]}/fd")}
        assert sync_pipe not in held
    finally:
        log._in_parent()  # A's parent side: closes its pipe
        os.close(release_w)  # B's child reads EOF and exits
        for pid in forked:
            os.waitpid(pid, 0)
        for fd in (release_r, ready_r, ready_w):
            os.close(fd)


def test_a_test_interrupted_by_ctrl_c_is_named_for_what_it_left(
    pytester: pytest.Pytester, recorded: Recorded
) -> None:
    """A test interrupted in its call (KeyboardInterrupt: pytest skips its
    teardown hooks) is still the one named for the process it left, not the
    session; the process is terminated."""
    body = """
def test_interrupted():
    spawn("sleep", "30")
    raise KeyboardInterrupt
"""
    pytester.makepyfile(test_interrupted=_source(pytester, body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail")
    (pid,) = recorded.pids()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*procown: processes left behind*",
            "test_interrupted.py::test_interrupted left 1 process(es) running:",
        ]
    )
    result.stdout.no_fnmatch_line("*the test session (outside any test) left*")
    assert str(pid) in result.stdout.str()
    assert recorded.alive() == []


def test_window_cgroups_of_a_killed_run_are_removed_by_the_next(
    pytester: pytest.Pytester, cgroup_reason: str | None
) -> None:
    """A run killed before its end (SIGTERM: no hook runs) leaves its
    window cgroups behind, empty; the next run started from the same cgroup
    removes them. Those of a run still going are left alone."""
    if cgroup_reason is not None:
        pytest.skip(cgroup_reason)
    from trio_procown import _cgroup

    here = _cgroup.cgroup_of("self")
    assert here is not None
    # The pid of a process that ran and was reaped: no longer running.
    dead_pid = int(subprocess.run(["sh", "-c", "echo $$"], capture_output=True, check=True).stdout)
    stale = os.path.join(here, f"procown-session-{dead_pid}-0123456789abcdef")
    os.mkdir(stale)
    os.mkdir(os.path.join(stale, f"procown-test-{dead_pid}-fedcba9876543210"))
    alive_one = os.path.join(here, f"procown-session-{os.getpid()}-00112233445566ff")
    os.mkdir(alive_one)
    try:
        pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
        result = pytester.runpytest_subprocess("--procown-leaks=fail")
        result.assert_outcomes(passed=1)
        assert not os.path.exists(stale)
        assert os.path.isdir(alive_one)
    finally:
        for path in (alive_one, stale):
            _cgroup.remove_tree(path)


def test_the_end_of_run_section_starts_its_own_line_under_q(
    pytester: pytest.Pytester, recorded: Recorded
) -> None:
    """With -q the progress line is still open when the run ends: the
    plugin's section begins on a line of its own, not glued to "[100%]"."""
    pytester.makepyfile(test_keep=_source(pytester, LEAK))
    result = pytester.runpytest("-q", "--procown-leaks=warn", "--procown-leaks-keep")
    result.stdout.fnmatch_lines(
        ["*[[]100%[]]", "=* procown: processes left behind *", "still running, as asked (keep): *"]
    )
    assert len(recorded.pids()) == 1


def test_a_process_its_dropped_handle_ends_at_collection_is_no_leak(
    pytester: pytest.Pytester, recorded: Recorded
) -> None:
    """pexpect's pattern: a handle whose finalizer ends its process, dropped
    in a reference cycle (freed only by the cyclic collector). The window
    collects garbage before it settles: the process ends, as at Python's
    next collection, and is no leak."""
    body = """
import gc

@pytest.fixture(autouse=True)
def no_automatic_collection():
    gc.disable()  # only the plugin's own collection can free the cycle
    yield
    gc.enable()

class Spawn:
    def __init__(self):
        self.proc = subprocess.Popen(["sleep", "30"])
        record(self.proc.pid)
        self.me = self  # a reference cycle

    def __del__(self):
        self.proc.kill()
        self.proc.wait()

def test_dropped_in_a_cycle():
    Spawn()
"""
    pytester.makepyfile(test_cycle=_source(pytester, body))
    result = pytester.runpytest_subprocess("--procown-leaks=fail", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*left * process(es) running*")
    assert len(recorded.pids()) == 1
    assert recorded.alive() == []
