# The library's default teardown budgets, shared by every owner (commands,
# services, the CLI, the pytest plugin's leak teardown). A module of its own
# because every pytest run imports the plugin, and the plugin needs only
# these numbers: importing them from _escalation cost its enums and named
# tuples (~1.5 ms of the plugin's ~4 ms import, measured warm).
"""Default teardown budgets, in seconds."""

from __future__ import annotations

DEFAULT_GRACE = 2.0
DEFAULT_KILL_WAIT = 1.0
DEFAULT_DRAIN_WAIT = 0.5
