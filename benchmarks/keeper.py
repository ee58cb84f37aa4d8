# Scenario 7: the keeper (src/trio_procown/_keeper.py).
#
# What it measures, three things:
#
# 1. What the keeper adds to the spawn path: spawn-and-wait of /bin/true with
#    run_owned(keeper=True) against keeper=False, per domain, interleaved in
#    the same rounds (the keeper is already running: the common path is one
#    write to its pipe at the spawn and one at the release).
# 2. What starting a keeper costs: the owner's side (the posix_spawn call,
#    paid once per process, at its first owned command) and the keeper's
#    whole life when told nothing (start-up to exit on end-of-file: an upper
#    bound of how long until it reads its pipe).
# 3. What it is for: a child interpreter owns `sh -c 'sleep 30 & setsid
#    sleep 30 & echo up; wait'` (a grandchild and a setsid escapee); we
#    SIGKILL it and time until no process of the tree is alive and its cgroup
#    is gone.
#
# Targets (printed, not asserted): keeper / no keeper <= 1.05 at the median
# (no measurable difference on this noisy VM), cleanup after SIGKILL <= 3 s.

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

import trio

import trio_procown
from trio_procown import _keeper

from ._harness import (
    Config,
    DomainName,
    Measure,
    Section,
    Stats,
    Table,
    interleaved,
    ms,
    paired_ratio,
    ratio,
    timed_async,
    us,
    usable_domains,
)

TRUE = "/bin/true"
SPAWN_TARGET = 1.05
CLEANUP_TARGET = 3.0
TAG_VAR = "BENCH_KEEPER_TAG"
TREE = "sleep 30 & setsid sleep 30 & echo up; wait"
OWNER = f"""
import os, sys, trio, trio_procown
async def main():
    env = dict(os.environ, {TAG_VAR}=sys.argv[2])
    async with trio_procown.open_owned_command({TREE!r}, domain=sys.argv[1], env=env) as run:
        async for _ in run.lines():
            break
        print("ready", run.domain_id.replace(" ", "_"), flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


def _owned(domain: DomainName, keeper: bool, anomalies: list[str]) -> Measure:
    async def call() -> None:
        result = await trio_procown.run_owned(
            [TRUE], domain=domain, stdout="devnull", stderr="devnull", keeper=keeper
        )
        r = result.receipt
        expected = "guarded" if keeper else "opted out"
        if r.cause != "exited" or r.returncode != 0 or r.keeper != expected:
            anomalies.append(f"{domain} keeper={keeper}: cause={r.cause} rc={r.returncode} keeper={r.keeper}")

    return timed_async(call)


def _start_cost(n: int) -> tuple[list[float], list[float]]:
    """The owner's posix_spawn of a keeper, and a keeper's life to its exit on EOF."""
    spawn, life = [], []
    for _ in range(n):
        ends: list[int] = []
        lines, _ = _keeper.pipe(ends)
        bell, _ = _keeper.pipe(ends)
        start = time.perf_counter()
        pid = _keeper.spawn(os.getpid(), lines, bell, {})
        spawn.append(time.perf_counter() - start)
        for fd in ends:
            os.close(fd)
        os.waitpid(pid, 0)
        life.append(time.perf_counter() - start)
    return spawn, life


def _tagged(tag: str) -> list[int]:
    entry = f"{TAG_VAR}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        row = _keeper.stat(int(name))
        if row is None or row.zombie:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _kill_tagged(tag: str) -> None:
    for pid in _tagged(tag):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


def _cleanup_after_sigkill(domain: DomainName, bound: float = 10.0) -> float:
    """Seconds from the owner's SIGKILL until its tree and cgroup are gone (nan: not within `bound`)."""
    tag = secrets.token_hex(8)
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, domain, tag],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        cgroup = ready[1] if len(ready) > 1 and ready[1].startswith("/") else None
        deadline = time.monotonic() + 5
        while len(_tagged(tag)) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        start = time.monotonic()
        proc.kill()
        proc.wait()
        while time.monotonic() - start < bound:
            if not _tagged(tag) and not (cgroup and os.path.isdir(cgroup)):
                return time.monotonic() - start
            time.sleep(0.002)
        return float("nan")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        _kill_tagged(tag)


