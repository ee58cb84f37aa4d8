# The receipt: what the teardown's evidence proves, and no more.
#
# A receipt is built once, at the end of the teardown, from the timeline of
# steps the teardown recorded and a few facts it established. claims() turns
# that into sentences; each sentence is derived from a field that a step
# backs, and is worded no stronger than the step: "no live member was seen"
# rather than "everything stopped", "abandoned" rather than "complete".

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# "stopped": ended on request (run.terminate(), a service owner's stop() or
# exit), in addition to the four causes of the contract.
Cause = Literal["exited", "timed_out", "cancelled", "error", "stopped"]
# In a wait step's detail: the wait's budget ran out before the domain's
# emptying reached the teardown, and a check made then found the domain
# empty (no force was needed; see Teardown._wait_empty).
RAN_OUT = "run out, and the domain was then seen empty"
# "not captured": no stream was read by us (devnull, a file, an inherited fd).
# "closed": the caller stopped reading a stream (its own reader went away).
OutputState = Literal["complete", "truncated", "abandoned", "closed", "not captured"]
# What the keeper (_keeper.py), which ends the domain if this process dies
# before its teardown, knew of the domain: "guarded" (told at the spawn, and
# still there when it was released), "replaced" (that keeper died meanwhile;
# a new one was told of the domain), "lost" (it died and no other knew of the
# domain at its release), "opted out", "unavailable" (none could be started
# or told), "unknown" (a receipt not written by a teardown).
KeeperState = Literal["guarded", "replaced", "lost", "opted out", "unavailable", "unknown"]


def signame(signum: int) -> str:
    """A signal as receipts name it: "SIGTERM", "SIGRTMIN+1" (real-time
    signals have no name of their own), "signal N" for any other number."""
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        pass
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None and low < signum < high:
        return f"SIGRTMIN+{signum - low}"
    return f"signal {signum}"


class Action(enum.Enum):
    """What a step of the timeline did.

    Synopsis::

        signals = [s for s in receipt.steps if s.action is trio_procown.Action.SIGNAL]
    """

    SPAWN = "spawn"
    EXIT = "exit"  # the leader was seen to terminate
    STOP = "stop"  # the teardown was requested, with a cause
    SCAN = "scan"  # the domain or the census was inspected
    SIGNAL = "signal"
    WAIT = "wait"
    DRAIN = "drain"
    REAP = "reap"
    RELEASE = "release"
    HANDOFF = "handoff"
    ERROR = "error"  # an action of the teardown failed; the teardown went on


