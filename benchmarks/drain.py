# Scenario 4: drain throughput and memory.
#
# What it measures: how fast each runtime empties a pipe that a command
# fills as fast as it can. The writer is a Python process writing zeros in
# 1 MiB os.write calls (same writer for every variant, so its own cost and
# start-up are common to all). Variants, interleaved per round:
#   - trio.run_process(capture_stdout=True): keeps everything in memory, so
#     it runs at a smaller size (256 MB full, 100 MB quick);
#   - run_owned(max_output=1 MiB) at that same size (same-size comparison);
#   - a plain blocking os.read loop (1 MiB reads) on a subprocess.Popen pipe,
#     at the large size (1 GB full, 200 MB quick), as is (64 KiB pipe: the
#     target's reference) and with the pipe enlarged to 1 MiB like the
#     library's drain does (a steadier reference: with a 64 KiB pipe, reader
#     and writer ping-pong when they share a CPU, so that loop is bimodal);
#   - run_owned(max_output=1 MiB) at the large size;
#   - run_owned at the large size with its stdout read as it arrives
#     (run.stream, lossless, as `procown run` forwards it), max_output at
#     its default (64 MiB): most bytes are read from the record's tail;
#   - the writer with stdout on /dev/null: the ceiling no reader can beat.
# Throughput is bytes / wall time from call to return (spawn included).
# Then peak memory of run_owned at the large size above the interpreter's
# baseline, in a fresh interpreter (benchmarks/_memprobe.py), with the plain
# loop and trio's capture as references.
#
# The peers (benchmarks/_peers.py), as their recipes are written, run at
# the small size in the same rounds: subprocess.run(capture_output=True)
# (the communicate recipe reads the same way), anyio.run_process, the
# asyncio recipe and the ADK-style teardown (both on one asyncio loop). Each
# also gets a fresh-interpreter memory probe at the small size, next to
# run_owned at the same size.
#
# Why: an owned command has one drain per stream for its whole life; it must
# not be the bottleneck of a chatty command nor grow with its output.
# Targets (printed): run_owned >= 3 x trio's capture, >= 0.7 x the plain
# loop, peak memory < 16 MiB above baseline.

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

import trio_procown

from . import _plots
from ._harness import Config, Measure, Section, Stats, Table, interleaved, ratio, timed_async, timed_sync
from ._peers import BY_KEY, Peer, call_async, call_blocking, missing_module

MiB = 1 << 20
WRITER = r"""
import os, sys
left = int(sys.argv[1])
block = memoryview(bytes(1 << 20))
while left > 0:
    left -= os.write(1, block[:min(left, len(block))])
"""


def writer_argv(size: int) -> list[str]:
    return [sys.executable, "-S", "-c", WRITER, str(size)]


def _plain_loop(size: int, problems: list[str], *, enlarge: bool = False) -> None:
    proc = subprocess.Popen(writer_argv(size), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    if enlarge:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, MiB)
    total = 0
    while chunk := os.read(fd, MiB):
        total += len(chunk)
    proc.wait()
    proc.stdout.close()
    if total != size:
        problems.append(f"plain loop read {total} of {size}")


def _ceiling(size: int) -> None:
    subprocess.run(writer_argv(size), stdout=subprocess.DEVNULL, check=True)


async def _trio(size: int, problems: list[str]) -> None:
    result = await trio.run_process(writer_argv(size), capture_stdout=True)
    if len(result.stdout) != size:
        problems.append(f"trio captured {len(result.stdout)} of {size}")


async def _owned(size: int, problems: list[str]) -> None:
    result = await trio_procown.run_owned(writer_argv(size), max_output=MiB)
    r = result.receipt
    out = next((s for s in r.streams if s.name == "stdout"), None)
    if out is None or out.captured != size or r.cause != "exited" or r.output != "truncated":
        problems.append(f"run_owned: cause={r.cause} output={r.output} stdout={out}")


async def _owned_streamed(size: int, problems: list[str]) -> None:
    # As `procown run` forwards a stream: every byte read as it arrives, the
    # record bounded at the default max_output (64 MiB), so most of a large
    # stream is read from the record's tail.
    total = 0
    async with (
        trio_procown.open_owned_command(writer_argv(size)) as run,
        run.stream("stdout", lossless=True) as chunks,
    ):
        async for chunk in chunks:
            total += len(chunk)
    r = run.receipt
    if total != size or r is None or r.cause != "exited":
        problems.append(f"run_owned streamed: read {total} of {size}, receipt {r and r.cause}")


FAR = 600.0  # the peers' deadline: never reached
PEER_VARIANTS = {
    "peer: subprocess.run capture_output": "subprocess.run",
    "peer: anyio.run_process": "anyio",
    "peer: asyncio communicate()": "asyncio",
    "peer: ADK-style (re-implemented)": "adk",
}