async def run(cfg: Config) -> Section:
    section = Section(
        "keeper",
        "7. The keeper: spawn cost, start cost, cleanup after the owner's SIGKILL",
        "Spawn-and-wait of /bin/true with and without the keeper, interleaved in the same rounds; "
        "what starting a keeper costs; how long after SIGKILL of an owner its command tree "
        "(a grandchild and a setsid escapee) is gone.",
    )
    domains = usable_domains()
    anomalies: list[str] = []
    variants: dict[str, Measure] = {}
    # The rounds' shuffled orders (round_orders) put each variant after each
    # other one about equally often: a cgroup spawn right after another is
    # faster (see spawn.py on the kernel's RCU wait), which a fixed order
    # could give to one side only.
    for keeper in (True, False):
        for d in domains:
            variants[f"{d} {'keeper' if keeper else 'no keeper'}"] = _owned(d, keeper, anomalies)
    rounds = cfg.pick(60, 500)
    warmup = cfg.pick(5, 25)
    samples = await interleaved(variants, rounds, warmup)
    stats = {name: Stats.of(s) for name, s in samples.items()}
    rows = []
    for d in domains:
        on, off = f"{d} keeper", f"{d} no keeper"
        value = stats[on].median / stats[off].median
        verdict = section.target(f"run_owned {d}: keeper / no keeper", value, SPAWN_TARGET, "x")
        for name in (on, off):
            st = stats[name]
            rows.append([f"run_owned {name}", us(st.median), us(st.min), us(st.max), "", "", ""])
        rows[-2][4:] = [
            ratio(value),
            ratio(paired_ratio(samples[on], samples[off])),
            f"≤ {SPAWN_TARGET} x → {verdict}",
        ]
    section.tables.append(
        Table(
            ["variant", "median µs", "min µs", "max µs", "x no keeper", "paired x", "target"],
            rows,
            caption=f"{rounds} rounds after {warmup} warm-up rounds, stdout/stderr devnull; 'paired x' is the "
            "median of per-round ratios.",
        )
    )

    spawn, life = await trio.to_thread.run_sync(_start_cost, cfg.pick(10, 40))
    st_spawn, st_life = Stats.of(spawn), Stats.of(life)
    section.tables.append(
        Table(
            ["keeper start", "median", "min", "max"],
            [
                [
                    "owner: posix_spawn of the keeper (µs)",
                    us(st_spawn.median),
                    us(st_spawn.min),
                    us(st_spawn.max),
                ],
                [
                    "keeper: start-up to exit on EOF (ms)",
                    ms(st_life.median),
                    ms(st_life.min),
                    ms(st_life.max),
                ],
            ],
            caption=f"{len(spawn)} samples. Paid once per owner process, at its first owned command; "
            "nothing waits for the keeper's start-up (the pipe holds what the owner writes meanwhile).",
        )
    )

    trials = cfg.pick(3, 10)
    cleanup: dict[str, list[float]] = {}
    for d in domains:
        cleanup[d] = [await trio.to_thread.run_sync(_cleanup_after_sigkill, d) for _ in range(trials)]
    cleanup_rows = []
    for name, values in cleanup.items():
        st = Stats.of(values)
        verdict = section.target(f"{name}: cleanup after the owner's SIGKILL", st.max, CLEANUP_TARGET, "s")
        cleanup_rows.append(
            [name, ms(st.median), ms(st.min), ms(st.max), f"≤ {CLEANUP_TARGET:g} s → {verdict}"]
        )
    section.tables.append(
        Table(
            ["domain", "median ms", "min ms", "max ms", "target (max)"],
            cleanup_rows,
            caption=f"{trials} trials per domain: SIGKILL of an owner of `{TREE}`, until no process of the "
            "tree is alive (zombies count as dead) and its cgroup is removed.",
        )
    )
    if anomalies:
        section.notes.append(f"{len(anomalies)} unexpected receipt(s), first: {anomalies[0]}")
    section.data = {
        "rounds": rounds,
        "warmup": warmup,
        "stats_seconds": {k: v.to_dict() for k, v in stats.items()},
        "keeper_over_no_keeper": {
            d: stats[f"{d} keeper"].median / stats[f"{d} no keeper"].median for d in domains
        },
        "start_spawn_seconds": spawn,
        "start_life_seconds": life,
        "cleanup_seconds": cleanup,
        "anomalies": anomalies,
    }
    return section
