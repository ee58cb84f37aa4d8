# Scenario 9: memory per live owned command (issue 16: 1,000 idle `sleep`s,
# goal <= 64 KiB each, Python heap + fds).
#
# What it measures: a fresh interpreter (the probe below, run as
# `python -m benchmarks.memory VARIANT N plain|trace`) opens N commands `sleep 600` and
# holds them all open at once, then reads three figures per command:
#
#   heap  the bytes the interpreter has allocated with all N open, minus
#         the same figure just before the first one was opened, / N:
#         pymalloc's allocated blocks (sys._debugmallocstats) plus glibc
#         malloc's in-use bytes (mallinfo2). Python objects and the C
#         buffers behind them: the drain buffers, the receipt's steps,
#         trio's tasks and cancel scopes, the OwnedCommand itself. No
#         tracing, so it costs nothing at N = 1000; tracemalloc (traced
#         bytes, same difference) at a smaller N is the cross-check. Not
#         tracemalloc at N = 1000: tracing makes every allocation slow and
#         the traced run grew much faster than N here (3 s for 100 cgroup
#         commands, 21 s for 300, over 200 s for 1000).
#   fds   entries of /proc/self/fd, the same difference / N, and what they
#         are (pipe, pidfd, ...), read with readlink.
#   RSS   VmRSS from /proc/self/statm, the same difference / N. RSS counts
#         whole pages and whatever the allocators keep, so it is the coarse
#         figure; the heap is the precise one.
#
# How fds count in bytes: they don't. The kernel's cost of an fd (a struct
# file, a pipe's buffer pages, a pidfd's inode) is kernel memory outside the
# process: not in the heap, not in RSS, and not readable per fd. So the
# target row is the heap per command in KiB, and fds per command are a
# separate stated figure beside it (with the peer's, for comparison).
#
# Variants: run_owned in each usable domain (open_owned_command with the
# default capture of stdout and stderr, each block awaiting one shared
# event inside one nursery), and the peer: trio.run_process with
# capture_stdout/capture_stderr started with `nursery.start` (trio's own way
# to hold a process open while its output is drained). Before the baseline,
# each probe opens and closes a few commands of its variant, so trio's
# runtime, the keeper (one per owner process, not per command) and the code
# paths are loaded and not charged to the N.
#
# Then the nursery is cancelled (every command torn down at once; the time
# until all blocks have left is reported) and the probe counts live
# processes carrying the run's marker: 0 expected.
#
# Why a fresh process: the benchmark process already holds whatever the
# other scenarios allocated; only a clean interpreter shows the commands'
# own footprint.

from __future__ import annotations

import ctypes
import functools
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from typing import Any

import trio

from ._harness import (
    MARKER_VAR,
    Config,
    Section,
    Table,
    leftover_cgroups,
    marked_processes,
    usable_domains,
)

TARGET_KIB = 64.0
SLEEP = ["sleep", "600"]
WARMUP = 3
PEER = "trio.run_process (capture)"


# -- the probe (a fresh interpreter) -------------------------------------------------


def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return out


