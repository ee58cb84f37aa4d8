"""The library's default teardown budgets."""

from __future__ import annotations

import inspect

import trio_procown
from trio_procown._budgets import DEFAULT_DRAIN_WAIT, DEFAULT_GRACE, DEFAULT_KILL_WAIT


def test_defaults_are_the_documented_budgets() -> None:
    """Grace 2 s, kill_wait 1 s, drain_wait 0.5 s (DESIGN.md's defaults)."""
    assert (DEFAULT_GRACE, DEFAULT_KILL_WAIT, DEFAULT_DRAIN_WAIT) == (2.0, 1.0, 0.5)


def test_open_owned_command_takes_its_defaults_from_here() -> None:
    """One place for every owner's defaults: open_owned_command's signature (which run_owned and
    the drop-ins pass through) shows these values."""
    params = inspect.signature(trio_procown.open_owned_command).parameters
    defaults = (params["grace"].default, params["kill_wait"].default, params["drain_wait"].default)
    assert defaults == (DEFAULT_GRACE, DEFAULT_KILL_WAIT, DEFAULT_DRAIN_WAIT)
