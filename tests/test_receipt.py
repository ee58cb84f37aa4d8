"""claims() from synthetic receipts: every sentence it can say, and none
stronger than the steps behind it. No processes."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from trio_procown import Action, ProcessRecord, Receipt, Step, StreamRecord

A = Action


def receipt(*steps: Step, **fields: Any) -> Receipt:
    base: dict[str, Any] = {
        "cause": "timed_out",
        "returncode": -15,
        "domain": "process-group",
        "forced": False,
        "domain_empty": True,
        "output": "complete",
        "pid": 42,
        "domain_id": "pgid 42",
        "steps": steps,
    }
    base.update(fields)
    return Receipt(**base)


TERM = Step(0.5, A.SIGNAL, "domain", "SIGTERM+SIGCONT to process group 42", "", ("SIGTERM", "SIGCONT"))
KILL = Step(2.5, A.SIGNAL, "domain", "SIGKILL to process group 42", "", ("SIGKILL",))
GRACE_EMPTY = Step(0.6, A.WAIT, "domain", "budget 2s (grace)", "empty")
GRACE_EXPIRED = Step(2.5, A.WAIT, "domain", "budget 2s (grace)", "expired")
KILL_EMPTY = Step(2.6, A.WAIT, "domain", "budget 1s (kill_wait)", "empty")
EXIT = Step(0.1, A.EXIT, "leader", "returncode 3", "exited")


def says(r: Receipt, text: str) -> bool:
    return any(text in c for c in r.claims())


@pytest.mark.parametrize(
    ("cause", "text"),
    [
        ("timed_out", "reached its own timeout"),
        ("cancelled", "was cancelled"),
        ("error", "raised an exception"),
        ("stopped", "was stopped on request"),
    ],
)
def test_each_cause_has_its_sentence(cause: str, text: str) -> None:
    """Every cause other than exited is said as such, followed by the direct process's status."""
    r = receipt(TERM, GRACE_EMPTY, cause=cause)
    assert says(r, text)
    assert says(r, "Its direct process ended with SIGTERM (returncode -15).")


def test_natural_exit_is_before_any_signal() -> None:
    """An exit by itself is said with its status and 'before anything was signalled'."""
    r = receipt(EXIT, cause="exited", returncode=3)
    assert (
        r.claims()[0]
        == "The command (pid 42) exited by itself with status 3 at +0.100s, before anything was signalled."
    )
    assert says(r, "Nothing of its domain was left running, so nothing was signalled.")


def test_graceful_empty_within_grace() -> None:
    """Empty within the grace, not forced: no SIGKILL was needed."""
    r = receipt(TERM, GRACE_EMPTY)
    assert says(r, "Sent SIGTERM+SIGCONT to process group 42 at +0.500s.")
    assert says(r, "seen empty at +0.600s, within the grace period; no SIGKILL was needed")


def test_forced_and_emptied_after_the_kill() -> None:
    """Forced: the SIGKILL step (found by its signals field, not its text) and the empty after it."""
    kill = Step(2.5, A.SIGNAL, "domain", "force via cgroup.kill", "", ("SIGKILL",))
    r = receipt(TERM, GRACE_EXPIRED, kill, KILL_EMPTY, forced=True, returncode=-9)
    assert says(r, "Members outlived the grace period; sent force via cgroup.kill at +2.500s.")
    assert says(r, "The domain was seen empty at +2.600s after the kill.")
    assert not says(r, "no SIGKILL was needed")


def test_not_proven_empty_names_what_was_seen() -> None:
    """Not proven empty: NOT proven empty, with what was still seen; never 'No live process'."""
    r = receipt(
        TERM, KILL, forced=True, domain_empty=False, still_seen=(ProcessRecord(7, "sleep 30", "alive"),)
    )
    assert says(r, "was NOT proven empty: pid 7 (sleep 30) [alive]")
    assert not says(r, "No live process")


def test_empty_domain_sentence() -> None:
    """Proven empty: 'No live process ... was seen at the end' (seen, not 'everything stopped')."""
    assert says(
        receipt(TERM, GRACE_EMPTY),
        "No live process of the process-group domain (pgid 42) was seen at the end.",
    )


