# Scenario 1: spawn-and-wait of /bin/true.
#
# What it measures: the fixed cost an owned command adds on the common path
# (a command that just exits), compared side by side with trio.run_process
# (plain and capturing both streams), subprocess.run, and the floor of
# os.posix_spawn + os.waitpid (exec and exit dominate it). run_owned is
# measured per ownership domain, with its default capture and with both
# streams sent to /dev/null.
#
# The peers (benchmarks/_peers.py) are measured in the same rounds, each as
# its recipe is written (capturing, with a deadline far away): the
# subprocess.run/communicate recipes, anyio.run_process, the asyncio recipe
# and the ADK-style teardown (the last two on one asyncio loop driven with
# run_until_complete from the trio thread; ADK runs a shell, here it execs
# /bin/true like every other variant, so the cost compared is the machinery).
#
# Then a second measurement: spawn-and-wait of /bin/true, capturing both
# streams, by run_owned per domain and by trio.run_process, right after the
# previous one (back to back) and after an idle gap (IDLE_GAP), alternating.
# Moving a process into a cgroup takes a kernel lock whose write side waits
# for an RCU grace period unless another move happened within roughly the
# last one (~10 ms extra once the gap exceeds ~10-20 ms, on a cgroup2 mount
# without favordynmods); a command created inside its cgroup by clone3
# (the spawner, docs/domains.md) moves nothing. Back-to-back loops would
# hide a move's cost; the idle rows are what an occasional command pays.
# The same rounds also sleep 1 ms and 5 ms before some samples: how much
# of the cost is the machine coming back from idle (these VMs halt an idle
# vCPU at once, and caches go cold) rather than the work itself.
#
# And the other end: each variant called LOOP_LENGTH times in a row (a
# build's or a test suite's loop of commands, each started as soon as the
# previous one returned), the variants' loops interleaved. Every call but
# the first of a loop is timed: what a loop of commands pays per command,
# with warm caches.
#
# And a third: many commands at once (an agent's tools, a build): a batch of
# `echo`s run CROWD_LIMIT at a time, per variant, timed whole. There the
# spawn's clone (which waits in the kernel until the new process has
# exec'd: milliseconds when the other commands' processes hold the CPUs)
# is made in a worker thread, as trio's Popen is, while the loop serves
# the others. No target: not a row of the table.
#
# Why: ownership must be cheap enough to use for every command. Targets
# (issue 16; printed, not asserted), like for like with capture on both
# sides: process-group <= 1.00 x trio.run_process capture, cgroup (the
# default domain) <= 1.30 x, in the interleaved rounds and after 50 ms idle.

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable

import trio

import trio_procown

from . import _plots
from ._harness import (
    Config,
    DomainName,
    Measure,
    Section,
    Stats,
    Table,
    interleaved,
    paired_ratio,
    ratio,
    round_orders,
    timed_async,
    timed_sync,
    us,
)
from ._peers import BY_KEY, Command, call_async, call_blocking, missing_module

TRUE = "/bin/true"
ECHO = "/bin/echo"
BASE = "trio.run_process"
BASE_CAPTURE = "trio.run_process capture"  # like for like with run_owned's default capture
FLOOR = "posix_spawn+waitpid"
# variant -> its target, as a ratio of medians to BASE_CAPTURE
TARGETS = {"run_owned process-group": 1.00, "run_owned cgroup": 1.30}
FAR = 60.0  # the peers' deadline: never reached by /bin/true
IDLE_GAP = 0.05
# The gaps of the gap sweep (seconds idle before a sample), IDLE_GAP last.
GAPS = (0.0, 0.001, 0.005, IDLE_GAP)
LOOP_LENGTH = 10
PEER_VARIANTS = {
    "peer: subprocess.run capture_output+timeout": "subprocess.run",
    "peer: communicate(timeout) recipe": "communicate",
    "peer: anyio.run_process": "anyio",
    "peer: asyncio wait_for(communicate())": "asyncio",
    "peer: ADK-style (re-implemented)": "adk",
}


def _floor() -> None:
    pid = os.posix_spawn(TRUE, [TRUE], os.environ)
    os.waitpid(pid, 0)