def _peer_measure(peer: Peer, size: int, loop: asyncio.AbstractEventLoop, problems: list[str]) -> Measure:
    argv = writer_argv(size)

    def check(out: bytes | None) -> None:
        if out is None or len(out) != size:
            problems.append(f"{peer.key} returned {None if out is None else len(out)} of {size} bytes")

    if peer.kind == "trio":
        call = call_async(peer)

        async def run_async() -> None:
            check(await call(argv, FAR))

        return timed_async(run_async)
    blocking = call_blocking(peer, loop)
    return timed_sync(lambda: check(blocking(argv, FAR)))


def _probe(variant: str, size: int) -> dict[str, object]:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._memprobe", variant, str(size)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        return {"variant": variant, "size": size, "error": proc.stderr.strip()[-500:]}
    data: dict[str, object] = json.loads(proc.stdout)
    return data


async def run(cfg: Config) -> Section:
    section = Section(
        "drain",
        "4. Drain throughput and memory",
        "A Python writer emits zeros in 1 MiB writes; GB/s = bytes / (call → return). 1 GB = 10^9 bytes.",
    )
    small = cfg.pick(100_000_000, 256_000_000)
    big = cfg.pick(200_000_000, 1_000_000_000)
    rounds = cfg.pick(3, 7)
    problems: list[str] = []

    trio_name = "trio.run_process capture_stdout"
    owned_small = "run_owned max_output=1MiB (small)"
    plain_name = "plain os.read loop, 1 MiB reads"
    plain_big_pipe = "plain os.read loop, 1 MiB reads, 1 MiB pipe"
    owned_big = "run_owned max_output=1MiB"
    owned_streamed = "run_owned, stdout streamed (lossless, default max_output)"
    ceiling_name = "writer → /dev/null (ceiling)"
    sizes: dict[str, int] = {trio_name: small}
    variants: dict[str, Measure] = {trio_name: timed_async(lambda: _trio(small, problems))}
    if big != small:
        sizes[owned_small] = small
        variants[owned_small] = timed_async(lambda: _owned(small, problems))
    sizes.update(
        {plain_name: big, plain_big_pipe: big, owned_big: big, owned_streamed: big, ceiling_name: big}
    )
    variants[plain_name] = timed_sync(lambda: _plain_loop(big, problems))
    variants[plain_big_pipe] = timed_sync(lambda: _plain_loop(big, problems, enlarge=True))
    variants[owned_big] = timed_async(lambda: _owned(big, problems))
    variants[owned_streamed] = timed_async(lambda: _owned_streamed(big, problems))
    variants[ceiling_name] = timed_sync(lambda: _ceiling(big))
    loop = asyncio.new_event_loop()
    peer_probes: list[str] = []
    for name, key in PEER_VARIANTS.items():
        peer = BY_KEY[key]
        why = missing_module(peer)
        if why:
            section.notes.append(f"{name} skipped: {why} is not installed ({_plots.INSTALL_HINT})")
            continue
        sizes[name] = small
        variants[name] = _peer_measure(peer, small, loop, problems)
        peer_probes.append(key)

    try:
        samples = await interleaved(variants, rounds, warmup=1)
    finally:
        loop.close()
    gbps = {name: Stats.of([sizes[name] / t / 1e9 for t in s]) for name, s in samples.items()}

    owned_same = owned_small if big != small else owned_big
    r_trio_same = gbps[owned_same].median / gbps[trio_name].median
    r_trio_cross = gbps[owned_big].median / gbps[trio_name].median
    r_plain = gbps[owned_big].median / gbps[plain_name].median
    r_plain_big = gbps[owned_big].median / gbps[plain_big_pipe].median
    v_trio = section.target("run_owned / trio capture (same size)", r_trio_same, 3.0, "x", at_most=False)
    v_plain = section.target("run_owned / plain loop", r_plain, 0.7, "x", at_most=False)

    table = Table(
        ["variant", "size MB", "GB/s median", "min", "max", "x trio capture", "x plain loop"],
        [],
        caption=f"{rounds} rounds (interleaved) after 1 warm-up round.",
    )
    for name, st in gbps.items():
        table.rows.append(
            [
                name,
                f"{sizes[name] / 1e6:,.0f}",
                f"{st.median:.2f}",
                f"{st.min:.2f}",
                f"{st.max:.2f}",
                ratio(st.median / gbps[trio_name].median),
                ratio(st.median / gbps[plain_name].median),
            ]
        )
    section.tables.append(table)
    targets = Table(
        ["target", "measured", "verdict"],
        [
            [f"run_owned ≥ 3 x trio capture (both {small / 1e6:,.0f} MB)", f"{r_trio_same:.2f} x", v_trio],
            [
                f"(for reference: run_owned {big / 1e6:,.0f} MB vs trio {small / 1e6:,.0f} MB)",
                f"{r_trio_cross:.2f} x",
                "",
            ],
            [f"run_owned ≥ 0.7 x plain loop (both {big / 1e6:,.0f} MB)", f"{r_plain:.2f} x", v_plain],
            [
                f"(for reference: run_owned vs plain loop on a 1 MiB pipe, both {big / 1e6:,.0f} MB)",
                f"{r_plain_big:.2f} x",
                "",
            ],
        ],
    )
    section.tables.append(targets)

    probes = [_probe("run_owned", big), _probe("plain", big), _probe("trio", small)]
    probes += [_probe("run_owned", small)] if small != big else []
    probes += [_probe(key, small) for key in peer_probes]
    mem = Table(
        [
            "variant",
            "size MB",
            "baseline RSS MiB",
            "peak above baseline MiB",
            "ru_maxrss growth MiB",
            "target",
        ],
        [],
        caption="Fresh interpreter per row; peak = VmHWM after resetting it (clear_refs 5) minus VmRSS at baseline.",
    )
    for p in probes:
        if "error" in p:
            mem.rows.append([str(p["variant"]), "", "", f"error: {p['error']}", "", ""])
            continue
        delta = float(str(p["delta_kib"])) / 1024
        target = ""
        if p.get("leftover_cgroups"):
            problems.append(f"memprobe {p['variant']}: cgroups left behind: {p['leftover_cgroups']}")
        if p["variant"] == "run_owned" and p.get("size") == big:
            if p.get("bytes_seen") != big:
                problems.append(f"memprobe run_owned saw {p.get('bytes_seen')} of {big}")
            target = (
                f"< 16 MiB → {section.target('run_owned peak memory above baseline', delta, 16.0, 'MiB')}"
            )
        mem.rows.append(
            [
                str(p["variant"]),
                f"{int(str(p['size'])) / 1e6:,.0f}",
                f"{float(str(p['baseline_rss_kib'])) / 1024:.1f}",
                f"{delta:.1f}",
                f"{float(str(p['ru_delta_kib'])) / 1024:.1f}",
                target,
            ]
        )
    section.tables.append(mem)
    ours = ("run_owned",)
    _plots.save(
        section,
        cfg,
        "drain_cost.png",
        "Drain throughput and peak memory per variant",
        _drain_plot(gbps, sizes, trio_name, probes, ours),
    )
    if problems:
        section.notes.append(f"{len(problems)} unexpected outcome(s); first: {problems[0]}")
    section.data = {
        "sizes": sizes,
        "rounds": rounds,
        "gbps": {k: v.to_dict() for k, v in gbps.items()},
        "samples_seconds": samples,
        "ratio_owned_vs_trio_same_size": r_trio_same,
        "ratio_owned_big_vs_trio_small": r_trio_cross,
        "ratio_owned_vs_plain": r_plain,
        "ratio_owned_vs_plain_1mib_pipe": r_plain_big,
        "memory": probes,
        "problems": problems,
    }
    return section


