# Scenario 3: force-to-empty latency of a 50-process tree that ignores
# SIGTERM.
#
# What it measures: a leader + 49 children that all ignore SIGTERM run with
# a short timeout and grace=0, so the teardown must SIGKILL the domain. From
# the receipt we take the time between the SIGKILL step (killpg, or the
# cgroup.kill write) and the following domain 'wait' step that ended
# 'empty': how long the library takes to *prove* the domain empty after the
# kill. Note the SIGKILL step is stamped after the kill call returned.
#
# Side by side, in the same rounds, raw references of the same tree without
# the library: killpg(SIGKILL) then poll() on pidfds of all 50 members until
# every one has exited, and (when a writable cgroup v2 directory exists)
# cgroup.kill then poll(POLLPRI) on cgroup.events until "populated 0". These
# start their clock *before* the kill call. PLATFORM.md measured ~3.4 ms
# (killpg) and 3-4.5 ms (cgroup.kill) on this machine kind.
#
# Why: force is the path for misbehaving commands; its cost after the kill
# should be the kernel's, not the library's scanning.

from __future__ import annotations

import signal

import trio

import trio_procown

from ._harness import (
    Config,
    DomainName,
    Measure,
    Section,
    Stats,
    Table,
    cgroup2_dir,
    count_marked,
    interleaved,
    ms,
    usable_domains,
)
from ._raw import raw_cgroup_kill, raw_killpg
from ._trees import force_to_empty, phases, ready_pids, span, tree_argv

DESCENDANTS = 49


async def run(cfg: Config) -> Section:
    section = Section(
        "force",
        "3. Force-to-empty, 50-process tree that ignores SIGTERM",
        "Leader + 49 children ignoring SIGTERM, timeout then grace=0 so SIGKILL is needed. "
        "Library: SIGKILL step → domain 'wait' step 'empty' in the receipt. "
        "Raw references: the same tree killed without the library, in the same rounds.",
    )
    timeout = 0.3
    rounds = cfg.pick(3, 12)
    domains = usable_domains()
    argv = tree_argv(DESCENDANTS, ignore_term=True)
    problems: list[str] = []
    lib: dict[str, dict[str, list[float]]] = {
        d: {"kill_to_empty": [], "deadline_to_return": [], "stop_to_kill": [], "empty_to_receipt": []}
        for d in domains
    }

    def owned(domain: DomainName) -> Measure:
        async def measure() -> float:
            t0 = trio.current_time()
            result = await trio_procown.run_owned(
                argv, timeout=timeout, grace=0.0, kill_wait=1.0, domain=domain
            )
            late = trio.current_time() - t0 - timeout
            r = result.receipt
            k = force_to_empty(r)
            if k is not None:
                lib[domain]["kill_to_empty"].append(k)
            lib[domain]["deadline_to_return"].append(late)
            ph = phases(r)
            for key, (a, b) in {
                "stop_to_kill": ("stop", "kill"),
                "empty_to_receipt": ("empty", "receipt"),
            }.items():
                value = span(ph, a, b)
                if value is not None:
                    lib[domain][key].append(value)
            pids = ready_pids(result.stdout)
            left = count_marked(cfg.marker)
            if k is None or not r.forced or not r.domain_empty or pids is None or left:
                steps = "; ".join(str(s) for s in r.steps)
                problems.append(
                    f"{domain}: forced={r.forced} empty={r.domain_empty} ready={pids is not None} "
                    f"marked-alive-after={left} steps: {steps}"
                )
            return k if k is not None else float("nan")

        return measure

    raw: dict[str, Measure] = {}

    async def killpg_measure() -> float:
        return raw_killpg(DESCENDANTS, ignore_term=True, sig=signal.SIGKILL, problems=problems)

    raw["raw killpg + pidfd poll"] = killpg_measure
    root = cgroup2_dir()
    if root is not None:
        tag = cfg.marker[:8]

        async def cgroup_measure() -> float:
            return raw_cgroup_kill(root, tag, DESCENDANTS, problems)

        raw["raw cgroup.kill + events poll"] = cgroup_measure
    else:
        section.notes.append("raw cgroup.kill reference skipped: no writable cgroup v2 directory")

    variants: dict[str, Measure] = {f"run_owned {d}": owned(d) for d in domains}
    variants.update(raw)
    samples = await interleaved(variants, rounds, warmup=1)
    for rec in lib.values():
        for key, values in rec.items():
            rec[key] = values[-rounds:]

    table = Table(
        [
            "variant",
            "kill→empty median ms",
            "min ms",
            "max ms",
            "stop→SIGKILL ms",
            "empty→receipt ms",
            "deadline→return median ms (min-max)",
        ],
        [],
        caption=f"timeout {timeout:g} s, grace 0, {rounds} rounds (interleaved) after 1 warm-up round. "
        "PLATFORM.md: killpg ~3.4 ms, cgroup.kill 3-4.5 ms.",
    )
    for d in domains:
        st = Stats.of(lib[d]["kill_to_empty"])
        dl = Stats.of(lib[d]["deadline_to_return"])
        sk = Stats.of(lib[d]["stop_to_kill"])
        er = Stats.of(lib[d]["empty_to_receipt"])
        table.rows.append(
            [
                f"run_owned {d}",
                ms(st.median),
                ms(st.min),
                ms(st.max),
                f"{ms(sk.median)} ({ms(sk.min)}-{ms(sk.max)})",
                f"{ms(er.median)} ({ms(er.min)}-{ms(er.max)})",
                f"{ms(dl.median)} ({ms(dl.min)}-{ms(dl.max)})",
            ]
        )
    for name in raw:
        st = Stats.of(samples[name])
        table.rows.append([name, ms(st.median), ms(st.min), ms(st.max), "", "", ""])
    section.tables.append(table)
    if problems:
        section.notes.append(f"{len(problems)} unexpected outcome(s); first: {problems[0]}")
    section.data = {
        "timeout": timeout,
        "rounds": rounds,
        "library_samples_seconds": lib,
        "raw_samples_seconds": {k: samples[k] for k in raw},
        "stats_seconds": {
            **{
                f"run_owned {d}": {k: Stats.of(v).to_dict() for k, v in rec.items()} for d, rec in lib.items()
            },
            **{k: Stats.of(samples[k]).to_dict() for k in raw},
        },
        "problems": problems,
    }
    return section
