# pytest plugin: fail (or warn about) tests that leave processes running.
#
# Activation. Registered through the `pytest11` entry point and inactive until
# asked for: `--procown-leaks=fail|warn|off`, the ini option `procown_leaks`,
# or `@pytest.mark.procown_leaks("fail")` on a test, class or module. The
# marker (most specific) wins over the command line, which wins over the ini
# file. With everything off, a test costs one marker lookup. A test marked
# off while the run checks gets a window all the same, swept without a
# report or a signal: what it leaves running is its own (listed at the end),
# not the session's. Under xdist a worker tells the controller of such
# processes, and of kept ones, in a report's user property (_RUNNING).
#
# Windows. An active test gets a window (_leaks.Watch) from the start of its
# setup to the end of its teardown. What it finds alive afterwards is the
# test's leak: an error of the test's teardown (pytest's way to report a
# check made after a test) or, in warn mode, a ProcessLeakWarning; attached
# as the user property "procown_leaks" (JSON, for junitxml and xdist); then
# stopped with the library's escalation and budgets unless `keep` is set.
#
# Scopes. Broader fixtures are set up with the test's window suspended: a
# session-scoped server is not the first test's leak. Their processes may
# still start inside a test (a process pool forks its workers when work is
# first submitted; a function fixture may start one into a session
# fixture's registry), so a test's window spares the workers of pools and
# the processes of Popen-like handles that a broader fixture holds (its
# value, or four levels into it), the processes of live handles held by
# other than the run's tests (a library's process-wide helper: jedi's
# inference subprocess; _leaks.library_held), what those start in the
# window, and multiprocessing's helpers of this process. When the plugin is on for the
# whole run, a session window (sessionstart to sessionfinish) checks what
# broader fixtures, collection, hooks and spared pools leave behind, and
# fails the run in fail mode. Under pytest-xdist the controller holds the
# session window (workers inherit its cookie and cgroup), workers the tests'.
# The library's keeper (_keeper.py) is spared by every window; at the end of
# the session it is told goodbye before the check, so it is checked too.

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import pytest

from ._budgets import DEFAULT_GRACE, DEFAULT_KILL_WAIT
from ._errors import ProcessLeakError as ProcessLeakError

# This module is imported by every pytest run (the pytest11 entry point),
# most of them with the plugin off: the leak machinery (_leaks, psutil) and
# the owned commands (trio) are imported when first needed, not here.
if TYPE_CHECKING:
    from ._background import OwnedCommands as OwnedCommands
    from ._leaks import COOKIE_ENV as COOKIE_ENV
    from ._leaks import LeakedProcess as LeakedProcess
    from ._leaks import Mechanism as Mechanism
    from ._leaks import NoLeaks as NoLeaks
    from ._leaks import Tracker as Tracker
    from ._leaks import Watch as Watch
    from ._leaks import no_leaks as no_leaks

_MECHANISMS = ("auto", "cgroup", "cookie")  # _leaks.MECHANISMS (test_pytest_plugin checks they agree)
# Names this module offers without importing them up front (PEP 562).
_FROM_LEAKS = frozenset(
    {
        "COOKIE_ENV",
        "MECHANISMS",
        "LeakedProcess",
        "Mechanism",
        "NoLeaks",
        "Tracker",
        "Watch",
        "format_leaks",
        "is_running",
        "no_leaks",
        "held_processes",
        "runner_helpers",
    }
)


def __getattr__(name: str) -> Any:
    if name == "OwnedCommands":
        from . import _background

        return _background.OwnedCommands
    if name in _FROM_LEAKS:
        from . import _leaks

        return getattr(_leaks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "COOKIE_ENV",
    "NoLeaks",
    "NoLeaksFactory",
    "OwnedCommands",
    "ProcessLeakError",
    "ProcessLeakWarning",
    "no_leaks",
]

Mode = Literal["fail", "warn", "off"]
MODES: tuple[Mode, ...] = ("fail", "warn", "off")


class ProcessLeakWarning(UserWarning):
    """A test left processes running (warn mode)."""


class NoLeaksFactory(Protocol):
    """The type of the `procown_no_leaks` fixture."""

    def __call__(self, *, keep: bool = False) -> NoLeaks: ...


@dataclass
class _TestWatch:
    watch: Watch
    mode: Mode
    keep: bool


