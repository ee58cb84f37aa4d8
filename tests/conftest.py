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

import os
import sys
import uuid

import pytest

from trio_procown.pytest_plugin import COOKIE_ENV

MARKER_VAR = "PROCOWN_TEST_MARKER"
MARKER = os.environ.setdefault(MARKER_VAR, f"procown-test-{uuid.uuid4().hex}")


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


def pytest_configure(config: pytest.Config) -> None:
    # The leak check is on for this suite unless the command line chose a
    # mode; the plugin reads the option only at session start.
    if config.pluginmanager.hasplugin("procown") and config.getoption("procown_leaks", None) is None:
        config.option.procown_leaks = "fail"
