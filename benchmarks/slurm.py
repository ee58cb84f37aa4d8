# Scenario: the Slurm domain (src/trio_procown/_slurm.py) against what users
# do today, `timeout --kill-after=1 T srun CMD`.
#
# What it measures, for 1 and 20 concurrent jobs (1 in --quick) on
# the reachable cluster (scripts/slurm-local starts a one-host one):
#
# - submit-to-first-output: from the start of the submission to the first
#   line the job's task printed, read through srun;
# - deadline-to-return: from the command's deadline (start + T) to when the
#   caller got control back (the owned block returned / timeout(1) exited);
# - survivors: processes of the jobs still alive on the node 1 s after
#   every caller returned, and jobs still listed as pending/running.
#
# The job's task prints a line, then forks a child that ignores SIGTERM and
# sleeps: the case where Slurm's proctrack/linuxproc loses a process whose
# parent died (docs/domains.md). Survivors are SIGKILLed afterwards (checked
# to carry this run's tag and marker) and leftover jobs cancelled by name.
#
# No cluster reachable: the scenario is skipped with the reason.

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import uuid

import trio

import trio_procown
from trio_procown._slurm import cluster_status

from ._harness import Config, Section, Stats, Table, marked_processes, ms

TASK = (
    "import os, signal, sys, time\n"
    "print('up', flush=True)\n"
    "if os.fork() == 0:\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    time.sleep(60)\n"
    "    os._exit(0)\n"
    "time.sleep(60)\n"
)
GRACE = 1.0
KILL_WAIT = 1.0
DRAIN_WAIT = 0.5
SETTLE = 1.0


def _argv(tag: str) -> list[str]:
    return [sys.executable, "-c", TASK, tag]


async def _ours(tag: str, deadline: float, out: list[tuple[float, float]]) -> None:
    start = trio.current_time()
    first = math.nan
    async with trio_procown.open_owned_command(
        _argv(tag),
        domain=trio_procown.SlurmDomain(),
        timeout=deadline,
        grace=GRACE,
        kill_wait=KILL_WAIT,
        drain_wait=DRAIN_WAIT,
    ) as run:
        async for _ in run.lines():
            first = trio.current_time() - start
            break
        await run.wait()
    out.append((first, trio.current_time() - (start + deadline)))


async def _plain(tag: str, deadline: float, out: list[tuple[float, float]]) -> None:
    start = trio.current_time()
    first = math.nan
    argv = ["timeout", "--kill-after=1", f"{deadline:g}", "srun", "--quiet", f"--job-name={tag}", *_argv(tag)]
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        buf = b""
        while b"\n" not in buf:
            chunk = await process.stdout.receive_some()
            if not chunk:
                break
            buf += chunk
        if b"\n" in buf:
            first = trio.current_time() - start
        # Keep reading until EOF, as a caller capturing the output would.
        while await process.stdout.receive_some():
            pass
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if process.stdout is not None:
            await process.stdout.aclose()
    out.append((first, trio.current_time() - (start + deadline)))


def _jobs_listed(prefix: str) -> int:
    done = subprocess.run(["squeue", "-h", "-o", "%j %T"], capture_output=True, text=True, timeout=10)
    return sum(
        1
        for line in done.stdout.splitlines()
        if line.split()[:1] and line.split()[0].startswith(prefix) and "COMPLETING" not in line
    )


def _tagged(tag: str, marker: str) -> list[int]:
    return [pid for pid, cmd in marked_processes(marker) if tag in cmd]


def _clean(tag: str, marker: str) -> None:
    for pid in _tagged(tag, marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["scancel", "--quiet", f"--name={tag}"], capture_output=True, timeout=10)


async def _round(
    cfg: Config, variant: str, n: int, deadline: float
) -> tuple[list[tuple[float, float]], int, int]:
    tag = f"bench-slurm-{uuid.uuid4().hex[:10]}"
    out: list[tuple[float, float]] = []
    fn = _ours if variant == "procown" else _plain
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(fn, tag, deadline, out)
    await trio.sleep(SETTLE)
    survivors = len(_tagged(tag, cfg.marker))
    # Our jobs are named procown-<hex>; plain ones by the tag.
    jobs = _jobs_listed(tag) if variant != "procown" else 0
    _clean(tag, cfg.marker)
    return out, survivors, jobs


async def run(cfg: Config) -> Section:
    section = Section(
        "slurm",
        "Slurm: owned jobs against timeout(1) around srun",
        "Submit-to-first-output and deadline-to-return of N concurrent jobs on the reachable Slurm cluster, "
        "owned (SlurmDomain) against `timeout --kill-after=1 T srun CMD`; survivors on the node 1 s after "
        "the callers returned (the task forks a SIGTERM-ignoring child).",
    )
    usable, what = await trio.to_thread.run_sync(cluster_status)
    if not usable:
        section.notes.append(
            f"skipped: no usable Slurm cluster ({what}); start one with scripts/slurm-local start"
        )
        return section
    section.notes.append(f"cluster: {what}")
    counts = cfg.pick((1,), (1, 20))
    rounds = cfg.pick(1, 3)
    deadline = cfg.pick(1.0, 3.0)
    rows = []
    for n in counts:
        for variant in ("procown", "srun + timeout(1)"):
            samples: list[tuple[float, float]] = []
            survivors = jobs = 0
            for _ in range(rounds):
                got, s, j = await _round(cfg, variant, n, deadline)
                samples.extend(got)
                survivors += s
                jobs += j
            first = Stats.of([f for f, _ in samples if f == f])
            back = Stats.of([b for _, b in samples])
            rows.append(
                [
                    variant,
                    str(n),
                    ms(first.median),
                    ms(first.max),
                    ms(back.median),
                    ms(back.max),
                    str(survivors),
                    str(jobs),
                ]
            )
            section.data[f"{variant} n={n}"] = {
                "first_output": [f for f, _ in samples],
                "deadline_to_return": [b for _, b in samples],
                "survivors": survivors,
                "jobs_listed": jobs,
            }
    section.tables.append(
        Table(
            [
                "variant",
                "jobs",
                "first output median ms",
                "max ms",
                "deadline→return median ms",
                "max ms",
                "survivors",
                "jobs still listed",
            ],
            rows,
            caption=f"{rounds} round(s) per row, deadline {deadline:g} s, grace {GRACE:g} s, "
            f"kill_wait {KILL_WAIT:g} s; survivors counted {SETTLE:g} s after the callers returned.",
        )
    )
    return section