class _State:
    """The plugin's state for one pytest config."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.mechanism = _mechanism(config)
        self.grace = _seconds(config, "procown_leaks_grace")
        self.kill_wait = _seconds(config, "procown_leaks_kill_wait")
        self._tracker: Tracker | None = None
        self.session: Watch | None = None
        self.current: _TestWatch | None = None
        self.reported: dict[int, int] = {}  # pid -> start: leaks already reported (kept)
        # pid -> (start, test): what tests marked off left running, while
        # the check is on for the run (not checked, not the session's)
        self.exempt: dict[int, tuple[int, str]] = {}
        self.spared: dict[tuple[int, int], LeakedProcess] = {}  # (pid, start) -> as a test's window saw it
        self.broader: dict[int, pytest.FixtureDef[Any]] = {}  # fixtures broader than a test
        self.released: dict[int, str] = {}  # pool workers of broader fixtures torn down in this test
        self._settings: tuple[Mode, bool] | None = None

    @property
    def tracking(self) -> bool:
        """Whether the leak machinery has been used in this run."""
        return self._tracker is not None

    @property
    def tracker(self) -> Tracker:
        """The leak tracker, made (and _leaks imported) on first use."""
        if self._tracker is None:
            from ._leaks import Tracker

            self._tracker = Tracker(self.mechanism, self.grace, self.kill_wait)
        return self._tracker

    def settings(self) -> tuple[Mode, bool]:
        """The run-wide mode and keep flag (command line, else ini); read
        late so a conftest's pytest_configure may set config.option."""
        if self._settings is None:
            cli = self.config.getoption("procown_leaks", None)
            mode = _mode(cli if cli is not None else _ini(self.config, "procown_leaks"), "procown_leaks")
            keep = bool(self.config.getoption("procown_leaks_keep", None)) or bool(
                self.config.getini("procown_leaks_keep")
            )
            self._settings = (mode, keep)
        return self._settings

    def for_item(self, item: pytest.Item) -> tuple[Mode, bool]:
        mode, keep = self.settings()
        marker = item.get_closest_marker("procown_leaks")
        if marker is not None:
            mode = _mode(marker.args[0] if marker.args else marker.kwargs.get("mode", "fail"), "marker")
            keep = bool(marker.kwargs.get("keep", keep))
        return mode, keep

    def still_running(self, test: _TestWatch, leaks: list[LeakedProcess], owner: str) -> list[LeakedProcess]:
        """Remember the processes a test left running on purpose, so that the
        session's window does not blame them on the session: those of a test
        marked off (returned as nothing to report) and kept ones (returned)."""
        if test.mode == "off":
            self.exempt.update((leak.pid, (leak.start_key, owner)) for leak in leaks)
            return []
        if test.keep:
            self.reported.update((leak.pid, leak.start_key) for leak in leaks)
        return leaks

    def spare(self, found: list[int]) -> dict[int, str]:
        """Processes a test's window must not blame on the test, of those
        it `found` alive and those they may have started: pid -> what they
        are (see the module comment)."""
        from ._leaks import library_held, runner_helpers

        owned = library_held(found, self._test_module) | runner_helpers() | self.released
        for fixturedef in list(self.broader.values()):
            owned |= _processes_held(fixturedef)
        return owned

    def _test_module(self, name: str, file: str) -> bool:
        """Is the module `name` (loaded from `file`) one of the run's test
        files or conftests? What they hold is the tests' own."""
        base = os.path.basename(file)
        if base == "conftest.py":
            return True
        patterns = self.config.getini("python_files") or ["test_*.py", "*_test.py"]
        return any(fnmatch.fnmatch(base, str(pattern)) for pattern in patterns)


def _scope_label(fixturedef: pytest.FixtureDef[Any]) -> str:
    return f"{fixturedef.scope}-scoped fixture {fixturedef.argname}"


def _processes_held(fixturedef: pytest.FixtureDef[Any]) -> dict[int, str]:
    """The processes a fixture's value holds (pools' workers, process
    handles): pid -> what they are."""
    if fixturedef.cached_result is None:
        return {}
    from ._leaks import held_processes

    held = held_processes(fixturedef.cached_result[0])
    return {pid: f"{what} held by {_scope_label(fixturedef)}" for pid, what in held.items()}


