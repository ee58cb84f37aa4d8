# Entry point: `python -m benchmarks [--quick] [--only NAME ...]`.
#
# Runs the scenarios in order inside one trio.run, each in its own try block
# so one failing scenario still leaves a report of the others. Before the
# first scenario it puts a fresh BENCH_MARKER in os.environ (inherited by
# every command any benchmark starts); after each scenario and at the end it
# scans /proc for live processes carrying the marker, reports them as
# survivors, and SIGKILLs exactly those (by verified pidfd, never by name).
# At the end it also lists (and removes, if empty) any child cgroup that
# trio_procown created for this process and did not remove. Scenario 6
# (peers) runs each peer in a runner process of its own, with its own
# marker and a hard cap (see peers.py). The report (markdown + JSON + PNG
# plots) goes to results/, or results/quick/ with --quick.
# Exit status: 0, or 1 if a scenario raised, or 2 with --fail-on-survivors
# when a survivor was found. Timing never affects the exit status.

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import traceback
from collections.abc import Awaitable, Callable

import trio

from . import cli_deadline, deadline, drain, force, keeper, memory, peers, scaling, slurm, spawn, startup
from ._harness import (
    Config,
    Section,
    environment,
    install_marker,
    kill_marked,
    leftover_cgroups,
    results_dir,
)
from ._report import write

SCENARIOS: dict[str, Callable[[Config], Awaitable[Section]]] = {
    "spawn": spawn.run,
    "deadline": deadline.run,
    "force": force.run,
    "drain": drain.run,
    "scaling": scaling.run,
    "peers": peers.run,
    "keeper": keeper.run,
    "startup": startup.run,
    "memory": memory.run,
    "cli_deadline": cli_deadline.run,
    "slurm": slurm.run,
}


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


async def _main(cfg: Config, names: list[str]) -> tuple[list[Section], float]:
    sections = []
    t_start = time.perf_counter()
    for name in names:
        print(f"[benchmarks] {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            section = await SCENARIOS[name](cfg)
        except Exception:
            section = Section(name, name, "(failed)", error=traceback.format_exc())
        section.seconds = time.perf_counter() - start
        section.survivors = kill_marked(cfg.marker)
        print(
            f"[benchmarks] {name}: {section.seconds:.1f} s, survivors {len(section.survivors)}"
            + (", FAILED" if section.error else ""),
            file=sys.stderr,
            flush=True,
        )
        sections.append(section)
    return sections, time.perf_counter() - t_start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="trio_procown benchmarks")
    parser.add_argument("--quick", action="store_true", help="small repeat counts (CI smoke run, < 60 s)")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--fail-on-survivors", action="store_true", help="exit 2 if any process survived")
    args = parser.parse_args(argv)

    _raise_fd_limit()
    cfg = Config(quick=args.quick, marker=install_marker())
    env = environment(cfg)
    names = args.only or list(SCENARIOS)
    sections, total = trio.run(_main, cfg, names)
    time.sleep(0.1)
    final = kill_marked(cfg.marker)
    cgroups = leftover_cgroups(os.getpid(), remove=True)
    path = write(results_dir(cfg), env, sections, final, total, cgroups)
    print(path.read_text())
    print(f"[benchmarks] report written to {path} and {path.with_suffix('.json')}", file=sys.stderr)
    if any(s.error for s in sections):
        return 1
    if args.fail_on_survivors and (final or cgroups or any(s.survivors for s in sections)):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
