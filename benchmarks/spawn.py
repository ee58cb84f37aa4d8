# Scenario 1: spawn-and-wait of /bin/true.
#
# What it measures: the fixed cost an owned command adds on the common path
# (a command that just exits), compared side by side with trio.run_process
# (plain and capturing both streams), subprocess.run, and the floor of
# os.posix_spawn + os.waitpid (exec and exit dominate it). run_owned is
# measured per ownership domain, with its default capture and with both
# streams sent to /dev/null.
#
# Why: ownership must be cheap enough to use for every command. Targets
# (printed, not asserted): process-group <= 1.10 x trio.run_process,
# cgroup <= 1.6 x trio.run_process.

from __future__ import annotations

import os
import subprocess

import trio

import trio_procown

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
    timed_async,
    timed_sync,
    us,
)

TRUE = "/bin/true"
BASE = "trio.run_process"
FLOOR = "posix_spawn+waitpid"
TARGETS = {"process-group": 1.10, "cgroup": 1.6}


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


async def run(cfg: Config) -> Section:
    section = Section(
        "spawn",
        "1. Spawn-and-wait of /bin/true",
        "Time from call to return for a command that exits at once. One sample of "
        "each variant per round, rotating the order; ratios are of medians "
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
        "trio.run_process capture": timed_async(
            lambda: trio.run_process([TRUE], capture_stdout=True, capture_stderr=True)
        ),
        FLOOR: timed_sync(_floor),
        "subprocess.run": timed_sync(_subprocess_run),
    }
    for d in domains:
        variants[f"run_owned {d}"] = _owned(d, False, anomalies)
        variants[f"run_owned {d} devnull"] = _owned(d, True, anomalies)

    rounds = cfg.pick(60, 500)
    warmup = cfg.pick(5, 25)
    samples = await interleaved(variants, rounds, warmup)

    stats = {name: Stats.of(s) for name, s in samples.items()}
    base, floor = stats[BASE].median, stats[FLOOR].median
    table = Table(
        ["variant", "median µs", "min µs", "max µs", "x trio.run_process", "paired x", "x floor", "target"],
        [],
        caption=f"{rounds} rounds after {warmup} warm-up rounds; 'paired x' is the median of per-round ratios.",
    )
    for name, st in stats.items():
        target = ""
        for d, limit in TARGETS.items():
            if name.startswith(f"run_owned {d}"):
                value = st.median / base
                v = section.target(f"{name} / {BASE}", value, limit, "x")
                target = f"≤ {limit:.2f} x → {v}"
        table.rows.append(
            [
                name,
                us(st.median),
                us(st.min),
                us(st.max),
                ratio(st.median / base),
                ratio(paired_ratio(samples[name], samples[BASE])),
                ratio(st.median / floor),
                target,
            ]
        )
    section.tables.append(table)
    if anomalies:
        section.notes.append(f"{len(anomalies)} unexpected receipt(s), first: {anomalies[0]}")
    section.data = {
        "rounds": rounds,
        "warmup": warmup,
        "stats_seconds": {k: v.to_dict() for k, v in stats.items()},
        "ratio_to_trio": {k: v.median / base for k, v in stats.items()},
        "paired_ratio_to_trio": {k: paired_ratio(samples[k], samples[BASE]) for k in stats},
        "ratio_to_floor": {k: v.median / floor for k, v in stats.items()},
        "anomalies": anomalies,
    }
    return section