def test_refused_signals_and_failed_actions_are_said() -> None:
    """A refused signal and an action that failed each get a sentence that the teardown went on."""
    refused = Step(
        0.5, A.SIGNAL, "domain", "SIGTERM+SIGCONT to process group 42", "failed: SIGTERM: EPERM (x)"
    )
    error = Step(0.7, A.ERROR, "teardown", "SIGNAL_GRACEFUL: OSError: boom", "failed")
    r = receipt(refused, error, domain_empty=False)
    assert says(r, 'refused part of "SIGTERM+SIGCONT to process group 42": SIGTERM: EPERM (x)')
    assert says(r, "an action of the teardown failed (SIGNAL_GRACEFUL: OSError: boom)")


def test_a_leader_never_seen_to_exit_is_not_said_to_have_ended() -> None:
    """No status (a leader whose signals were refused, still alive): the receipt does not say it ended."""
    r = receipt(TERM, KILL, returncode=None, domain_empty=False, forced=True)
    assert says(r, "Its direct process had not been seen to exit when the teardown ended: no status.")
    assert not says(r, "ended with")


def test_the_kernels_evidence_names_the_privilege_that_escapes_it() -> None:
    """A cgroup receipt (escape_evidence "kernel") says which privilege could still
    leave the cgroup unseen; a census receipt keeps its own sentence instead."""
    kernel = receipt(domain="cgroup", domain_id="/cg/x", escape_evidence="kernel")
    assert says(kernel, "No process leaves the cgroup domain without the privilege to write a cgroup.procs")
    assert not says(kernel, "seen only by the census")
    census = receipt(escape_evidence="census")
    assert says(census, "seen only by the census")
    assert not says(census, "cgroup.procs")


def test_placement_and_release_sentences() -> None:
    """The placement check and the release (done or NOT done) are said with their details."""
    placement = Step(0.0, A.SCAN, "placement", "placement FAILED: the leader runs outside", "not verified")
    kept = Step(1.0, A.RELEASE, "domain", "cgroup NOT removed: /x (still populated)", "not removed")
    r = receipt(placement, kept)
    assert says(r, "placement in its domain was checked: placement FAILED")
    assert says(r, "The domain was NOT fully released: cgroup NOT removed: /x (still populated).")
    assert says(
        receipt(Step(1.0, A.RELEASE, "domain", "removed cgroup /x", "removed")), "The domain was released"
    )


def test_leftovers_unreaped_and_orphans() -> None:
    """Leftovers with their fates, zombies left to another reaper, orphans we reaped."""
    r = receipt(
        EXIT,
        TERM,
        GRACE_EMPTY,
        cause="exited",
        returncode=0,
        leftovers=(ProcessRecord(8, "sleep", "terminated"),),
        unreaped=(ProcessRecord(9, "", "zombie"),),
        extras={"reaped_orphans": 2},
    )
    assert says(r, "1 process(es) of its domain outlived the leader")
    assert says(r, "pid 8 (sleep) [terminated]")
    assert says(r, "left as zombies for their parent or init to reap (not reaped by us): pid 9 [zombie]")
    assert says(r, "2 orphan(s) of the command were reaped by us as subreaper.")


@pytest.mark.parametrize(
    ("policy", "text"), [("terminate", "each was signalled"), ("report", "they were reported, not signalled")]
)
def test_census_sentences(policy: str, text: str) -> None:
    """Census hits under each policy, and escapees still alive at the end."""
    r = receipt(
        TERM,
        GRACE_EMPTY,
        escapee_policy=policy,
        census=(ProcessRecord(11, "daemon", "killed"),),
        escaped=(ProcessRecord(12, "other", "alive"),),
    )
    assert says(r, f"The census found 1 process(es) that left the domain ({text}")
    assert says(
        r, "1 process(es) escaped the domain and were still alive at the end: pid 12 (other) [alive]."
    )