def _kind(link: str) -> str:
    if link.startswith("pipe:"):
        return "pipe"
    if link.startswith("anon_inode:"):
        return link.removeprefix("anon_inode:").strip("[]")
    if link.startswith("socket:"):
        return "socket"
    return "file"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _allocated_bytes() -> int | None:
    """Bytes the interpreter has allocated and not freed: pymalloc's
    allocated blocks (small objects; its arenas are mmap'd directly, not
    malloc'd) plus glibc malloc's in-use bytes (uordblks + hblkhd). No
    tracing, so it is cheap at any N; None where glibc's mallinfo2 is
    missing."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    small = None
    for line in text.splitlines():
        if line.startswith("# bytes in allocated blocks"):
            small = int(line.split("=")[1].strip().replace(",", ""))
    if small is None:
        return None
    return small + int(info.uordblks) + int(info.hblkhd)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _hold(variant: str, n: int, before: Any, measure: Any) -> dict[str, Any]:
    """Call before(), open n commands of `variant`, call measure() with all
    open, then cancel them all; returns what measure() returned. before()
    runs inside trio.run, so trio's own epoll fd and wake-up sockets are in
    the baseline."""
    import trio_procown

    release = trio.Event()

    async def owned(domain: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio_procown.open_owned_command(SLEEP, domain=domain):
            task_status.started()
            await release.wait()

    result: dict[str, Any] = {}
    before()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            if variant == "trio":
                await nursery.start(
                    functools.partial(
                        trio.run_process, SLEEP, capture_stdout=True, capture_stderr=True, check=False
                    )
                )
            else:
                await nursery.start(owned, variant)
        await trio.sleep(0.2)  # let every drain task reach its first wait
        result = measure()
        cancelled = time.perf_counter()
        nursery.cancel_scope.cancel()
    result["cancel_seconds"] = time.perf_counter() - cancelled
    return result


def probe(variant: str, n: int, heap: bool) -> dict[str, Any]:
    """All figures for n live commands of `variant`, as a JSON-ready dict."""
    trio.run(_hold, variant, WARMUP, lambda: None, dict)
    if heap:
        tracemalloc.start(1)
    base: dict[str, Any] = {}

    def before() -> None:
        gc.collect()
        base.update(
            fds=_fds(),
            rss=_rss_bytes(),
            alloc=_allocated_bytes(),
            heap=tracemalloc.get_traced_memory()[0] if heap else 0,
            t=time.perf_counter(),
        )

    def measure() -> dict[str, Any]:
        opened = time.perf_counter() - base["t"]
        gc.collect()
        fds_after = _fds()
        new = Counter(_kind(link) for fd, link in fds_after.items() if fd not in base["fds"])
        alloc = _allocated_bytes()
        return {
            "open_seconds": opened,
            "tracemalloc_bytes": (tracemalloc.get_traced_memory()[0] - base["heap"]) if heap else None,
            "allocated_bytes": None if alloc is None or base["alloc"] is None else alloc - base["alloc"],
            "rss_bytes": _rss_bytes() - base["rss"],
            "fds": len(fds_after) - len(base["fds"]),
            "fd_kinds": dict(new),
        }

    start = time.perf_counter()
    report = trio.run(_hold, variant, n, before, measure)
    report["seconds"] = time.perf_counter() - start
    if heap:
        tracemalloc.stop()
    marker = os.environ.get(MARKER_VAR, "")
    left: list[tuple[int, str]] = []
    for _ in range(50):  # SIGTERM'd sleeps may take a moment to be gone (trio peer)
        left = [p for p in marked_processes(marker) if "sleep 600" in p[1]] if marker else []
        if not left:
            break
        time.sleep(0.02)
    report.update(
        variant=variant,
        n=n,
        heap=heap,
        survivors=len(left),
        leftover_cgroups=leftover_cgroups(os.getpid(), remove=True),
    )
    return report


def main() -> None:
    variant, n, heap = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "trace"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(probe(variant, n, heap)))


# -- the scenario ----------------------------------------------------------------------


def _run_probe(variant: str, n: int, trace: bool) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", variant, str(n), "trace" if trace else "plain"],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        return {"variant": variant, "error": done.stderr.strip()[-2000:]}
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def _label(variant: str) -> str:
    return PEER if variant == "trio" else f"run_owned {variant}"


def _kib(value: Any, n: int) -> str:
    return "n/a" if value is None else f"{value / n / 1024:.1f}"


async def run(cfg: Config) -> Section:
    section = Section(
        "memory",
        "9. Memory per live owned command (idle `sleep`s held open)",
        "A fresh interpreter holds N `sleep 600` commands open at once (one nursery, each block awaiting "
        "an event), per domain and for trio.run_process with capture. Per command: the Python heap "
        "(bytes allocated by the interpreter: pymalloc's blocks + malloc's in-use bytes, no tracing), "
        "fds (/proc/self/fd) and RSS (statm); tracemalloc at a smaller N as a cross-check of the heap. "
        "The target is the heap per command: fds are kernel objects outside the process, with no byte "
        "figure per fd to read, so they are stated beside it as a count, not converted to bytes. Then "
        "everything is cancelled and live `sleep`s carrying the run's marker are counted.",
    )
    n = cfg.pick(50, 1000)
    n_trace = 50
    variants = [*usable_domains(), "trio"]
    plain = {v: await trio.to_thread.run_sync(_run_probe, v, n, False) for v in variants}
    # The cross-check costs a fresh interpreter per variant: full runs only.
    traced: dict[str, dict[str, Any]] = {v: {} for v in variants}
    if not cfg.quick:
        traced = {v: await trio.to_thread.run_sync(_run_probe, v, n_trace, True) for v in variants}

    peer_heap = plain["trio"].get("allocated_bytes")
    rows = []
    errors = []
    for v in variants:
        p, t = plain[v], traced[v]
        if "error" in p or "error" in t:
            errors.append(f"{_label(v)}: {p.get('error') or t.get('error')}")
            rows.append([_label(v), "failed", "", "", "", "", "", "", ""])
            continue
        heap = p["allocated_bytes"]
        kinds = ", ".join(f"{k} {c / n:g}" for k, c in sorted(p["fd_kinds"].items()))
        target = ""
        if v != "trio" and heap is not None:
            verdict = section.target(f"heap per live command, {v}", heap / n / 1024, TARGET_KIB, "KiB")
            target = f"≤ {TARGET_KIB:g} KiB → {verdict}"
        rows.append(
            [
                _label(v),
                _kib(heap, n),
                f"{heap / peer_heap:.2f}" if heap and peer_heap else "n/a",
                _kib(t.get("tracemalloc_bytes"), n_trace),
                f"{p['fds'] / n:g} ({kinds})",
                _kib(p["rss_bytes"], n),
                f"{p['open_seconds']:.1f} / {p['cancel_seconds']:.1f}",
                f"{p['survivors']} / {t.get('survivors', '-')}",
                target,
            ]
        )
    section.tables.append(
        Table(
            [
                "variant",
                "heap KiB / command",
                "heap x trio",
                f"tracemalloc KiB / command (N = {n_trace})",
                "fds / command (kinds)",
                "RSS KiB / command",
                "open all s / cancel all s",
                "survivors",
                "target (heap)",
            ],
            rows,
            caption=f"N = {n} live commands per variant, each probe a fresh interpreter after {WARMUP} "
            "warm-up commands (trio's runtime, the code paths and the keeper, one per owner process, are "
            "in the baseline); stdout and stderr captured on both sides. Heap and RSS: with all N open "
            "minus before, / N. 'cancel all': from the cancel until every block has left (N teardowns at "
            "once). Survivors: live `sleep 600`s carrying the marker after the cancel (plain "
            "run / tracemalloc run).",
        )
    )
    for e in errors:
        section.notes.append(f"probe failed: {e}")
    leftover = sorted({c for d in (plain, traced) for r in d.values() for c in r.get("leftover_cgroups", [])})
    if leftover:
        section.notes.append(f"cgroups left by the probes (removed): {', '.join(leftover[:5])}")
    section.data = {
        "n": n,
        "n_tracemalloc": n_trace,
        "target_kib": TARGET_KIB,
        "runs": plain,
        "tracemalloc_runs": traced,
        "heap_kib_per_command": {
            v: plain[v]["allocated_bytes"] / n / 1024
            for v in variants
            if plain[v].get("allocated_bytes") is not None
        },
    }
    heaps = section.data["heap_kib_per_command"]
    if heaps:
        from ._plots import bars, save

        save(
            section,
            cfg,
            "memory.png",
            "Python heap per live command",
            bars(
                f"Python heap per live command (N = {n} idle sleeps)",
                "KiB per command",
                [(_label(v), kib, f"{kib:.1f} KiB") for v, kib in heaps.items()],
                ours=lambda name: name.startswith("run_owned"),
                floor=TARGET_KIB,
                floor_label=f"target {TARGET_KIB:g} KiB",
            ),
        )
    return section


if __name__ == "__main__":
    main()