def _drain_plot(
    gbps: dict[str, Stats],
    sizes: dict[str, int],
    trio_name: str,
    probes: list[dict[str, object]],
    ours: tuple[str, ...],
) -> Callable[[Any], None]:
    """Two panels: GB/s per variant (ceiling left out: it dwarfs the rest),
    and peak memory above baseline per probe."""

    def draw(plt: Any) -> None:
        rows = [(n, st) for n, st in gbps.items() if "ceiling" not in n]
        rows.sort(key=lambda r: r[1].median)
        mem = [p for p in probes if "error" not in p]
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.42 * max(len(rows), len(mem)) + 1.6))
        y = list(range(len(rows)))
        left.barh(
            y,
            [st.median for _, st in rows],
            color=[_plots.OURS_COLOR if n.startswith(ours) else _plots.PEER_COLOR for n, _ in rows],
        )
        left.set_yticks(y, [f"{n} ({sizes[n] / 1e6:,.0f} MB)" for n, _ in rows], fontsize=7)
        for yi, (_n, st) in zip(y, rows, strict=True):
            left.text(
                st.median,
                yi,
                f" {st.median:.2f} ({st.median / gbps[trio_name].median:.1f} x trio)",
                va="center",
                fontsize=7,
            )
        left.set_xlim(0, max(st.median for _, st in rows) * 1.45)
        left.set_xlabel("GB/s (median, bytes / wall time from call to return)")
        left.set_title("Drain throughput", fontsize=10)
        left.grid(axis="x", alpha=0.3)
        mem.sort(key=lambda p: float(str(p["delta_kib"])))
        ym = list(range(len(mem)))
        values = [max(float(str(p["delta_kib"])) / 1024, 0.1) for p in mem]
        right.barh(
            ym,
            values,
            color=[_plots.OURS_COLOR if p["variant"] == "run_owned" else _plots.PEER_COLOR for p in mem],
        )
        right.set_yticks(
            ym, [f"{p['variant']} ({int(str(p['size'])) / 1e6:,.0f} MB)" for p in mem], fontsize=7
        )
        for yi, v in zip(ym, values, strict=True):
            right.text(v, yi, f" {v:,.1f} MiB", va="center", fontsize=7)
        right.set_xscale("log")
        right.set_xlim(0.1, max(values) * 6)
        right.set_xlabel("peak RSS above baseline, MiB (log; fresh interpreter per bar)")
        right.set_title("Peak memory while draining", fontsize=10)
        right.grid(axis="x", alpha=0.3)
        fig.tight_layout()

    return draw