@dataclass(frozen=True, slots=True)
class Step:
    """One entry of a receipt's timeline.

    `at` is in seconds since the spawn; `target` names what was acted on
    ("leader", "domain", "escapees", "stdout", ...); `outcome` says how a
    wait or scan ended ("empty", "expired", "eof", "abandoned", ...).

    Synopsis::

        for step in receipt.steps:
            print(step)   # "+0.503s signal domain: SIGTERM+SIGCONT to process group 2516"
    """

    at: float
    action: Action
    target: str
    detail: str = ""
    outcome: str = ""
    signals: tuple[str, ...] = ()  # for a signal step: the signals sent, by name

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of this value."""
        return {
            "at": round(self.at, 6),
            "action": self.action.value,
            "target": self.target,
            "detail": self.detail,
            "outcome": self.outcome,
            "signals": list(self.signals),
        }

    def __str__(self) -> str:
        text = f"+{self.at:.3f}s {self.action.value} {self.target}"
        if self.detail:
            text += f": {self.detail}"
        if self.outcome:
            text += f" -> {self.outcome}"
        return text


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """A process named by a receipt: pid, command line, and what became of it.

    Synopsis::

        for proc in receipt.escaped:
            print(proc.pid, proc.cmdline, proc.fate)
    """

    pid: int
    cmdline: str
    fate: str = ""  # "alive", "terminated", "killed", "zombie", ...

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of this value."""
        return {"pid": self.pid, "cmdline": self.cmdline, "fate": self.fate}


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """How one output stream ended: EOF or abandoned, and byte counts.

    Synopsis::

        for stream in receipt.streams:
            print(stream.name, stream.state, stream.captured, stream.dropped)
    """

    name: str
    state: Literal["eof", "abandoned", "closed", "not captured"]
    captured: int  # bytes read from the pipe
    kept: int  # bytes retained in memory
    dropped: int  # bytes read but dropped by the size limit
    target: str = "capture"  # or "devnull", "file PATH", "merged into stdout", ...

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of this value."""
        return {
            "name": self.name,
            "state": self.state,
            "captured": self.captured,
            "kept": self.kept,
            "dropped": self.dropped,
            "target": self.target,
        }


def output_of(streams: list[StreamRecord] | tuple[StreamRecord, ...]) -> OutputState:
    """The receipt's output state, from its streams' records alone: complete
    only with EOF on every captured stream; a drain given up after its bound
    outranks a stream the caller closed; dropped bytes make it truncated."""
    states = {s.state for s in streams}
    states.discard("not captured")
    if not states:
        return "not captured"
    if "abandoned" in states:
        return "abandoned"
    if "closed" in states:
        return "closed"
    for s in streams:
        if s.dropped and s.state != "not captured":
            return "truncated"
    return "complete"


@dataclass(frozen=True, slots=True)
class Receipt:
    """What the teardown of one owned command proved.

    Synopsis::

        async with trio_procown.open_owned_command("sleep 30 & echo early; sleep 30", timeout=0.5) as run:
            receipt = await run.wait()
        for sentence in receipt.claims():
            print(sentence)
    """

    cause: Cause
    returncode: int | None
    domain: str
    forced: bool
    domain_empty: bool
    output: OutputState
    escaped: tuple[ProcessRecord, ...] = ()
    steps: tuple[Step, ...] = ()
    command: tuple[str, ...] = ()
    pid: int = 0
    domain_id: str = ""  # the pgid, or the cgroup path
    leftovers: tuple[ProcessRecord, ...] = ()  # members that outlived the leader
    unreaped: tuple[ProcessRecord, ...] = ()  # terminated, left to another reaper
    census: tuple[ProcessRecord, ...] = ()  # escapees found and what we did
    still_seen: tuple[ProcessRecord, ...] = ()  # members seen when the bound ran out
    streams: tuple[StreamRecord, ...] = ()
    escapee_policy: str = "terminate"
    census_scanned: bool = True  # False when some environments could not be read
    census_unreadable: int = 0  # processes whose environment the census could not read
    # How processes that left the domain are known: "kernel" (a cgroup: none
    # can leave it without privilege), "census" (the environment cookie only).
    escape_evidence: str = "census"
    keeper: KeeperState = "unknown"
    duration: float = 0.0
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        """Bytes dropped by the output size limit, all streams together."""
        return sum(s.dropped for s in self.streams)

    def _first(self, action: Action, target: str | None = None) -> Step | None:
        for step in self.steps:
            if step.action is action and (target is None or step.target == target):
                return step
        return None

    def _steps(self, action: Action, target: str | None = None) -> list[Step]:
        return [s for s in self.steps if s.action is action and (target is None or s.target == target)]

    def claims(self) -> list[str]:
        """The evidence as plain sentences, none stronger than the steps."""
        out: list[str] = []
        exit_step = self._first(Action.EXIT, "leader")
        signals = self._steps(Action.SIGNAL)
        first_signal = signals[0] if signals else None
        reap = self._first(Action.REAP, "leader")
        if reap is not None and reap.outcome == STATUS_LOST:
            status = "an exit status nobody could read (it was reaped by someone else; 0 is reported)"
        else:
            status = _describe_status(self.returncode)
        if self.cause == "exited" and exit_step is not None:
            out.append(
                f"The command (pid {self.pid}) exited by itself with {status} at +{exit_step.at:.3f}s, "
                "before anything was signalled."
            )
        elif self.cause == "timed_out":
            out.append(f"The command (pid {self.pid}) reached its own timeout.")
        elif self.cause == "cancelled":
            out.append(f"The block running the command (pid {self.pid}) was cancelled.")
        elif self.cause == "error":
            out.append(f"The block running the command (pid {self.pid}) raised an exception.")
        elif self.cause == "stopped":
            out.append(f"The command (pid {self.pid}) was stopped on request.")
        if self.returncode is None:
            out.append("Its direct process had not been seen to exit when the teardown ended: no status.")
        elif self.cause != "exited" or exit_step is None:
            out.append(f"Its direct process ended with {status}.")

        placement = self._first(Action.SCAN, "placement")
        if placement is not None:
            out.append(f"The leader's placement in its domain was checked: {placement.detail}.")

        if self.leftovers:
            names = _name_processes(self.leftovers)
            out.append(
                f"{len(self.leftovers)} process(es) of its domain outlived the leader "
                f"and were torn down as owned work; the fate each one's own evidence shows: {names}."
            )

        term = self._first(Action.SIGNAL)
        waits = self._steps(Action.WAIT, "domain")
        if term is not None:
            out.append(f"Sent {term.detail} at +{term.at:.3f}s.")
            grace = waits[0] if waits else None
            if grace is not None and grace.outcome == "empty" and not self.forced:
                when = (
                    "when the grace period had run out"
                    if RAN_OUT in grace.detail
                    else "within the grace period"
                )
                out.append(f"The domain was seen empty at +{grace.at:.3f}s, {when}; no SIGKILL was needed.")
            if self.forced:
                kill = next((s for s in signals if "SIGKILL" in s.signals), None)
                if kill is not None:
                    out.append(f"Members outlived the grace period; sent {kill.detail} at +{kill.at:.3f}s.")
                last = waits[-1] if waits else None
                if last is not None and last.outcome == "empty":
                    out.append(f"The domain was seen empty at +{last.at:.3f}s after the kill.")
        elif first_signal is None and self.domain_empty:
            out.append("Nothing of its domain was left running, so nothing was signalled.")

        for step in signals:
            if step.outcome.startswith("failed"):
                out.append(
                    f'At +{step.at:.3f}s the operating system refused part of "{step.detail}": '
                    f"{step.outcome.removeprefix('failed: ')}; the teardown went on to its next stage."
                )
        for step in self._steps(Action.ERROR):
            out.append(
                f"At +{step.at:.3f}s an action of the teardown failed ({step.detail}); "
                "the teardown went on to its next stage."
            )

        if self.domain_empty:
            out.append(f"No live process of the {self.domain} domain ({self.domain_id}) was seen at the end.")
        else:
            out.append(
                f"The {self.domain} domain ({self.domain_id}) was NOT proven empty: "
                + (_name_processes(self.still_seen) or "members were still listed")
                + "."
            )
        if self.escape_evidence == "census":
            out.append(
                f"Processes that left the {self.domain} domain are seen only by the census, through "
                "the environment cookie they inherit: a descendant that called setsid() and cleared its "
                "environment is invisible to it and could still be running."
            )
        elif self.escape_evidence == "kernel":
            out.append(
                f"No process leaves the {self.domain} domain without the privilege to write a cgroup.procs "
                "file (root's, or that of an owner the cgroup tree is delegated to, which its commands "
                "share): one that had it, moved itself out and cleared its environment would not be seen."
            )
        else:
            out.append(
                f"Processes that left the {self.domain} domain are known by {self.escape_evidence}, "
                "not by the kernel: one it cannot see could still be running."
            )
        if self.unreaped:
            out.append(
                f"{len(self.unreaped)} terminated member(s) were left as zombies for their "
                f"parent or init to reap (not reaped by us): {_name_processes(self.unreaped)}."
            )
        reaped = self.extras.get("reaped_orphans")
        if reaped:
            out.append(f"{reaped} orphan(s) of the command were reaped by us as subreaper.")

        release = self._first(Action.RELEASE)
        if release is not None:
            if release.outcome == "not removed":
                out.append(f"The domain was NOT fully released: {release.detail}.")
            else:
                out.append(f"The domain was released: {release.detail}.")
        keeper = _keeper_claim(self.keeper, str(self.extras.get("keeper_note", "")))
        if keeper:
            out.append(keeper)

        if self.census:
            how = (
                "each was signalled; the fate its own evidence shows"
                if self.escapee_policy == "terminate"
                else "they were reported, not signalled"
            )
            out.append(
                f"The census found {len(self.census)} process(es) that left the domain ({how}): "
                f"{_name_processes(self.census)}."
            )
        if self.escaped:
            out.append(
                f"{len(self.escaped)} process(es) escaped the domain and were still alive at the end: "
                f"{_name_processes(self.escaped)}."
            )
        if not self.census_scanned:
            if self.census_unreadable:
                out.append(
                    f"The census could not read the environment of {self.census_unreadable} process(es) "
                    "started since the command (another user's or a setuid program's): a process that "
                    "left the domain among them would not be seen."
                )
            else:
                out.append("No census was taken, so processes that left the domain would not be seen.")

        for stream in self.streams:
            if stream.state == "not captured":
                where = f" ({stream.target})" if stream.target else ""
                out.append(f"{stream.name}: not captured{where}; nothing about it is claimed.")
                continue
            if stream.state == "closed":
                out.append(
                    f"{stream.name}: reading was stopped by the caller (its reader went away) after "
                    f"{stream.captured} byte(s); later output was not read."
                )
            elif stream.state == "abandoned":
                out.append(
                    f"{stream.name}: the drain was abandoned after its bound with "
                    f"{stream.captured} byte(s) read; output may be missing."
                )
            else:
                out.append(f"{stream.name}: end of output reached, {stream.captured} byte(s) read.")
            if stream.dropped:
                out.append(
                    f"{stream.name}: {stream.dropped} byte(s) were dropped by the size limit "
                    f"(head and tail kept, {stream.kept} byte(s))."
                )
        handoff = self._first(Action.HANDOFF)
        if handoff is not None:
            out.append(f"Ownership was handed off at +{handoff.at:.3f}s: {handoff.detail}.")
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form of the receipt, claims included."""
        return {
            "cause": self.cause,
            "returncode": self.returncode,
            "domain": self.domain,
            "domain_id": self.domain_id,
            "forced": self.forced,
            "domain_empty": self.domain_empty,
            "output": self.output,
            "escaped": [p.to_dict() for p in self.escaped],
            "leftovers": [p.to_dict() for p in self.leftovers],
            "unreaped": [p.to_dict() for p in self.unreaped],
            "census": [p.to_dict() for p in self.census],
            "still_seen": [p.to_dict() for p in self.still_seen],
            "escapee_policy": self.escapee_policy,
            "census_scanned": self.census_scanned,
            "census_unreadable": self.census_unreadable,
            "escape_evidence": self.escape_evidence,
            "keeper": self.keeper,
            "streams": [s.to_dict() for s in self.streams],
            "steps": [s.to_dict() for s in self.steps],
            "command": list(self.command),
            "pid": self.pid,
            "duration": round(self.duration, 6),
            "extras": dict(self.extras),
            "claims": self.claims(),
        }

    def summary(self) -> str:
        """A short multi-line human summary."""
        head = (
            f"cause={self.cause} returncode={self.returncode} domain={self.domain} "
            f"forced={self.forced} domain_empty={self.domain_empty} output={self.output} "
            f"escaped={len(self.escaped)} duration={self.duration:.3f}s"
        )
        return "\n".join([head, *("  - " + c for c in self.claims())])


