"""docs/receipt.schema.json (JSON Schema 2020-12) describes Receipt.to_dict().

The schema file itself is what is tested, as published: it forbids unknown
fields and requires every field, so a field added to or dropped from
to_dict() without the schema fails here. Receipts are real ones (a natural
exit, a timeout that needed SIGKILL, a cancellation, escapees found by the
census, output that was truncated or not captured), plus a constructed one
for `extras`, and the JSON that `procown run --receipt FILE` writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import trio

import trio_procown
from conftest import py
from helpers import ESCAPEE
from trio_procown import Receipt

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "docs" / "receipt.schema.json"
OPTIONAL: set[str] = set()  # fields the schema allows but to_dict() may leave out


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def minimal_receipt(**fields: Any) -> Receipt:
    """A receipt built directly, for the fields every receipt has."""
    base: dict[str, Any] = {
        "cause": "exited",
        "returncode": 0,
        "domain": "process-group",
        "forced": False,
        "domain_empty": True,
        "output": "complete",
    }
    return Receipt(**{**base, **fields})


def check(schema: dict[str, Any], receipt: Receipt) -> dict[str, Any]:
    """Validate the receipt's JSON (as a reader gets it) against the schema."""
    data: dict[str, Any] = json.loads(json.dumps(receipt.to_dict()))
    validate(schema, data)
    return data


def validate(schema: dict[str, Any], data: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    assert not errors, "receipt JSON does not match docs/receipt.schema.json:\n" + "\n".join(
        f"  at {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors
    )


def test_schema_is_strict_and_lists_every_field(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    properties = set(schema["properties"])
    required = set(schema["required"])
    assert required <= properties
    assert properties - required == OPTIONAL
    receipt = minimal_receipt()
    fields = set(receipt.to_dict())
    assert fields - properties == set(), f"to_dict() fields missing from the schema: {fields - properties}"
    assert required - fields == set(), f"schema fields that to_dict() no longer has: {required - fields}"


async def test_natural_exit(schema: dict[str, Any]) -> None:
    result = await trio_procown.run_owned(["sh", "-c", "echo out; echo err >&2; exit 3"])
    data = check(schema, result.receipt)
    assert (data["cause"], data["returncode"], data["output"]) == ("exited", 3, "complete")
    assert [s["name"] for s in data["streams"]] == ["stdout", "stderr"]


async def test_timeout_with_forced_kill(schema: dict[str, Any]) -> None:
    async with trio_procown.open_owned_command(
        ["sh", "-c", "trap '' TERM; echo ignoring; exec sleep 30"], timeout=0.5, grace=0.2, kill_wait=2
    ) as run:
        async for _ in run.lines():  # the trap is set once this is printed
            break
        await run.wait()
    assert run.receipt is not None
    data = check(schema, run.receipt)
    assert (data["cause"], data["forced"], data["returncode"]) == ("timed_out", True, -9)
    assert any(step["action"] == "signal" and "SIGKILL" in step["detail"] for step in data["steps"])


async def test_cancelled(schema: dict[str, Any]) -> None:
    with trio.move_on_after(0.3):
        async with trio_procown.open_owned_command("sleep 30 & echo early; sleep 30") as run:
            await run.wait()
    assert run.receipt is not None
    data = check(schema, run.receipt)
    assert data["cause"] == "cancelled"
    assert data["claims"]


async def test_escapees_found_by_the_census(schema: dict[str, Any]) -> None:
    # A member that calls setsid() leaves the process group; the census finds
    # it and (the default policy) terminates it.
    result = await trio_procown.run_owned(
        py(ESCAPEE + "import time; time.sleep(30)\n"),
        timeout=0.5,
        grace=0.5,
        domain="process-group",
    )
    data = check(schema, result.receipt)
    assert data["census"], data
    assert all(set(p) == {"pid", "cmdline", "fate"} for p in data["census"])


async def test_truncated_and_not_captured_streams(schema: dict[str, Any]) -> None:
    result = await trio_procown.run_owned(
        [sys.executable, "-c", "print('x' * 1000)"], max_output=100, stderr="devnull"
    )
    data = check(schema, result.receipt)
    assert data["output"] == "truncated"
    assert data["streams"][0]["dropped"] > 0


def test_extras_round_trip(schema: dict[str, Any]) -> None:
    """`extras` (here the orphans reaped as subreaper) is part of the JSON."""
    receipt = minimal_receipt(extras={"reaped_orphans": 1})
    data = check(schema, receipt)
    assert data["extras"] == {"reaped_orphans": 1}
    assert "1 orphan(s) of the command were reaped by us as subreaper." in data["claims"]


def test_procown_run_receipt_file(schema: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "receipt.json"
    subprocess.run(
        [sys.executable, "-m", "trio_procown", "run", "--receipt", str(path), "--", "sh", "-c", "echo hi"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=20,
        check=True,
    )
    validate(schema, json.loads(path.read_text(encoding="utf-8")))
