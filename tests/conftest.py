"""Test-suite guard: no test may leave a process behind.

The suite watches itself with the library's own pytest plugin
(trio_procown.pytest_plugin, see docs/pytest-plugin.md), in fail mode unless
the command line says otherwise (`--procown-leaks=warn|off`): every process a
test starts is tracked (a per-test cgroup where this machine allows it, an
environment cookie and a fork log everywhere), a test that leaves one running
errors at its teardown with a report naming it, and the process is then
terminated; whatever is left outside any test fails the run at its end.

PROCOWN_TEST_MARKER is still put in our environment at import, so every
process the suite starts carries it; tests use it to tag and find their own
processes (`py`, the chaos suite). Tests that replace the environment should
build it with `marked_env`, which also carries the plugin's cookie, so such
processes stay visible to the plugin where cgroups are unavailable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Iterator

import pytest
import trio
from hypothesis import HealthCheck, settings

from trio_procown.pytest_plugin import COOKIE_ENV

MARKER_VAR = "PROCOWN_TEST_MARKER"
MARKER = os.environ.setdefault(MARKER_VAR, f"procown-test-{uuid.uuid4().hex}")

# A PATH inherited from another user (su without a login shell keeps root's)
# may name folders we cannot search, and exec then says EACCES, not ENOENT,
# for a name found nowhere (as execvp and subprocess do; tested on its own in
# test_command.py::test_a_name_not_found_reports_what_execvp_would). The
# tests that expect "not found" run on the folders we can search.
_FOLDERS = os.environ.get("PATH", os.defpath).split(os.pathsep)
os.environ["PATH"] = os.pathsep.join(folder for folder in _FOLDERS if os.access(folder or ".", os.X_OK))

# Hypothesis profiles. "ci", loaded unless HYPOTHESIS_PROFILE names another
# (so also whenever CI is set), is deterministic: a derandomized seed per test,
# no example database, and the blob to replay a failure printed with it; a
# run fails or passes the same way on every machine. "chaos"
# (HYPOTHESIS_PROFILE=chaos, `make chaos`) explores: a random seed per run,
# the local .hypothesis/ database (failures are replayed first), 5x the
# examples. tests/test_chaos.py scales its own example count to the profile.
CI_MAX_EXAMPLES = 100
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    max_examples=CI_MAX_EXAMPLES,
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "chaos",
    parent=settings.get_profile("default"),
    max_examples=5 * CI_MAX_EXAMPLES,
    derandomize=False,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


def marked_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment for tests that pass env=, carrying the marker
    and the leak check's cookie."""
    env = {"PATH": os.environ.get("PATH", os.defpath), MARKER_VAR: MARKER}
    cookie = os.environ.get(COOKIE_ENV)
    if cookie:
        env[COOKIE_ENV] = cookie
    env.update(extra or {})
    return env


def py(code: str) -> list[str]:
    """A command running `code` in a fresh interpreter, tagged with the marker."""
    return [sys.executable, "-c", code, MARKER]


@contextlib.contextmanager
def ignoring_sigchld() -> Iterator[None]:
    """The program ignores SIGCHLD, as some daemons do: the kernel reaps each
    of its children as it exits, and nobody can read their exit status."""
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, old)


@pytest.fixture
def sigchld_ignored() -> Iterator[None]:
    """ignoring_sigchld() for a whole test."""
    with ignoring_sigchld():
        yield


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids a narrow census probes (_procfs.is_process), in order, as it
    still probes them."""
    from trio_procown import _procfs

    seen: list[int] = []
    real = _procfs.is_process

    def is_process(pid: int) -> bool:
        seen.append(pid)
        return real(pid)

    monkeypatch.setattr(_procfs, "is_process", is_process)
    return seen


@pytest.fixture(autouse=True)
def no_trio_run_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop the session if a test left trio's run state behind: pytest-timeout's signal, raised
    inside trio.run, ends the run half-way, and every later trio test would then fail for that
    alone ("run() inside run()", live counts and keepers of the abandoned run), burying the one
    failure worth reading."""
    yield
    if trio.lowlevel.in_trio_run():
        pytest.exit(
            f"{request.node.nodeid} left trio's run behind (a timeout raised inside it?): the tests "
            "after it would fail for that alone, so the session stops here; read that test's failure",
            returncode=1,
        )


def pytest_configure(config: pytest.Config) -> None:
    # The leak check is on for this suite unless the command line chose a
    # mode; the plugin reads the option only at session start.
    if config.pluginmanager.hasplugin("procown") and config.getoption("procown_leaks", None) is None:
        config.option.procown_leaks = "fail"