def _keeper_claim(state: KeeperState, note: str) -> str:
    """The sentence on the keeper, "" when there is nothing to say (guarded, unknown)."""
    unguarded = "had this process been killed before its teardown, nothing would have ended the domain."
    why = f" ({note})" if note else ""
    if state == "opted out":
        return f"No keeper was running for this command (opted out{': ' + note if note else ''}): {unguarded}"
    if state == "unavailable":
        return f"No keeper was running for this command{why}: {unguarded}"
    if state == "lost":
        return (
            f"The keeper told of this domain at its spawn was gone before the domain was released{why}: "
            f"from then on, {unguarded}"
        )
    if state == "replaced":
        return (
            "The keeper told of this domain at its spawn died while the command ran; a new keeper was told "
            f"of the domain at a later spawn or release of this process{why}. In between, {unguarded}"
        )
    return ""


# The outcome of the leader's reap step when someone else reaped it first.
STATUS_LOST = "status lost"


def _describe_status(returncode: int | None) -> str:
    if returncode is None:
        return "no status: it had not been seen to exit when the teardown ended"
    if returncode < 0:
        return f"{signame(-returncode)} (returncode {returncode})"
    return f"status {returncode}"


def _name_processes(procs: tuple[ProcessRecord, ...]) -> str:
    parts = []
    for p in procs[:10]:
        text = f"pid {p.pid}"
        if p.cmdline:
            text += f" ({p.cmdline[:80]})"
        if p.fate:
            text += f" [{p.fate}]"
        parts.append(text)
    if len(procs) > 10:
        parts.append(f"and {len(procs) - 10} more")
    return ", ".join(parts)