def _subprocess_run() -> None:
    subprocess.run([TRUE], check=True)


def _owned(domain: DomainName, devnull: bool, anomalies: list[str]) -> Measure:
    target = "devnull" if devnull else "capture"

    async def call() -> None:
        result = await trio_procown.run_owned([TRUE], domain=domain, stdout=target, stderr=target)
        r = result.receipt
        if r.cause != "exited" or r.returncode != 0 or not r.domain_empty or r.forced:
            anomalies.append(f"{domain}: cause={r.cause} rc={r.returncode} empty={r.domain_empty}")

    return timed_async(call)


def _peer_async(call: Callable[[Command, float], Awaitable[bytes | None]]) -> Measure:
    return timed_async(lambda: call([TRUE], FAR))


def _peer_sync(call: Callable[[Command, float], bytes | None]) -> Measure:
    return timed_sync(lambda: call([TRUE], FAR))


def _capture_measures(domains: list[DomainName]) -> dict[str, Measure]:
    """Spawn-and-wait of /bin/true capturing both streams, timed:
    trio.run_process and run_owned per domain."""

    def owned(d: DomainName) -> Measure:
        return timed_async(lambda: trio_procown.run_owned([TRUE], domain=d))

    measures = {
        BASE_CAPTURE: timed_async(lambda: trio.run_process([TRUE], capture_stdout=True, capture_stderr=True))
    }
    measures.update({f"run_owned {d}": owned(d) for d in domains})
    return measures


async def _gap_sweep(domains: list[DomainName], n: int) -> dict[str, dict[float, list[float]]]:
    """Spawn-and-wait capturing both streams, per domain and by
    trio.run_process, right after the previous sample (gap 0) and after
    each idle gap of GAPS; `n` samples per variant and gap."""
    measures = _capture_measures(domains)
    out: dict[str, dict[float, list[float]]] = {name: {gap: [] for gap in GAPS} for name in measures}
    for measure in measures.values():
        await measure()
    # Interleaved: sample i of every variant is taken in turn (in an order
    # shuffled for each round, see round_orders), so a drift of the
    # machine's speed reaches all alike; the rounds cycle through the gaps.
    for i, order in enumerate(round_orders(list(measures), len(GAPS) * n)):
        gap = GAPS[i % len(GAPS)]
        for name in order:
            if gap:
                await trio.sleep(gap)
            out[name][gap].append(await measures[name]())
    return out


async def _loop_sweep(domains: list[DomainName], loops: int) -> dict[str, list[float]]:
    """Each variant called LOOP_LENGTH times in a row, `loops` times, the
    variants' loops interleaved (shuffled order each round); every call but
    the first of each loop, timed."""
    measures = _capture_measures(domains)
    out: dict[str, list[float]] = {name: [] for name in measures}
    for order in round_orders(list(measures), loops):
        for name in order:
            measure = measures[name]
            await measure()  # the first of the loop follows another variant: not counted
            out[name] += [await measure() for _ in range(LOOP_LENGTH - 1)]
    return out


CROWD_LIMIT = 20


def _crowd_n(cfg: Config) -> int:
    return cfg.pick(200, 1000)


async def _crowd_sweep(domains: list[DomainName], n: int, batches: int) -> dict[str, list[float]]:
    """`n` commands, CROWD_LIMIT at a time, per variant: the wall time of
    each batch (variants interleaved, one batch each per round)."""

    def owned(d: DomainName) -> Callable[[], Awaitable[object]]:
        return lambda: trio_procown.run_owned([ECHO, "hi"], domain=d)

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        BASE_CAPTURE: lambda: trio.run_process([ECHO, "hi"], capture_stdout=True, capture_stderr=True)
    }
    calls.update({f"run_owned {d}": owned(d) for d in domains})

    async def batch(call: Callable[[], Awaitable[object]], count: int) -> float:
        limiter = trio.CapacityLimiter(CROWD_LIMIT)

        async def one() -> None:
            async with limiter:
                await call()

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
        return time.perf_counter() - start

    out: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        await batch(call, CROWD_LIMIT)
    for order in round_orders(list(calls), batches):
        for name in order:
            out[name].append(await batch(calls[name], n))
    return out


