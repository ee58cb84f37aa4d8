"""The Hypothesis profiles registered by tests/conftest.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings


def test_default_profile_is_deterministic(pytestconfig: pytest.Config) -> None:
    """Unless a profile is chosen, Hypothesis runs derandomized with no example database."""
    ci = settings.get_profile("ci")
    assert (ci.derandomize, ci.database, ci.print_blob) == (True, None, True)
    if os.environ.get("HYPOTHESIS_PROFILE") or pytestconfig.getoption("hypothesis_profile", None):
        pytest.skip("a Hypothesis profile was chosen for this run")
    assert settings.get_current_profile_name() == "ci"
    assert (settings().derandomize, settings().database) == (True, None)


def test_chaos_profile_explores() -> None:
    """HYPOTHESIS_PROFILE=chaos draws random seeds and runs 5x the examples of the default."""
    chaos, ci = settings.get_profile("chaos"), settings.get_profile("ci")
    assert not chaos.derandomize
    assert chaos.max_examples == 5 * ci.max_examples
    assert chaos.deadline is None