_STATE = pytest.StashKey[_State]()
_WATCH = pytest.StashKey[_TestWatch]()
_COMMANDS = pytest.StashKey["OwnedCommands"]()
_RECEIPTS_SHOWN = pytest.StashKey[bool]()


def _ini(config: pytest.Config, name: str) -> str:
    return str(config.getini(name) or "").strip()


def _one_of(value: object, what: str, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        msg = f"{what} must be one of {', '.join(choices)}; not {value!r}"
        raise pytest.UsageError(msg)
    return text


def _mode(value: object, where: str) -> Mode:
    return cast(Mode, _one_of(value, f"{where}: procown leak mode", MODES))


def _mechanism(config: pytest.Config) -> Mechanism:
    value = config.getoption("procown_leaks_mechanism", None) or _ini(config, "procown_leaks_mechanism")
    return cast("Mechanism", _one_of(value, "procown_leaks_mechanism", _MECHANISMS))


def _seconds(config: pytest.Config, name: str) -> float:
    raw = _ini(config, name)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        msg = f"{name} must be a non-negative number of seconds, not {raw!r}"
        raise pytest.UsageError(msg)
    return seconds


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("procown", "process leaks (trio_procown)")
    group.addoption(
        "--procown-leaks",
        dest="procown_leaks",
        choices=MODES,
        help="fail or warn when a test leaves a process running (default: ini procown_leaks, else off)",
    )
    group.addoption(
        "--procown-leaks-keep",
        dest="procown_leaks_keep",
        action="store_true",
        default=None,
        help="report leaked processes but do not terminate them",
    )
    group.addoption(
        "--procown-leaks-mechanism",
        dest="procown_leaks_mechanism",
        choices=_MECHANISMS,
        help="auto: a cgroup per test where possible, plus the cookie; cgroup: require it; cookie: never",
    )
    parser.addini("procown_leaks", "process leak check: fail, warn or off (default off)", default="off")
    parser.addini("procown_leaks_keep", "do not terminate leaked processes", type="bool", default=False)
    parser.addini("procown_leaks_mechanism", "auto, cgroup or cookie (default auto)", default="auto")
    parser.addini("procown_leaks_grace", "seconds from SIGTERM to SIGKILL", default=str(DEFAULT_GRACE))
    parser.addini("procown_leaks_kill_wait", "seconds to wait after SIGKILL", default=str(DEFAULT_KILL_WAIT))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "procown_leaks(mode='fail', *, keep=False): fail ('fail') or warn ('warn') when this test "
        "leaves a process running, or do not check ('off'); overrides --procown-leaks",
    )
    state = _State(config)
    config.stash[_STATE] = state
    if state.mechanism == "cgroup" and state.tracker.cgroup_base() is None:
        msg = f"--procown-leaks-mechanism=cgroup, but {state.tracker.cgroup_note}"
        raise pytest.UsageError(msg)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    mode, _ = state.settings()
    if mode != "off" and not hasattr(session.config, "workerinput"):  # not an xdist worker
        from ._leaks import Watch

        state.session = Watch(state.tracker, "the test session (outside any test)", "session")
        state.session.open("session")
        session.config.pluginmanager.register(_Relay(state), "procown-relay")


# A report's user property by which an xdist worker tells the controller of
# the processes its tests left running on purpose (kept, or from a test
# marked off): the controller's session window must not blame them on the
# session.
_RUNNING = "procown_leaks_running"