async def run(cfg: Config) -> Section:
    section = Section(
        "spawn",
        "1. Spawn-and-wait of /bin/true",
        "Time from call to return for a command that exits at once. One sample of "
        "each variant per round, in an order shuffled for each round; ratios are of medians "
        "(and, for run_owned, also the median of per-round paired ratios).",
    )
    options = {o.name: o for o in trio_procown.available_domains()}
    domains: list[DomainName] = [d for d in ("process-group", "cgroup") if options[d].available]
    for d in ("process-group", "cgroup"):
        if not options[d].available:
            section.notes.append(f"domain {d} skipped: {options[d].reason}")

    anomalies: list[str] = []
    variants: dict[str, Measure] = {
        BASE: timed_async(lambda: trio.run_process([TRUE])),
        BASE_CAPTURE: timed_async(lambda: trio.run_process([TRUE], capture_stdout=True, capture_stderr=True)),
        FLOOR: timed_sync(_floor),
        "subprocess.run": timed_sync(_subprocess_run),
    }
    for d in domains:
        variants[f"run_owned {d}"] = _owned(d, False, anomalies)
        variants[f"run_owned {d} devnull"] = _owned(d, True, anomalies)
    loop = asyncio.new_event_loop()
    for name, key in PEER_VARIANTS.items():
        peer = BY_KEY[key]
        why = missing_module(peer)
        if why:
            section.notes.append(f"{name} skipped: {why} is not installed ({_plots.INSTALL_HINT})")
        elif peer.kind == "trio":
            variants[name] = _peer_async(call_async(peer))
        else:
            variants[name] = _peer_sync(call_blocking(peer, loop))

    rounds = cfg.pick(60, 500)
    warmup = cfg.pick(5, 25)
    try:
        samples = await interleaved(variants, rounds, warmup)
    finally:
        loop.close()

    stats = {name: Stats.of(s) for name, s in samples.items()}
    base, floor = stats[BASE].median, stats[FLOOR].median
    base_capture = stats[BASE_CAPTURE].median
    table = Table(
        [
            "variant",
            "median µs",
            "min µs",
            "max µs",
            "x trio.run_process",
            "paired x",
            "x trio.run_process capture",
            "x floor",
            "target",
        ],
        [],
        caption=f"{rounds} rounds after {warmup} warm-up rounds; 'paired x' is the median of per-round ratios. "
        "'x trio.run_process capture' compares like for like with capture on both sides (run_owned "
        "captures both streams by default; its devnull rows capture nothing, like plain trio.run_process).",
    )
    for name, st in stats.items():
        target = ""
        limit = TARGETS.get(name)
        if limit is not None:
            v = section.target(f"{name} / {BASE_CAPTURE}", st.median / base_capture, limit, "x")
            target = f"≤ {limit:.2f} x {BASE_CAPTURE} → {v}"
        table.rows.append(
            [
                name,
                us(st.median),
                us(st.min),
                us(st.max),
                ratio(st.median / base),
                ratio(paired_ratio(samples[name], samples[BASE])),
                ratio(st.median / base_capture),
                ratio(st.median / floor),
                target,
            ]
        )
    section.tables.append(table)
    _plots.save(
        section,
        cfg,
        "spawn_cost.png",
        "Spawn-and-wait of /bin/true: median per variant",
        _plots.bars(
            f"Spawn-and-wait of /bin/true, median of {rounds} interleaved rounds",
            "µs (median)",
            [
                (
                    name,
                    st.median * 1e6,
                    f"{st.median / base:.2f} x trio.run_process, {st.median / floor:.2f} x floor",
                )
                for name, st in sorted(stats.items(), key=lambda kv: kv[1].median)
            ],
            ours=lambda label: label.startswith("run_owned"),
            floor=floor * 1e6,
            floor_label="posix_spawn+waitpid floor",
        ),
    )
    if anomalies:
        section.notes.append(f"{len(anomalies)} unexpected receipt(s), first: {anomalies[0]}")
    gap_samples, loop_runs = cfg.pick(15, 40), cfg.pick(6, 30)
    gaps = await _gap_sweep(domains, gap_samples)
    loops = await _loop_sweep(domains, loop_runs)
    at = {gap: {name: Stats.of(v[gap]).median for name, v in gaps.items()} for gap in GAPS}
    looped = {name: Stats.of(v).median for name, v in loops.items()}
    back, idle = at[0.0], at[IDLE_GAP]
    gap_rows = []
    for name in gaps:
        target = ""
        limit = TARGETS.get(name)
        if limit is not None:
            value = idle[name] / idle[BASE_CAPTURE]
            v = section.target(f"{name} after {IDLE_GAP * 1e3:g} ms idle / {BASE_CAPTURE}", value, limit, "x")
            target = f"≤ {limit:.2f} x → {v}"
        gap_rows.append(
            [
                name,
                us(looped[name]),
                us(back[name]),
                us(idle[name]),
                us(idle[name] - back[name]),
                ratio(looped[name] / looped[BASE_CAPTURE]),
                *(ratio(at[gap][name] / at[gap][BASE_CAPTURE]) for gap in GAPS),
                target,
            ]
        )
    section.tables.append(
        Table(
            [
                "variant (capture)",
                "in a loop: median µs",
                "back to back: median µs",
                f"after {IDLE_GAP * 1e3:g} ms idle: median µs",
                "extra µs",
                "in a loop x trio capture",
                "back to back x trio capture",
                *(f"after {gap * 1e3:g} ms idle x trio capture" for gap in GAPS[1:]),
                f"target (after {IDLE_GAP * 1e3:g} ms idle)",
            ],
            gap_rows,
            caption=f"{gap_samples} samples per variant and gap, each variant capturing both streams "
            "of /bin/true, the rounds cycling through the gaps (back to back: right after the previous "
            "sample, of any variant), the variants interleaved (shuffled order). The idle figures are "
            f"the cost of an occasional command. In a loop: {LOOP_LENGTH} calls of one variant in a row, "
            f"{loop_runs} such loops per variant, interleaved; every call but a loop's first "
            "timed (a build's or a test suite's loop of commands).",
        )
    )
    crowd = await _crowd_sweep(domains, cfg.pick(200, 1000), cfg.pick(3, 5))
    crowd_stats = {name: Stats.of(v) for name, v in crowd.items()}
    crowd_base = crowd_stats[BASE_CAPTURE].median
    section.tables.append(
        Table(
            ["variant (capture)", "median s a batch", "per command µs", "x trio capture"],
            [
                [name, f"{st.median:.3f}", us(st.median / _crowd_n(cfg)), ratio(st.median / crowd_base)]
                for name, st in crowd_stats.items()
            ],
            caption=f"{_crowd_n(cfg)} commands (`echo`, both streams captured) run {CROWD_LIMIT} at a time "
            f"(a trio.CapacityLimiter), the batch timed whole; {cfg.pick(3, 5)} batches per variant, "
            "interleaved. No target (not in the issue's table): what an agent or a build with many "
            "commands at once sees.",
        )
    )
    section.data = {
        "crowd_seconds": crowd,
        "crowd_n": _crowd_n(cfg),
        "crowd_limit": CROWD_LIMIT,
        "idle_gap": IDLE_GAP,
        "gap_sweep_seconds": {d: {str(g): v for g, v in per.items()} for d, per in gaps.items()},
        "loop_seconds": loops,
        "loop_length": LOOP_LENGTH,
        "rounds": rounds,
        "warmup": warmup,
        "stats_seconds": {k: v.to_dict() for k, v in stats.items()},
        "ratio_to_trio": {k: v.median / base for k, v in stats.items()},
        "ratio_to_trio_capture": {k: v.median / base_capture for k, v in stats.items()},
        "paired_ratio_to_trio": {k: paired_ratio(samples[k], samples[BASE]) for k in stats},
        "ratio_to_floor": {k: v.median / floor for k, v in stats.items()},
        "anomalies": anomalies,
    }
    return section
