# Scenario 6: correctness under a deadline, every peer against trio_procown.
#
# What it measures, for each peer (benchmarks/_peers.py) and each scenario
# below, all run with the same deadline T (0.5 s):
#   - time to return: from calling the peer to control coming back (return
#     or raise), measured inside the runner process;
#   - early output kept: whether the "early" line that the command printed
#     at once is in what the peer handed back;
#   - processes left: processes carrying the run's marker that are still
#     alive (zombies excluded) SETTLE seconds after the peer returned.
# The scenarios, all `/bin/sh -c` strings that print "early" first and end
# with `exec sleep 30`, so the leader itself holds the pipes and each
# scenario has exactly one other member whose behaviour is under test (dash
# does not exec a last command by itself; without the exec the shell's own
# `sleep` child would be a second pipe-holder in every scenario):
#   control   the leader alone: what every peer should get right;
#   forked    a forked grandchild with its output sent to /dev/null;
#   pipe      a forked grandchild that inherited (and holds) the pipes;
#   term      a member that ignores SIGTERM (and holds the pipes);
#   stopped   a stopped member (SIGSTOP; a SIGTERM stays pending);
#   setsid    a member that left the process group with setsid;
#   bg        the leader finished at once, a background job holds the pipes.
#
# How: each (peer, scenario) runs in a fresh `python -m
# benchmarks._peer_runner` process whose environment carries a unique
# PEER_RUN_MARKER, inherited by everything the command starts. The harness
# waits for that process with a hard wall-clock cap; a peer that has not
# returned by then is reported "never returned (> cap)", and every process
# carrying the marker (the runner included) is SIGKILLed through a verified
# pidfd -- never by name. Survivors of a returned peer are counted, then
# killed, the same way. Round 1 runs every cell once; later rounds repeat only
# the cells that returned within T + 1.5 s (the slow ones are slow by
# construction, and repeating them would only spend minutes); times are
# medians, survivors the maximum over rounds.
#
# Why: this is the behaviour the library exists for (DESIGN.md section 1),
# and PLATFORM.md "How peers behave at a deadline" measured it once by hand;
# this makes it reproducible, for every peer, in the same run.
# --quick runs the pipe scenario only (the classic failure), with a 2 s cap,
# and no repeats, to stay inside the smoke run's minute.

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import trio_procown

from . import _plots
from ._harness import Config, Section, Table, kill_marked, leftover_cgroups, marked_processes
from ._peers import OURS, PEERS, Peer, missing_module, usable

PEER_VAR = "PEER_RUN_MARKER"
ROOT = Path(__file__).resolve().parent.parent
SETTLE = 0.1
STARTUP_ALLOWANCE = 2.0  # interpreter start-up before the peer is called
LATE_AFTER = 1.0  # returned later than T + this: "late"
REPEAT_BELOW = 1.5  # repeat cells that returned within T + this


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    command: str


SCENARIOS = [
    Scenario("control", "single process (control)", "echo early; exec sleep 30"),
    Scenario(
        "forked",
        "forked grandchild (output to /dev/null)",
        "echo early; sleep 30 >/dev/null 2>&1 & exec sleep 30",
    ),
    Scenario("pipe", "pipe-holding grandchild", "echo early; sleep 30 & exec sleep 30"),
    Scenario("term", "SIGTERM-ignoring member", "echo early; (trap '' TERM; exec sleep 30) & exec sleep 30"),
    Scenario("stopped", "stopped member", "echo early; sleep 30 & kill -STOP $!; exec sleep 30"),
    Scenario("setsid", "setsid escapee", "echo early; setsid sleep 30 & exec sleep 30"),
    Scenario("bg", "finished leader with a background job", "echo early; sleep 30 &"),
]
QUICK_SCENARIOS = ("pipe",)


@dataclass
class Cell:
    peer: str
    scenario: str
    seconds: list[float] = field(default_factory=list)
    never: bool = False
    early: list[bool] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    left_cmds: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    receipts: list[dict[str, Any]] = field(default_factory=list)
    cgroups_left: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    def status(self, deadline: float) -> str:
        """never / fail / late / ok."""
        if self.never:
            return "never"
        if self.errors or max(self.left, default=0) > 0 or not all(self.early):
            return "fail"
        if self.median > deadline + LATE_AFTER:
            return "late"
        return "ok"

    def problems(self, deadline: float, cap: float) -> list[str]:
        out = []
        if self.never:
            out.append(f"never returned (> {cap:g} s)")
        elif not all(self.early):
            out.append("early output lost")
        if max(self.left, default=0):
            out.append(f"{max(self.left)} process(es) left")
        if not self.never and self.median > deadline + LATE_AFTER:
            out.append(f"returned after {self.median:.1f} s")
        if self.errors:
            out.append("raised an unexpected error")
        return out

    def text(self, cap: float) -> str:
        """Compact markdown cell: time · early output · left."""
        left = max(self.left, default=0)
        left_s = f"{left} left" if left == 0 else f"**{left} left**"
        if self.never:
            return f"**never returned (> {cap:g} s)** · {left_s}"
        early = "kept" if all(self.early) else "**lost**"
        err = " · **error**" if self.errors else ""
        return f"{self.median:.2f} s · {early} · {left_s}{err}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "scenario": self.scenario,
            "seconds": self.seconds,
            "median_seconds": self.median if self.seconds else None,
            "never_returned": self.never,
            "early_kept": self.early,
            "left": self.left,
            "left_commands": self.left_cmds[:6],
            "errors": self.errors[:2],
            "receipts": self.receipts[:1],
            "cgroups_left": self.cgroups_left,
        }


