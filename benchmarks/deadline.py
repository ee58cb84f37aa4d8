# Scenario 2: deadline-to-return latency for a 50-process tree that obeys
# SIGTERM.
#
# What it measures: a command whose leader forks 49 sleeping children (flat,
# all holding the stdout pipe) runs with timeout=T; we time how long after
# the deadline the owned command returns, per ownership domain. The
# library's deadline is its spawn time + T, and the spawn happens between
# our call and our first look inside the block, so we report two bounds:
#   upper = return - (call time + T)     (includes the spawn: conservative)
#   lower = return - (block entry + T)
# and the receipt's own breakdown: how late the deadline was noticed (STOP
# step at - T), SIGTERM to empty (the 'wait' step), and deadline to receipt
# (receipt.duration - T). open_owned_command + run.wait() is exactly what
# run_owned does.
#
# Why: a timeout must mean "returns at the deadline", with the whole tree
# gone and the pipes drained. Target (printed): upper <= 20 ms.

from __future__ import annotations

import trio

import trio_procown

from ._harness import (
    Config,
    DomainName,
    Measure,
    Section,
    Stats,
    Table,
    count_marked,
    interleaved,
    ms,
    usable_domains,
)
from ._trees import first_step, graceful_to_empty, ready_pids, tree_argv

TARGET = 0.020
DESCENDANTS = 49


async def run(cfg: Config) -> Section:
    section = Section(
        "deadline",
        "2. Deadline-to-return, 50-process tree that obeys SIGTERM",
        "Leader + 49 sleeping children (flat), run with timeout=T, default grace. "
        "Latency past the deadline until open_owned_command/run.wait() returns.",
    )
    T = cfg.pick(0.5, 1.0)
    rounds = cfg.pick(3, 10)
    domains = usable_domains()
    argv = tree_argv(DESCENDANTS)
    per: dict[str, dict[str, list[float]]] = {
        d: {"upper": [], "lower": [], "noticed": [], "term_to_empty": [], "to_receipt": []} for d in domains
    }
    problems: list[str] = []

    def variant(domain: DomainName) -> Measure:
        async def measure() -> float:
            t0 = trio.current_time()
            async with trio_procown.open_owned_command(argv, timeout=T, domain=domain) as cmd:
                t_enter = trio.current_time()
                receipt = await cmd.wait()
            t_ret = trio.current_time()
            rec = per[domain]
            rec["upper"].append(t_ret - t0 - T)
            rec["lower"].append(t_ret - t_enter - T)
            stop = first_step(receipt, "stop")
            if stop is not None:
                rec["noticed"].append(stop.at - T)
            g = graceful_to_empty(receipt)
            if g is not None:
                rec["term_to_empty"].append(g)
            rec["to_receipt"].append(receipt.duration - T)
            pids = ready_pids(cmd.stdout)
            left = count_marked(cfg.marker)
            if (
                pids is None
                or len(pids) != DESCENDANTS
                or receipt.cause != "timed_out"
                or receipt.forced
                or not receipt.domain_empty
                or receipt.output != "complete"
                or left
            ):
                problems.append(
                    f"{domain}: ready={pids is not None} cause={receipt.cause} forced={receipt.forced} "
                    f"empty={receipt.domain_empty} output={receipt.output} marked-alive-after={left}"
                )
            return t_ret - t0 - T

        return measure

    await interleaved({d: variant(d) for d in domains}, rounds, warmup=1)
    # The warm-up round also appended: drop it so every list has `rounds` samples.
    for rec in per.values():
        for key, values in rec.items():
            rec[key] = values[-rounds:] if len(values) > rounds else values

    table = Table(
        [
            "domain",
            "upper: median ms (min-max)",
            "lower: median ms (min-max)",
            "deadline noticed late, ms",
            "SIGTERM→empty ms",
            "deadline→receipt ms",
            "target ≤ 20 ms (upper)",
        ],
        [],
        caption=f"T = {T:g} s, {rounds} rounds per domain (interleaved) after 1 warm-up round.",
    )
    for d in domains:
        rec = per[d]
        up, lo = Stats.of(rec["upper"]), Stats.of(rec["lower"])
        no, te, tr = Stats.of(rec["noticed"]), Stats.of(rec["term_to_empty"]), Stats.of(rec["to_receipt"])
        v = section.target(f"deadline→return upper bound, {d}", up.median, TARGET, "s")
        table.rows.append(
            [
                d,
                f"{ms(up.median)} ({ms(up.min)}-{ms(up.max)})",
                f"{ms(lo.median)} ({ms(lo.min)}-{ms(lo.max)})",
                ms(no.median),
                f"{ms(te.median)} ({ms(te.min)}-{ms(te.max)})",
                ms(tr.median),
                f"{v} (max {ms(up.max)} ms)",
            ]
        )
    section.tables.append(table)
    if problems:
        section.notes.append(f"{len(problems)} unexpected outcome(s); first: {problems[0]}")
    section.data = {
        "timeout": T,
        "rounds": rounds,
        "descendants": DESCENDANTS,
        "samples_seconds": per,
        "stats_seconds": {d: {k: Stats.of(v).to_dict() for k, v in rec.items()} for d, rec in per.items()},
        "problems": problems,
    }
    return section
