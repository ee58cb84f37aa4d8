# The record of a handoff (OwnedCommand.hand_off), apart from _receipt.py so
# that a process that never hands a command off (every `procown run`) does
# not pay for creating its class at start-up (a dataclass costs about a
# millisecond): _command.py imports it where a handoff happens.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HandoffReceipt:
    """The record of a running command handed from its block to an owner.

    Says from whom to whom, when, why, which domain holds the command, and
    how the new owner will end it.

    Synopsis::

        handoff = await run.hand_off(owner, reason="shared by the test session")
        print(handoff)   # "pid 4242 handed from open_owned_command block to ..."
    """

    pid: int
    command: tuple[str, ...]
    from_owner: str
    to_owner: str
    at: float  # seconds since the command's spawn
    wall_time: float  # time.time() of the handoff
    reason: str
    domain: str
    domain_id: str
    termination: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of this value."""
        return {
            "pid": self.pid,
            "command": list(self.command),
            "from": self.from_owner,
            "to": self.to_owner,
            "at": round(self.at, 6),
            "wall_time": self.wall_time,
            "reason": self.reason,
            "domain": self.domain,
            "domain_id": self.domain_id,
            "termination": self.termination,
        }

    def __str__(self) -> str:
        return (
            f"pid {self.pid} handed from {self.from_owner} to {self.to_owner} at +{self.at:.3f}s "
            f"({self.reason}); held by {self.domain} {self.domain_id}; {self.termination}"
        )