class _Relay:
    """The controller's side of _RUNNING (registered with the session window)."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name != _RUNNING:
                continue
            for entry in json.loads(str(value)):
                pid, start = int(entry["pid"]), int(entry["start"])
                if entry["why"] == "kept":
                    self.state.reported[pid] = start
                else:
                    self.state.exempt[pid] = (start, report.nodeid)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(_STATE, None)
    if state is None:
        return []
    mode, keep = state.settings()
    if mode == "off":
        return []
    action = "kept running" if keep else "terminated"
    return [f"procown: leaks {mode} the test and are {action}; tracked by {state.tracker.describe()}"]


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, object, object]:
    # trylast wrapper: after every plain implementation (xdist's controller
    # stops its workers there), before the terminal summary.
    result = yield
    state = session.config.stash.get(_STATE, None)
    if state is None or (state.session is None and state.current is None):
        return result  # (the plugin off: nothing imported)
    from ._leaks import NOT_THE_TESTS, format_leaks, is_running

    lines: list[str] = []
    # A test interrupted in its call (Ctrl-C) never reached its teardown
    # hook: its window is still open. What it started is its own, reported
    # under its name, before the session's sweep would claim it.
    test, state.current = state.current, None
    if test is not None:
        test.watch.close()
        leaks = test.watch.sweep(test.keep, spare=state.spare)
        test.watch.release()
        leaks = state.still_running(test, leaks, test.watch.owner)
        if leaks:
            lines.append(format_leaks(test.watch.owner, leaks, test.watch.mechanism()))
    red = bool(lines)
    if state.session is None:
        if lines:
            _write_section(session.config, "procown: processes left behind", "\n".join(lines), red=True)
        return result
    watch, state.session = state.session, None
    mode, keep = state.settings()
    watch.close()
    # The library's keeper is spared by every window; the run is over, so
    # it is told goodbye: one that does not exit is this check's to report.
    # Imported here, not with this module: a pytest run with the check off
    # (pytester's in-process runs too) does not need it, and its import
    # registers a fork hook that a re-import would register again.
    from . import _keeper

    _keeper.retire()
    kept = [pid for pid, start in state.reported.items() if is_running(pid, start)]
    exempt = [(pid, test) for pid, (start, test) in state.exempt.items() if is_running(pid, start)]

    def seen(pid: int, start: int) -> bool:
        return state.reported.get(pid) == start or state.exempt.get(pid, (None,))[0] == start

    leaks = watch.sweep(keep, exclude=seen, spare=state.spare)
    leaks = [leak.credited(state.spared.get((leak.pid, leak.start_key))) for leak in leaks]
    watch.release()
    state.tracker.remove_leftovers()  # kept leaks may have ended by now
    if leaks:
        lines.append(format_leaks(watch.owner, leaks, watch.mechanism()))
    if kept:
        lines.append(f"still running, as asked (keep): pid {', '.join(map(str, kept))}")
    if exempt:
        lines.append(
            "still running, not checked (marked procown_leaks('off')): "
            + "; ".join(f"pid {pid} (started by {test})" for pid, test in exempt)
        )
    # A library's helper ends with this process, if the library ends it at
    # exit (jedi does): said, not failed.
    helpers = [leak for leak in watch.spared if leak.role.endswith(NOT_THE_TESTS)]
    if helpers:
        lines.append(
            "still running, a library's helper (the library's to end at exit): "
            + "; ".join(f"pid {leak.pid} ({leak.role})" for leak in helpers)
        )
    if state.tracker.leftover_cgroups:
        lines.append("cgroups left behind (still populated): " + ", ".join(state.tracker.leftover_cgroups))
    if lines:
        _write_section(
            session.config, "procown: processes left behind", "\n".join(lines), red=bool(leaks) or red
        )
    if leaks and mode == "fail" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


def _write_section(config: pytest.Config, title: str, text: str, *, red: bool) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
            reporter.write("\n")  # with -q, the progress line is still open
        reporter.write_sep("=", title, red=red, yellow=not red)
        for line in text.splitlines():
            reporter.write_line(line)
    else:
        sys.stderr.write(f"{title}\n{text}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    # Interrupted runs may skip teardowns: never leave the process in a
    # window's cgroup or the cookie in the environment.
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    for watch in (state.current.watch if state.current else None, state.session):
        if watch is not None:
            with contextlib.suppress(OSError):
                watch.close()
                watch.release()
    state.current = None
    state.session = None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    state = item.config.stash.get(_STATE, None)
    error: pytest.UsageError | None = None
    if state is not None:
        try:
            mode, keep = state.for_item(item)
        except pytest.UsageError as exc:
            mode, keep, error = "off", False, exc
        # A test marked off while the check is on for the run still gets
        # a window, so that what it leaves running is known as its own:
        # neither checked nor stopped, nor blamed on the session.
        if mode != "off" or state.settings()[0] != "off":
            from ._leaks import Watch

            test = _TestWatch(Watch(state.tracker, item.nodeid, "test"), mode, keep or mode == "off")
            item.stash[_WATCH] = test
            state.current = test
            test.watch.open("setup")
    result = yield
    if error is not None:  # raised after the setup proper, so its teardown stays consistent
        raise error
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    test = item.stash.get(_WATCH, None)
    if test is not None:
        test.watch.set_phase("call")
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    test = item.stash.get(_WATCH, None)
    if test is None:
        return (yield)
    test.watch.set_phase("teardown")
    failure: BaseException | None = None
    result: object = None
    try:
        result = yield
    except BaseException as exc:
        failure = exc
    state = item.config.stash[_STATE]
    del item.stash[_WATCH]
    state.current = None
    watch = test.watch
    watch.close()
    leaks = watch.sweep(test.keep, spare=state.spare)
    watch.release()
    state.released.clear()
    state.spared.update(((s.pid, s.start_key), s) for s in watch.spared)
    if hasattr(item.config, "workerinput") and (test.keep or test.mode == "off"):
        running = [
            {"pid": leak.pid, "start": leak.start_key, "why": "not checked" if test.mode == "off" else "kept"}
            for leak in leaks
        ]
        if running:
            item.user_properties.append((_RUNNING, json.dumps(running)))
    leaks = state.still_running(test, leaks, item.nodeid)
    if leaks:
        from ._leaks import format_leaks

        item.user_properties.append(("procown_leaks", json.dumps([leak.to_dict() for leak in leaks])))
        text = format_leaks(item.nodeid, leaks, watch.mechanism())
        if failure is not None:
            item.add_report_section("teardown", "procown leaks", text)
        elif test.mode == "fail":
            pytest.fail(text, pytrace=False)
        else:
            item.warn(ProcessLeakWarning(text))
    if failure is not None:
        raise failure
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    # Broader fixtures outlive the test that first needs them: set them up
    # outside its window (their processes belong to the session window), and
    # remember them (the process pools they hold are not a test's leak).
    state = request.config.stash.get(_STATE, None)
    if state is None or fixturedef.scope == "function":
        return (yield)
    state.broader[id(fixturedef)] = fixturedef
    current = state.current
    if current is None or not current.watch.active:
        return (yield)
    current.watch.suspend()
    if state.session is not None:
        state.session.set_phase(_scope_label(fixturedef))
    try:
        return (yield)
    finally:
        if state.session is not None:
            state.session.set_phase("session")
        current.watch.resume()


def pytest_fixture_post_finalizer(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> None:
    # A broader fixture torn down in a test's teardown (the last test of its
    # scope) has let go of its pools: their workers are still not that test's.
    state = request.config.stash.get(_STATE, None)
    # Before the leak machinery was ever used there is no window to spare them in.
    if state is not None and state.tracking and fixturedef.scope != "function":
        state.released |= _processes_held(fixturedef)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    commands = item.stash.get(_COMMANDS, None)
    shown = item.stash.get(_RECEIPTS_SHOWN, False)
    if commands is not None and report.failed and commands.receipts and not shown:
        item.stash[_RECEIPTS_SHOWN] = True
        report.sections.append(("procown receipts", commands.report()))
    return report


# -- fixtures -----------------------------------------------------------------------


@pytest.fixture
def procown_no_leaks(request: pytest.FixtureRequest) -> NoLeaksFactory:
    """A factory of blocks that must not leave processes running.

    Synopsis::

        def test_build(procown_no_leaks):
            with procown_no_leaks():
                subprocess.run(["sh", "-c", "sleep 0.1 & wait"], check=True)
    """
    state = request.config.stash.get(_STATE, None)
    tracker = state.tracker if state is not None else None
    owner = f"a procown_no_leaks block in {request.node.nodeid}"

    from ._leaks import NoLeaks

    def block(*, keep: bool = False) -> NoLeaks:
        return NoLeaks(keep=keep, owner=owner, tracker=tracker)

    return block


@pytest.fixture
def procown_command(request: pytest.FixtureRequest) -> Iterator[OwnedCommands]:
    """Owned commands for trio tests, torn down when the test's trio run ends.

    Synopsis::

        async def test_server(procown_command):
            server = await procown_command([sys.executable, "-m", "http.server", "8123"])
            ...  # talk to it; it is torn down at the end of the test
    """
    from ._background import OwnedCommands

    commands = OwnedCommands(request.node.nodeid)
    request.node.stash[_COMMANDS] = commands
    yield commands
    commands.check_finished()
