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

import itertools
import os
import select
import signal
import subprocess
import time

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
from ._trees import force_to_empty, ready_pids, tree_argv

DESCENDANTS = 49
_counter = itertools.count()


def _wait_pidfds(fds: list[int]) -> None:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left = set(fds)
    while left:
        for fd, _ev in poller.poll(5000):
            poller.unregister(fd)
            left.discard(fd)


def raw_killpg(problems: list[str]) -> float:
    """killpg(SIGKILL) of the tree, until every member has exited."""
    argv = tree_argv(DESCENDANTS, ignore_term=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    pids = ready_pids(proc.stdout.readline()) or []
    fds = [os.pidfd_open(pid) for pid in [proc.pid, *pids]]
    try:
        start = time.perf_counter()
        os.killpg(proc.pid, signal.SIGKILL)
        _wait_pidfds(fds)
        elapsed = time.perf_counter() - start
    finally:
        for fd in fds:
            os.close(fd)
        proc.wait()
        proc.stdout.close()
    if len(pids) != DESCENDANTS:
        problems.append(f"raw killpg: tree not ready ({len(pids)} pids)")
    return elapsed


def raw_cgroup_kill(root: str, tag: str, problems: list[str]) -> float:
    """cgroup.kill of a fresh child cgroup holding the tree, until 'populated 0'."""
    path = os.path.join(root, f"bench-{tag}-{next(_counter)}")
    os.mkdir(path)
    argv = tree_argv(DESCENDANTS, ignore_term=True, gate=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdin is not None
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        proc.stdin.write(b"g")  # the leader forks only now, inside the cgroup
        proc.stdin.close()
        pids = ready_pids(proc.stdout.readline()) or []
        events = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY)
        try:
            poller = select.poll()
            poller.register(events, select.POLLPRI)
            os.read(events, 4096)
            start = time.perf_counter()
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
            while b"populated 0" not in os.pread(events, 4096, 0):
                poller.poll(5000)
            elapsed = time.perf_counter() - start
        finally:
            os.close(events)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        try:
            os.rmdir(path)
        except OSError as exc:
            problems.append(f"raw cgroup: rmdir {path}: {exc}")
    if len(pids) != DESCENDANTS:
        problems.append(f"raw cgroup: tree not ready ({len(pids)} pids)")
    return elapsed


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
        d: {"kill_to_empty": [], "deadline_to_return": []} for d in domains
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
        return raw_killpg(problems)

    raw["raw killpg + pidfd poll"] = killpg_measure
    root = cgroup2_dir()
    if root is not None:
        tag = cfg.marker[:8]

        async def cgroup_measure() -> float:
            return raw_cgroup_kill(root, tag, problems)

        raw["raw cgroup.kill + events poll"] = cgroup_measure
    else:
        section.notes.append("raw cgroup.kill reference skipped: no writable cgroup v2 directory")

    variants: dict[str, Measure] = {f"run_owned {d}": owned(d) for d in domains}
    variants.update(raw)
    samples = await interleaved(variants, rounds, warmup=1)
    for rec in lib.values():
        for key, values in rec.items():
            rec[key] = values[-rounds:] if len(values) > rounds else values

    table = Table(
        ["variant", "kill→empty median ms", "min ms", "max ms", "deadline→return median ms (min-max)"],
        [],
        caption=f"timeout {timeout:g} s, grace 0, {rounds} rounds (interleaved) after 1 warm-up round. "
        "PLATFORM.md: killpg ~3.4 ms, cgroup.kill 3-4.5 ms.",
    )
    for d in domains:
        st = Stats.of(lib[d]["kill_to_empty"])
        dl = Stats.of(lib[d]["deadline_to_return"])
        table.rows.append(
            [
                f"run_owned {d}",
                ms(st.median),
                ms(st.min),
                ms(st.max),
                f"{ms(dl.median)} ({ms(dl.min)}-{ms(dl.max)})",
            ]
        )
    for name in raw:
        st = Stats.of(samples[name])
        table.rows.append([name, ms(st.median), ms(st.min), ms(st.max), ""])
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
