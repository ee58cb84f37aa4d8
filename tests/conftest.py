"""Test-suite guard: no test may leave a process behind.

Every process the suite starts inherits PROCOWN_TEST_MARKER (set in our own
environment at import) unless a test replaces the environment, in which case
it must pass the marker itself (see `marked_env`). After each test we look
for live processes carrying the marker; any survivor fails that test and is
then killed (only processes carrying our marker are ever signalled).
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator

import psutil
import pytest

MARKER_VAR = "PROCOWN_TEST_MARKER"
MARKER = os.environ.setdefault(MARKER_VAR, f"procown-test-{uuid.uuid4().hex}")
_MARKER_ENTRY = f"{MARKER_VAR}={MARKER}".encode()


def marked_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment for tests that pass env=, carrying the marker."""
    env = {"PATH": os.environ.get("PATH", os.defpath), MARKER_VAR: MARKER}
    env.update(extra or {})
    return env


def py(code: str) -> list[str]:
    """A command running `code` in a fresh interpreter, tagged with the marker."""
    return [sys.executable, "-c", code, MARKER]


def _carries_marker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return _MARKER_ENTRY in f.read().split(b"\0")
    except OSError:
        return False


def survivors() -> list[psutil.Process]:
    """Live processes (not zombies) started by this test session."""
    me = os.getpid()
    ancestors = {p.pid for p in psutil.Process(me).parents()}
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        pid = proc.info["pid"]
        if pid == me or pid in ancestors or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if _carries_marker(pid):
            found.append(proc)
    return found


def _describe(procs: list[psutil.Process]) -> str:
    lines = []
    for p in procs:
        try:
            lines.append(f"pid {p.pid}: {' '.join(p.cmdline())[:150]}")
        except psutil.Error:
            lines.append(f"pid {p.pid}: (gone)")
    return "\n".join(lines)


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            if _carries_marker(p.pid):
                p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=3)


@pytest.fixture(autouse=True)
def _no_survivors() -> Iterator[None]:
    """Fail any test that leaves a marked process alive."""
    yield
    left = survivors()
    if left:
        text = _describe(left)
        _kill(left)
        pytest.fail(f"test left {len(left)} process(es) alive:\n{text}", pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = survivors()
    if left:
        text = _describe(left)
        _kill(left)
        sys.stderr.write(f"\nprocesses left by the test session:\n{text}\n")
        session.exitstatus = 1
