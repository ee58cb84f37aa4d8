# Peak-memory probe for the drain benchmark, run in a fresh interpreter:
#   python -m benchmarks._memprobe VARIANT SIZE
# VARIANT is run_owned (max_output = 1 MiB), plain (blocking os.read loop,
# 1 MiB reads), trio (trio.run_process(capture_stdout=True)), or one of the
# peers of benchmarks/_peers.py: subprocess.run, anyio, asyncio, adk (each
# as its recipe is written, keeping all the output it captures).
#
# What it measures: how much the process's resident memory grows above its
# own baseline while draining SIZE bytes from a command. Baseline: after the
# imports and one 1 MiB warm-up run of the same variant (so code paths and
# trio's runtime are loaded), VmRSS; then VmHWM is reset by writing "5" to
# /proc/self/clear_refs, the big run happens, and VmHWM is read again. The
# getrusage ru_maxrss before/after is reported too (it cannot be reset).
# Prints one JSON object on stdout.
#
# Why a fresh process: the parent benchmark holds hundreds of MB from the
# other variants; only a clean interpreter shows the drain's own footprint.

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
from typing import Any

import trio

import trio_procown

from ._harness import leftover_cgroups
from ._peers import BY_KEY, call_async, call_blocking
from .drain import writer_argv


def _status_kib() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _plain(size: int) -> int:
    proc = subprocess.Popen(writer_argv(size), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
    proc.wait()
    proc.stdout.close()
    return total


async def _owned(size: int) -> int:
    result = await trio_procown.run_owned(writer_argv(size), max_output=1 << 20)
    return result.receipt.streams[0].captured


async def _trio(size: int) -> int:
    result = await trio.run_process(writer_argv(size), capture_stdout=True)
    return len(result.stdout)


def _peer(key: str, size: int) -> int:
    peer = BY_KEY[key]
    argv = writer_argv(size)
    out: bytes | None
    if peer.kind == "trio":
        call = call_async(peer)

        async def main() -> bytes | None:
            return await call(argv, 600.0)

        out = trio.run(main)
    else:
        loop = asyncio.new_event_loop() if peer.kind == "asyncio" else None
        try:
            out = call_blocking(peer, loop)(argv, 600.0)
        finally:
            if loop is not None:
                loop.close()
    return 0 if out is None else len(out)


def _once(variant: str, size: int) -> int:
    if variant in BY_KEY:
        return _peer(variant, size)
    if variant == "plain":
        return _plain(size)
    if variant == "run_owned":
        return trio.run(_owned, size)
    if variant == "trio":
        return trio.run(_trio, size)
    msg = f"unknown variant {variant!r}"
    raise SystemExit(msg)


def main() -> None:
    variant, size = sys.argv[1], int(sys.argv[2])
    _once(variant, 1 << 20)
    base = _status_kib()
    ru_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reset = _reset_hwm()
    got = _once(variant, size)
    peak = _status_kib()
    ru_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report: dict[str, Any] = {
        "variant": variant,
        "size": size,
        "bytes_seen": got,
        "baseline_rss_kib": base["VmRSS"],
        "hwm_reset": reset,
        "peak_hwm_kib": peak["VmHWM"],
        "delta_kib": peak["VmHWM"] - base["VmRSS"],
        "ru_maxrss_before_kib": ru_before,
        "ru_maxrss_after_kib": ru_after,
        "ru_delta_kib": ru_after - ru_before,
        "leftover_cgroups": leftover_cgroups(os.getpid(), remove=True),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