def test_census_blindness_is_said() -> None:
    """Unreadable environments, or no census at all, are said; a full census says nothing."""
    assert says(
        receipt(census_scanned=False, census_unreadable=3), "could not read the environment of 3 process(es)"
    )
    assert says(receipt(census_scanned=False), "No census was taken")
    # A full census under kernel evidence says nothing of the census; under
    # the census's own evidence, what it cannot see is said (test_keeper.py).
    assert not says(receipt(escape_evidence="kernel"), "census")


def test_stream_sentences() -> None:
    """EOF, abandoned, dropped bytes and not captured, each per stream."""
    r = receipt(
        output="abandoned",
        streams=(
            StreamRecord("stdout", "eof", 100, 60, 40),
            StreamRecord("stderr", "abandoned", 5, 5, 0),
        ),
    )
    assert says(r, "stdout: end of output reached, 100 byte(s) read.")
    assert says(r, "stdout: 40 byte(s) were dropped by the size limit (head and tail kept, 60 byte(s)).")
    assert says(
        r, "stderr: the drain was abandoned after its bound with 5 byte(s) read; output may be missing."
    )
    quiet = receipt(
        output="not captured", streams=(StreamRecord("stdout", "not captured", 0, 0, 0, "devnull"),)
    )
    assert says(quiet, "stdout: not captured (devnull); nothing about it is claimed.")


def test_handoff_sentence() -> None:
    """A handoff is said with its time and detail."""
    r = receipt(Step(1.5, A.HANDOFF, "owner", "to session: shared"))
    assert says(r, "Ownership was handed off at +1.500s: to session: shared.")


def test_steps_carry_their_signals_in_json() -> None:
    """A signal step's signals are a field of the step and of its JSON form."""
    assert KILL.to_dict()["signals"] == ["SIGKILL"]
    assert receipt(KILL).to_dict()["steps"][0]["signals"] == ["SIGKILL"]


# A stream's end, as StreamRecord.state types it.
StreamState = Literal["eof", "abandoned", "closed", "not captured"]


@pytest.mark.parametrize(
    ("states", "dropped", "expected"),
    [
        (("eof", "eof"), 0, "complete"),
        (("eof", "eof"), 5, "truncated"),
        (("eof", "abandoned"), 0, "abandoned"),
        (("closed", "abandoned"), 0, "abandoned"),
        (("closed", "eof"), 5, "closed"),
        (("not captured", "not captured"), 0, "not captured"),
        (("eof", "not captured"), 0, "complete"),
    ],
)
def test_output_state_is_derived_from_the_streams(
    states: tuple[StreamState, StreamState], dropped: int, expected: str
) -> None:
    """output_of(): complete only with EOF on every captured stream; abandoned beats closed; drops truncate"""
    from trio_procown._receipt import output_of

    streams = [
        StreamRecord(name, state, 10, 10 - dropped, dropped)
        for name, state in zip(("stdout", "stderr"), states, strict=True)
    ]
    assert output_of(streams) == expected


def test_output_state_follows_its_rule_for_every_pair_of_streams() -> None:
    """output_of() on every pair of stream ends, with and without dropped
    bytes on each: "not captured" only when no stream is captured, then
    abandoned before closed before truncated (bytes dropped from a captured
    stream) before complete, as its docstring states."""
    import itertools

    from trio_procown._receipt import output_of

    ends: tuple[StreamState, ...] = ("eof", "abandoned", "closed", "not captured")
    drops = (0, 3)
    for a, b, da, db in itertools.product(ends, ends, drops, drops):
        streams = [
            StreamRecord("stdout", a, 10, 10 - da, da if a != "not captured" else 0),
            StreamRecord("stderr", b, 10, 10 - db, db if b != "not captured" else 0),
        ]
        captured = [s for s in streams if s.state != "not captured"]
        if not captured:
            want = "not captured"
        elif any(s.state == "abandoned" for s in captured):
            want = "abandoned"
        elif any(s.state == "closed" for s in captured):
            want = "closed"
        elif any(s.dropped for s in captured):
            want = "truncated"
        else:
            want = "complete"
        assert output_of(streams) == want, (a, b, da, db)