async def _run_cell(cell: Cell, command: str, deadline: float, cap: float, scratch: Path) -> float | None:
    """Run the peer once in its own runner process; record into `cell`.
    Returns the time to return, or None if it never returned."""
    marker = uuid.uuid4().hex
    env = dict(os.environ)
    env[PEER_VAR] = marker
    result_path = scratch / f"{marker}.json"
    log_path = scratch / f"{marker}.log"
    argv = [
        sys.executable,
        "-m",
        "benchmarks._peer_runner",
        cell.peer,
        repr(deadline),
        str(result_path),
        command,
    ]
    with open(log_path, "wb") as log:
        proc = await trio.lowlevel.open_process(
            argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    started = Path(f"{result_path}.started")
    with trio.move_on_after(STARTUP_ALLOWANCE):
        while not started.exists() and proc.returncode is None:
            await trio.sleep(0.005)
    returned = False
    with trio.move_on_after(cap):
        await proc.wait()
        returned = result_path.is_file()
    seconds: float | None = None
    if returned:
        result = json.loads(result_path.read_text())
        await trio.sleep(SETTLE)
        seconds = float(result["seconds"])
        cell.seconds.append(seconds)
        cell.early.append(bool(result.get("early_kept")))
        if result.get("error"):
            cell.errors.append(str(result["error"]))
        cell.receipts.extend(result.get("receipts", []))
    else:
        cell.never = True
    alive = [(pid, cmd) for pid, cmd in marked_processes(marker, PEER_VAR) if pid != proc.pid]
    cell.left.append(len(alive))
    if alive and not cell.left_cmds:
        cell.left_cmds = [cmd for _, cmd in alive]
    for _ in range(50):  # kill, then wait (bounded) until nothing carries the marker
        if not kill_marked(marker, PEER_VAR):
            break
        await trio.sleep(0.02)
    with trio.move_on_after(5):
        await proc.wait()
    cell.cgroups_left += leftover_cgroups(proc.pid, remove=True)
    if not returned and log_path.is_file():
        tail = log_path.read_bytes()[-300:].decode(errors="replace").strip()
        if tail:
            cell.errors.append(f"runner log: {tail}")
    for path in (result_path, log_path, started):
        path.unlink(missing_ok=True)
    return seconds


def _summary(
    cells: dict[tuple[str, str], Cell], peers: list[Peer], scenarios: list[Scenario], T: float, cap: float
) -> dict[str, list[str]]:
    """Peer label -> the scenarios it fails ('title: problems')."""
    out: dict[str, list[str]] = {}
    for p in peers:
        fails = []
        for s in scenarios:
            c = cells.get((p.key, s.key))
            if c is not None and c.status(T) != "ok":
                fails.append(f"{s.title}: {', '.join(c.problems(T, cap))}")
        out[p.label] = fails
    return out


async def run(cfg: Config) -> Section:
    section = Section(
        "peers",
        "6. Correctness under a deadline: trio_procown and its peers",
        "Each cell: time from the call to control coming back · whether the line printed at once "
        "(`early`) is in what the caller got back · processes of the command still alive "
        f"{SETTLE:g} s after the peer returned. Each (peer, scenario) runs in its own process with a hard cap; "
        "a peer still blocked at the cap is killed with its whole tree (by a per-run environment marker).",
    )
    T = 0.5
    cap = cfg.pick(2.0, 12.0)
    extra_rounds = cfg.pick(0, 1)
    scenarios = [s for s in SCENARIOS if not cfg.quick or s.key in QUICK_SCENARIOS]
    if cfg.quick:
        section.notes.append(
            f"--quick: only the {', '.join(QUICK_SCENARIOS)} scenario, a {cap:g} s cap and one round; "
            "the full run (`python -m benchmarks`) has every scenario, a 12 s cap and 2 rounds of the fast cells."
        )
    peers = []
    for p in PEERS:
        if usable(p):
            peers.append(p)
        else:
            why = missing_module(p)
            section.notes.append(
                f"peer `{p.label}` skipped: "
                + (
                    f"{why} is not installed ({_plots.INSTALL_HINT})"
                    if why
                    else "its domain is unavailable here"
                )
            )

    cells = {(p.key, s.key): Cell(p.key, s.key) for s in scenarios for p in peers}
    with tempfile.TemporaryDirectory(prefix="procown-peers-") as tmp:
        scratch = Path(tmp)
        first: dict[tuple[str, str], float | None] = {}
        for s in scenarios:
            for p in peers:
                first[(p.key, s.key)] = await _run_cell(cells[(p.key, s.key)], s.command, T, cap, scratch)
        fast = [k for k, v in first.items() if v is not None and v <= T + REPEAT_BELOW]
        for r in range(extra_rounds):
            order = fast if r % 2 == 0 else fast[::-1]
            for p_key, s_key in order:
                command = next(s.command for s in scenarios if s.key == s_key)
                await _run_cell(cells[(p_key, s_key)], command, T, cap, scratch)

    table = Table(
        ["peer", *[s.title for s in scenarios]],
        [[p.label, *[cells[(p.key, s.key)].text(cap) for s in scenarios]] for p in peers],
        caption=f"Deadline T = {T:g} s for every cell; cap {cap:g} s; time = median over "
        f"{1 + extra_rounds} round(s) for cells that returned within T + {REPEAT_BELOW:g} s, one round otherwise. "
        "trio_procown rows use the library defaults (grace 2 s, kill_wait 1 s, drain_wait 0.5 s); "
        f"the open_owned_command row uses domain 'auto' ({trio_procown.auto_choice().name} here).",
    )
    section.tables.append(table)
    commands = Table(
        ["scenario", "command (`/bin/sh -c`; dash)"],
        [[s.title, f"`{s.command}`"] for s in scenarios],
    )
    section.tables.append(commands)

    fails = _summary(cells, peers, scenarios, T, cap)
    fail_table = Table(
        ["peer", "scenarios not handled (lost output, processes left, never returned, or late)"],
        [[label, "; ".join(f) if f else "none"] for label, f in fails.items()],
        caption=f"'late' = returned more than {LATE_AFTER:g} s after the deadline.",
    )
    section.tables.append(fail_table)

    # Anything odd in our own rows: cgroups left, receipts that do not match.
    for (p_key, s_key), c in cells.items():
        if c.cgroups_left:
            section.notes.append(f"{p_key} / {s_key}: cgroups left behind: {c.cgroups_left}")
        if p_key in OURS:
            for rec in c.receipts:
                if not rec.get("domain_empty") or rec.get("output") != "complete":
                    section.notes.append(
                        f"{p_key} / {s_key}: receipt domain_empty={rec.get('domain_empty')} "
                        f"output={rec.get('output')} forced={rec.get('forced')}"
                    )
                    break
        for e in c.errors[:1]:
            section.notes.append(f"{p_key} / {s_key}: {e.strip().splitlines()[-1][:200]}")

    legend = [
        ("ok", "ok"),
        ("late", f"late (> T + {LATE_AFTER:g} s)"),
        ("fail", "output lost / processes left"),
        ("never", f"never returned (> {cap:g} s)"),
    ]
    grid_cells: dict[tuple[int, int], tuple[str, str]] = {}
    for r, p in enumerate(peers):
        for c_i, s in enumerate(scenarios):
            c = cells[(p.key, s.key)]
            left = max(c.left, default=0)
            if c.never:
                text = f"never\n(> {cap:g} s)\n{left} left"
            else:
                text = f"{c.median:.2f} s\n{'kept' if all(c.early) else 'LOST'}\n{left} left"
            grid_cells[(r, c_i)] = (c.status(T), text)
    _plots.save(
        section,
        cfg,
        "deadline_correctness.png",
        "Correctness under a 0.5 s deadline: time to return, early output, processes left",
        _plots.grid(
            f"Deadline T = {T:g} s: time to return · early output · processes left",
            [p.label for p in peers],
            [textwrap.fill(s.title, 20) for s in scenarios],
            grid_cells,
            legend,
        ),
    )
    section.data = {
        "deadline": T,
        "cap": cap,
        "rounds": 1 + extra_rounds,
        "settle": SETTLE,
        "scenarios": {s.key: {"title": s.title, "command": s.command} for s in scenarios},
        "peers": {p.key: p.label for p in peers},
        "cells": [c.to_dict() for c in cells.values()],
        "status": {f"{p} / {s}": c.status(T) for (p, s), c in cells.items()},
        "fails": fails,
    }
    return section
