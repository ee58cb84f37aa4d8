# One peer, one scenario, in a process of its own:
#   python -m benchmarks._peer_runner PEER DEADLINE RESULT_PATH COMMAND
#
# What it measures: the wall time from calling the peer to the peer handing
# control back (returning or raising), and whether the bytes the command
# printed before its deadline ("early") are in what the peer handed back.
# It creates RESULT_PATH.started just before calling the peer (the harness
# starts the peer's cap then), writes one JSON object to RESULT_PATH and leaves with os._exit(0), so
# no interpreter shutdown step (thread joins, transport finalizers, Popen
# destructors) can hang after the measurement.
#
# Why a process of its own: some peers never return (they wait for an EOF
# that a surviving descendant holds off forever). The parent harness
# (benchmarks/peers.py) gives this process a hard wall-clock cap and then
# kills everything carrying the per-run marker it put in our environment,
# ourselves included. Survivors are counted by the parent the same way.

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from typing import Any

import trio

import trio_procown

from ._peers import BY_KEY, LAST_RECEIPTS, Command, call_async, call_blocking

EARLY = b"early"


def _started(result_path: str) -> None:
    """Tell the harness the peer is about to be called: its cap runs from now."""
    with open(result_path + ".started", "w"):
        pass


def _measure(peer_key: str, command: Command, deadline: float, result_path: str) -> dict[str, Any]:
    peer = BY_KEY[peer_key]
    out: bytes | None = None
    error = ""
    if peer.kind == "trio":
        call = call_async(peer)
        times: list[float] = []

        async def main() -> bytes | None:
            times.append(time.perf_counter())
            try:
                return await call(command, deadline)
            finally:
                times.append(time.perf_counter())

        _started(result_path)
        try:
            out = trio.run(main)
        except BaseException:
            error = traceback.format_exc(limit=3)
        elapsed = times[1] - times[0] if len(times) == 2 else float("nan")
    else:
        loop = asyncio.new_event_loop() if peer.kind == "asyncio" else None
        blocking = call_blocking(peer, loop)
        _started(result_path)
        start = time.perf_counter()
        try:
            out = blocking(command, deadline)
        except BaseException:
            error = traceback.format_exc(limit=3)
        elapsed = time.perf_counter() - start
    return {
        "peer": peer_key,
        "returned": True,
        "seconds": elapsed,
        "output_returned": out is not None,
        "output_bytes": len(out) if out is not None else 0,
        "early_kept": out is not None and EARLY in out,
        "error": error,
        "receipts": [_receipt(r) for r in LAST_RECEIPTS],
    }


def _receipt(r: trio_procown.Receipt) -> dict[str, Any]:
    return {
        "cause": r.cause,
        "domain": r.domain,
        "forced": r.forced,
        "domain_empty": r.domain_empty,
        "output": r.output,
        "escaped": [str(e) for e in r.escaped],
        "duration": r.duration,
        "claims": list(r.claims()),
    }


def main() -> None:
    peer_key, deadline, result_path, command = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
    try:
        result = _measure(peer_key, command, deadline, result_path)
    except BaseException:
        result = {
            "peer": peer_key,
            "returned": True,
            "seconds": float("nan"),
            "error": traceback.format_exc(),
        }
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
