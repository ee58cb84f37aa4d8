# Quoting the committed benchmark results in the prose: README.md and
# docs/comparison.md quote one run of `python -m benchmarks` (its header,
# the correctness table of section 6, ~50 cost figures and the verdicts of
# their targets). Those quotes live between marker comments,
#
#     <!-- quote:NAME -->
#     ...generated...
#     <!-- /quote:NAME -->
#
# and this module renders them from benchmarks/results/latest.json (and
# latest.md, for what the JSON does not hold: the correctness tables, quoted
# verbatim, the mass-teardown parameters, and the mass-teardown points of
# results written before the JSON kept them), so that they cannot drift from
# the committed results:
#
#     python -m benchmarks.quote            rewrite the regions in place
#     python -m benchmarks.quote --check    exit 1 with a diff if they are stale
#     python -m benchmarks.quote --results benchmarks/results/quick/latest.json --out-dir /tmp/q
#                                           render another run into copies
#
# Sentences keep their hand-written wording; only the numbers and the
# verdict phrases ("were missed", "met for cgroup, missed for process-group")
# come from the data. A figure the run lacks (a --quick or --only run)
# reads "not measured in this run"; rendering never fails on missing data.
# Standard library only: it must run while the package is being edited.

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "latest.json"
MISSING = "not measured in this run"

# The files that quote the run, and the regions each must have.
FILES: dict[str, tuple[str, ...]] = {
    "README.md": ("run", "header", "correctness", "cost"),
    "docs/comparison.md": ("header", "correctness", "adk", "cost"),
}

REGION = re.compile(
    r"(?P<open><!-- quote:(?P<name>[\w-]+) -->)(?P<body>.*?)(?P<close><!-- /quote:(?P=name) -->)", re.S
)


class Missing(Exception):
    """A figure this run did not measure."""


# -- reading the results -----------------------------------------------------------


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _nums(values: Any) -> list[float]:
    """The numbers of a JSON list (anything else in it, or a non-list, left out)."""
    return [v for v in (_num(x) for x in values) if v is not None] if isinstance(values, list) else []


def _median(values: Any) -> float | None:
    nums = _nums(values)
    return statistics.median(nums) if nums else None


def _max(values: Any) -> float | None:
    nums = _nums(values)
    return max(nums) if nums else None


def _get(obj: Any, *path: str | int) -> Any:
    for key in path:
        found = (isinstance(obj, dict) and key in obj) or (
            isinstance(obj, list) and isinstance(key, int) and -len(obj) <= key < len(obj)
        )
        if not found:
            return None
        obj = obj[key]
    return obj


@dataclass
class MassPoint:
    commands: int
    domain: str
    processes: int | None
    wall: float | None  # seconds: cancel -> every block returned
    over: int | None  # blocks that ended past their bound
    survivors: int | None
    stall: float | None  # seconds: longest event-loop stall
    runs: int = 1  # how many times the point ran (every figure above is the worst run's)
    runs_over: int | None = 0  # runs with a block past its bound


class Results:
    def __init__(self, data: dict[str, Any], markdown: str) -> None:
        self.env: dict[str, Any] = data.get("environment") or {}
        self.total: float | None = _num(data.get("total_seconds"))
        self.sections: dict[str, dict[str, Any]] = {
            s["key"]: s for s in data.get("sections", []) if isinstance(s, dict) and "key" in s
        }
        self.md_sections = _md_sections(markdown)

    @classmethod
    def load(cls, json_path: Path) -> Results:
        data = json.loads(json_path.read_text(encoding="utf-8"))
        md_path = json_path.with_suffix(".md")
        markdown = md_path.read_text(encoding="utf-8") if md_path.exists() else ""
        return cls(data, markdown)

    def data(self, key: str) -> dict[str, Any]:
        section = self.sections.get(key)
        if not section or section.get("error"):
            return {}
        data = section.get("data")
        return data if isinstance(data, dict) else {}

    def target(self, key: str, name: str | re.Pattern[str]) -> dict[str, Any] | None:
        section = self.sections.get(key) or {}
        for t in section.get("targets", []):
            if (t.get("name") == name) if isinstance(name, str) else name.fullmatch(t.get("name", "")):
                return t if isinstance(t, dict) else None
        return None

    # -- from latest.md --

    def md_tables(self, number: str) -> list[list[str]]:
        """The tables (as lines) of the results section whose title starts with NUMBER."""
        for title, lines in self.md_sections.items():
            if title.startswith(number):
                return _md_tables(lines)
        return []

    def md_caption(self, number: str, header_start: str) -> str:
        for title, lines in self.md_sections.items():
            if not title.startswith(number):
                continue
            for i, line in enumerate(lines):
                if line.startswith(header_start):
                    for rest in lines[i:]:
                        if rest.startswith("_") and rest.endswith("_"):
                            return rest
                        if not rest.startswith("|") and rest:
                            break
        return ""

    def mass_points(self) -> list[MassPoint]:
        """The mass-teardown points: from the JSON when it holds them, else
        from the table of latest.md (results written before they were kept)."""
        per_command = self.mass_processes_per_command()
        mass = self.data("scaling").get("mass")
        points: list[MassPoint] = []
        if isinstance(mass, dict) and mass:
            for key, p in mass.items():
                k, _, domain = key.partition(" ")
                per_run = _nums(p.get("blocks_over_limit"))
                over = max(per_run, default=None)
                survivors = _max(p.get("survivors"))
                points.append(
                    MassPoint(
                        int(k),
                        domain,
                        int(k) * per_command if per_command else None,
                        _max(p.get("wall_seconds")),
                        None if over is None else int(over),
                        None if survivors is None else int(survivors),
                        _max(p.get("max_loop_stall_seconds")),
                        max(len(per_run), 1),
                        sum(v > 0 for v in per_run) if per_run else None,
                    )
                )
            return points
        for table in self.md_tables("5."):
            if not table[0].startswith("| commands | processes | domain |"):
                continue
            header = _cells(table[0])
            for line in table[2:]:
                row = dict(zip(header, _cells(line), strict=False))
                past = next((v for h, v in row.items() if h.startswith("blocks past")), "")
                runs_over, _, runs = row.get("runs with a block past it", "0/1").partition("/")
                points.append(
                    MassPoint(
                        int(row["commands"]),
                        row["domain"],
                        _int(row.get("processes")),
                        _ms(row.get("all returned ms")),
                        _int(past.partition("/")[0]),
                        _int(row.get("survivors")),
                        _ms(row.get("longest loop stall ms")),
                        _int(runs) or 1,
                        _int(runs_over),
                    )
                )
        return points

    def mass_processes_per_command(self) -> int | None:
        match = re.search(r"\((\d+) processes\)", self.md_caption("5.", "| commands | processes |"))
        return int(match.group(1)) if match else None


def _md_sections(markdown: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in markdown.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def _md_tables(lines: list[str]) -> list[list[str]]:
    tables: list[list[str]] = []
    current: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").replace(",", ""))
    except ValueError:
        return None


def _ms(text: str | None) -> float | None:
    try:
        value = float((text or "").replace(",", "")) / 1e3
    except ValueError:
        return None
    return None if math.isnan(value) else value


# -- formatting --------------------------------------------------------------------


def us(seconds: float | None) -> str:
    return MISSING if seconds is None else f"{seconds * 1e6:,.0f} µs"


def us_n(seconds: float | None) -> str:
    """Microseconds without the unit."""
    return MISSING if seconds is None else f"{seconds * 1e6:,.0f}"


def ms(seconds: float | None) -> str:
    return MISSING if seconds is None else f"{seconds * 1e3:.2f} ms"


def ms_n(seconds: float | None) -> str:
    return MISSING if seconds is None else f"{seconds * 1e3:.2f}"


def x(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f} x"


def count(value: float | None) -> str:
    return MISSING if value is None else f"{value:,.0f}"


def and_join(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def limit(target: dict[str, Any] | None, *, plus: bool = False, digits: str = "g") -> str:
    """A target's limit as quoted: '≤ 20 ms', '≤ +20 ms', '≤ 1.15 x', '≤ 64 KiB'."""
    if target is None or _num(target.get("limit")) is None:
        return MISSING
    op = "≤" if target.get("at_most", True) else "≥"
    value, unit = float(target["limit"]), target.get("unit", "")
    sign = "+" if plus else ""
    if unit == "s":
        return f"{op} {sign}{value * 1e3:g} ms"
    if unit == "x":
        return f"{op} {sign}{value:{'.2f' if digits == '.2f' else 'g'}} x"
    return f"{op} {sign}{value:g} {unit}"


def verdict(targets: Iterable[tuple[str, dict[str, Any] | None]]) -> str:
    """'met', 'missed', or 'met for A, missed for B' over labelled targets;
    targets without a verdict are named as not measured."""
    pairs = list(targets)
    met = [label for label, t in pairs if t is not None and t.get("verdict") == "met"]
    missed = [label for label, t in pairs if t is not None and t.get("verdict") == "MISSED"]
    unknown = [label for label, t in pairs if label not in met and label not in missed]
    if not met and not missed:
        return MISSING
    if not missed:
        text = "met"
    elif not met:
        text = "missed"
    else:
        text = f"met for {and_join(met)}, missed for {and_join(missed)}"
    if unknown:
        text += f" ({MISSING} for {and_join(unknown)})"
    return text


# -- the regions ---------------------------------------------------------------------


def render_run(r: Results) -> str:
    mode = r.env.get("mode", "full")
    command = "python -m benchmarks" + (" --quick" if mode == "quick" else "")
    total = MISSING if r.total is None else f"{r.total:.1f} s"
    return f"{mode} run of `{command}` (total\n{total})"


def render_header(r: Results) -> str:
    e = r.env
    if not e:
        return f"> Measured: {MISSING}."
    return (
        f"> Measured {e.get('date_utc')} (UTC, {e.get('time_utc')}) on `{e.get('hostname')}`: "
        f"{e.get('kernel')} {e.get('machine')}, {e.get('python')}, trio {e.get('trio')}, "
        f"trio_procown {e.get('trio_procown')} (commit {e.get('commit')}), "
        f"{e.get('cpu_count')} CPUs ({e.get('cpus_usable')} usable), load average at start "
        f"{e.get('loadavg_at_start')}; peers: anyio {e.get('anyio', '?')}; "
        f"plots: matplotlib {e.get('matplotlib', '?')}."
    )


def _correctness_tables(r: Results) -> tuple[list[str], list[str]]:
    """Section 6's table of cells and its table of scenarios, verbatim."""
    cells: list[str] = []
    scenarios: list[str] = []
    for table in r.md_tables("6."):
        if table[0].startswith("| peer |") and not table[0].startswith("| peer | scenarios not handled"):
            cells = cells or table
        elif table[0].startswith("| scenario | command"):
            scenarios = scenarios or table
    return cells, scenarios


def render_correctness(r: Results) -> str:
    cells, scenarios = _correctness_tables(r)
    if not cells:
        return f"_The correctness table: {MISSING}._"
    return "\n".join(cells + (["", *scenarios] if scenarios else []))


ADK_ROWS = (
    ("ADK-style group teardown", "ADK-style"),
    ("`trio_procown` run_owned, cgroup", "trio_procown run_owned(timeout=), cgroup"),
    ("`trio_procown` run_owned, process-group", "trio_procown run_owned(timeout=), process-group"),
)
ADK_SCENARIOS = ("SIGTERM-ignoring member", "stopped member", "setsid escapee")


def render_adk(r: Results) -> str:
    """The ADK-style teardown's weak spots against trio_procown: cells of
    section 6's table, transposed (scenario rows)."""
    table, _ = _correctness_tables(r)
    lines = ["| scenario | " + " | ".join(label for label, _ in ADK_ROWS) + " |", "|---|---|---|---|"]
    header = _cells(table[0]) if table else []
    rows = {_cells(line)[0]: _cells(line) for line in table[2:]}
    for scenario in ADK_SCENARIOS:
        out = [scenario]
        for _, peer in ADK_ROWS:
            row = next((v for k, v in rows.items() if k.startswith(peer)), None)
            col = header.index(scenario) if scenario in header else -1
            out.append(row[col] if row is not None and 0 <= col < len(row) else MISSING)
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def render_cost(r: Results, domains_link: str) -> str:
    bullets: list[tuple[str, Callable[[], str]]] = [
        ("Spawn-and-wait of `/bin/true`", lambda: _spawn(r, domains_link)),
        ("Deadline to return", lambda: _deadline(r)),
        ("`procown run --timeout`", lambda: _cli_deadline(r)),
        ("Drain", lambda: _drain(r)),
        ("Memory per live command", lambda: _memory(r)),
        ("Many commands cancelled together", lambda: _mass(r)),
        ("Many commands with one grandchild each, cancelled together", lambda: _concurrent(r)),
        ("The keeper", lambda: _keeper(r)),
        ("Start-up", lambda: _startup(r)),
    ]
    out = []
    for lead, render in bullets:
        try:
            out.append(render())
        except Missing:
            out.append(f"- {lead}: {MISSING}.")
    return "\n".join(out)


def _need(data: dict[str, Any]) -> dict[str, Any]:
    if not data:
        raise Missing
    return data


def _spawn(r: Results, domains_link: str) -> str:
    d = _need(r.data("spawn"))
    stats = d.get("stats_seconds", {})
    to_capture = d.get("ratio_to_trio_capture", {})
    to_trio = d.get("ratio_to_trio", {})
    gaps = d.get("gap_sweep_seconds", {})
    idle = _num(d.get("idle_gap")) or 0.05

    def med(name: str) -> float | None:
        return _num(_get(stats, name, "median"))

    def gap(name: str, back: bool) -> str:
        return us_n(_median(_get(gaps, name, "0.0" if back else str(idle))))

    loops = d.get("loop_seconds", {})

    def looped(name: str) -> float | None:
        return _median(loops.get(name))

    def over_trio(mine: float | None, base: float | None) -> str:
        return x(mine / base if mine is not None and base else None)

    def loop_x(name: str) -> str:
        return over_trio(looped(name), looped("trio.run_process capture"))

    def by_gap(name: str) -> str:
        def one(key: str) -> str:
            seconds = float(key)
            ratio = over_trio(
                _median(_get(gaps, name, key)), _median(_get(gaps, "trio.run_process capture", key))
            )
            return f"{ratio} {'right after another command' if seconds == 0 else f'after {seconds * 1e3:g} ms idle'}"

        # The gaps this run measured (the JSON's keys), shortest first.
        keys = sorted(_get(gaps, "trio.run_process capture") or {}, key=float)
        return ", ".join(one(k) for k in keys) or MISSING

    pg = r.target("spawn", "run_owned process-group / trio.run_process capture")
    cg = r.target("spawn", "run_owned cgroup / trio.run_process capture")
    after = f"after {idle * 1e3:g} ms idle"
    pg_idle = r.target("spawn", f"run_owned process-group {after} / trio.run_process capture")
    cg_idle = r.target("spawn", f"run_owned cgroup {after} / trio.run_process capture")
    targets = (
        ("process-group", pg),
        ("cgroup", cg),
        (f"process-group {after}", pg_idle),
        (f"cgroup {after}", cg_idle),
    )
    rounds = d.get("rounds", MISSING)
    return f"""\
- Spawn-and-wait of `/bin/true`, capture on both sides (`run_owned` with its
  default capture against `trio.run_process` capturing both streams, medians
  of {rounds} interleaved rounds): cgroup {us(med("run_owned cgroup"))}, {x(_num(to_capture.get("run_owned cgroup")))}
  `trio.run_process capture` ({us(med("trio.run_process capture"))}); process-group {us(med("run_owned process-group"))}, {x(_num(to_capture.get("run_owned process-group")))}.
  With nothing captured on either side (`run_owned` devnull against plain
  `trio.run_process`): cgroup {x(_num(to_trio.get("run_owned cgroup devnull")))}, process-group {x(_num(to_trio.get("run_owned process-group devnull")))}. A command is
  created inside its cgroup (clone3, see [the domains page]({domains_link})),
  so an occasional command no longer pays a cgroup move: capturing both
  streams, a cgroup spawn took {gap("run_owned cgroup", True)} µs back to back and {gap("run_owned cgroup", False)} µs after
  {idle * 1e3:g} ms idle (process-group {gap("run_owned process-group", True)} µs and {gap("run_owned process-group", False)} µs; `trio.run_process`
  {gap("trio.run_process capture", True)} µs and {gap("trio.run_process capture", False)} µs). The targets of this run ({limit(pg, digits=".2f")} for
  process-group, {limit(cg, digits=".2f")} for cgroup, in the interleaved rounds and {after}) were
  {verdict(targets)}. Called in a loop ({d.get("loop_length", MISSING)} calls of one variant in a row, each started
  as soon as the previous returned), process-group took {us(looped("run_owned process-group"))}, {loop_x("run_owned process-group")}
  `trio.run_process capture` ({us(looped("trio.run_process capture"))}), and cgroup {us(looped("run_owned cgroup"))}, {loop_x("run_owned cgroup")}. The same
  ratio by the idle before a command: process-group {by_gap("run_owned process-group")};
  cgroup {by_gap("run_owned cgroup")}."""


def _deadline(r: Results) -> str:
    d = _need(r.data("deadline"))
    stats = d.get("stats_seconds", {})

    def upper(domain: str) -> tuple[str, str]:
        s = _get(stats, domain, "upper") or {}
        median, lo, hi = _num(s.get("median")), _num(s.get("min")), _num(s.get("max"))
        spread = f" ({ms_n(lo)}-{ms_n(hi)})" if lo is not None and hi is not None else ""
        return ms(median), spread

    cg_median, cg_spread = upper("cgroup")
    pg_median, pg_spread = upper("process-group")
    descendants = _num(d.get("descendants"))
    size = MISSING if descendants is None else f"{descendants + 1:g}"
    cg = r.target("deadline", "deadline→return upper bound, cgroup")
    pg = r.target("deadline", "deadline→return upper bound, process-group")
    return f"""\
- Deadline to return, a {size}-process tree that obeys SIGTERM: cgroup {cg_median} median{cg_spread}, process-group {pg_median}{pg_spread}; the kernel's
  floor for SIGTERM→empty (raw `killpg` + pidfd poll) was {ms(_median(d.get("raw_sigterm_samples_seconds")))}. The
  target of {limit(cg or pg)} was {verdict((("cgroup", cg), ("process-group", pg)))} in this run."""


def _cli_deadline(r: Results) -> str:
    d = _need(r.data("cli_deadline"))
    t = d.get("timeout", 1)
    procown = f"procown run --timeout {t:g} -- sh -c 'sleep 9 & sleep 9'"
    gnu = f"timeout {t:g} sh -c 'sleep 9 & sleep 9'"
    foreground = f"timeout --foreground {t:g} sh -c 'sleep 9 & sleep 9'"
    exits = d.get("deadline_to_exit_seconds", {})
    stats = d.get("stats_seconds", {})
    survivors = d.get("survivors", {})
    target = r.target("cli_deadline", re.compile(r"procown run --timeout .*extra over GNU timeout"))
    left_procown, left_gnu = _max(survivors.get(procown)), _max(survivors.get(gnu))
    if left_procown is not None and left_procown == left_gnu:
        left = f"both left {count(left_procown)} processes"
    else:
        left = f"procown left {count(left_procown)} processes and GNU `timeout` {count(left_gnu)}"
    left_foreground = _max(survivors.get(foreground))
    foreground_note = (
        f"\n  (`timeout --foreground` left {count(left_foreground)} per run)"
        if left_foreground is not None
        else f"\n  (`timeout --foreground`: {MISSING})"
    )
    rounds = d.get("rounds", MISSING)
    return f"""\
- `{procown}` exited {ms(_median(exits.get(procown)))}
  after its deadline (median of {rounds}), GNU `timeout` {ms(_median(exits.get(gnu)))}: {ms(_num(d.get("deadline_to_exit_extra_over_gnu_seconds")))} more
  (target {limit(target, plus=True)}, {verdict((("procown", target),))}). As whole processes, start-up included, procown
  took {ms(_num(_get(stats, procown, "median")))} and GNU `timeout` {ms(_num(_get(stats, gnu, "median")))}; {left}{foreground_note}."""


def _drain(r: Results) -> str:
    d = _need(r.data("drain"))
    gbps, sizes = d.get("gbps", {}), d.get("sizes", {})

    def rate(name: str) -> str:
        value = _num(_get(gbps, name, "median"))
        return MISSING if value is None else f"{value:.2f} GB/s"

    def size(name: str) -> str:
        value = _num(sizes.get(name))
        return MISSING if value is None else f"{value / 1e6:,.0f} MB"

    def peak(variant: str, name: str) -> str:
        want = _num(sizes.get(name))
        for m in d.get("memory", []):
            if (
                m.get("variant") == variant
                and _num(m.get("size")) == want
                and _num(m.get("delta_kib")) is not None
            ):
                return f"{m['delta_kib'] / 1024:.1f} MiB"
        return MISSING

    small, big = "run_owned max_output=1MiB (small)", "run_owned max_output=1MiB"
    trio, plain, pipe = (
        "trio.run_process capture_stdout",
        "plain os.read loop, 1 MiB reads",
        "plain os.read loop, 1 MiB reads, 1 MiB pipe",
    )
    return f"""\
- Drain, compared at equal volume (cgroup domain, `max_output=1MiB`): at
  {size(small)}, {rate(small)}, {x(_num(d.get("ratio_owned_vs_trio_same_size")))} `trio.run_process` capture_stdout ({rate(trio)});
  at {size(big)}, {rate(big)}, {x(_num(d.get("ratio_owned_vs_plain")))} a plain `os.read` loop ({rate(plain)}), and
  {x(_num(d.get("ratio_owned_vs_plain_1mib_pipe")))} the same loop on a 1 MiB pipe ({rate(pipe)}). Peak
  memory above baseline: {peak("run_owned", big)} for {size(big)}, {peak("run_owned", small)} for {size(small)}, where
  `trio.run_process`, which keeps everything, took {peak("trio", trio)} for {size(trio)}."""


def _memory(r: Results) -> str:
    d = _need(r.data("memory"))
    heap = d.get("heap_kib_per_command", {})
    runs = d.get("runs", {})

    def kib(variant: str) -> str:
        value = _num(heap.get(variant))
        return MISSING if value is None else f"{value:.1f} KiB"

    def fds(variant: str) -> float | None:
        n, total = _num(_get(runs, variant, "n")), _num(_get(runs, variant, "fds"))
        return total / n if n and total is not None else None

    per = {v: fds(v) for v in ("cgroup", "process-group", "trio")}
    if None not in per.values() and len(set(per.values())) == 1:
        fd_text = f"{count(per['cgroup'])} fds each, as for `trio.run_process`"
    else:
        fd_text = (
            f"fds per command: cgroup {count(per['cgroup'])}, process-group {count(per['process-group'])}, "
            f"`trio.run_process` {count(per['trio'])}"
        )
    n = _num(_get(runs, "cgroup", "n")) or _num(_get(runs, "trio", "n"))
    cg = r.target("memory", "heap per live command, cgroup")
    pg = r.target("memory", "heap per live command, process-group")
    return f"""\
- Memory per live command ({count(n)} idle `sleep`s held open, capture on both
  sides): {kib("cgroup")} of Python heap on the cgroup domain and {kib("process-group")} on
  process-group (target {limit(cg or pg)}, {verdict((("cgroup", cg), ("process-group", pg)))}), against {kib("trio")} for
  `trio.run_process`; {fd_text}."""


def _mass(r: Results) -> str:
    points = r.mass_points()
    if not points:
        raise Missing
    caption = r.md_caption("5.", "| commands | processes |")
    stall_target = r.target("scaling", "mass teardown: longest event-loop stall")
    stall_goal = _num((stall_target or {}).get("limit"))
    bound = re.search(
        r"blocks past their ([\d.]+) s bound",
        " ".join(t.get("name", "") for t in (r.sections.get("scaling") or {}).get("targets", [])),
    )
    budgets = re.search(r"grace ([\d.]+) s, kill_wait ([\d.]+) s, drain_wait ([\d.]+) s", caption)
    command = re.search(r"`sh -c '([^']*)'`", caption)
    children = f"{command.group(1).count('sleep')}" if command else MISSING
    params = (
        f"grace {budgets.group(1)} s, kill_wait {budgets.group(2)} s, drain_wait {budgets.group(3)} s"
        if budgets
        else f"budgets {MISSING}"
    )
    bound_text = f"{bound.group(1)} s" if bound else MISSING

    ks = sorted({p.commands for p in points})
    by = {(p.commands, p.domain): p for p in points}

    def walls(group: list[int], domain: str) -> str:
        return and_join([ms_n(by[(k, domain)].wall if (k, domain) in by else None) for k in group])

    def at(group: list[int]) -> list[MassPoint]:
        return [p for p in points if p.commands in group]

    def blocks_over(group: list[int]) -> tuple[int | None, int]:
        pts = at(group)
        if any(p.over is None for p in pts):
            return None, sum(p.commands for p in pts)
        return sum(p.over or 0 for p in pts), sum(p.commands for p in pts)

    def survivors(group: list[int]) -> str:
        values = [p.survivors for p in at(group)]
        return MISSING if None in values else f"{sum(v or 0 for v in values):,}"

    def stall(group: list[int]) -> float | None:
        return _max([p.stall for p in at(group)])

    def stalled(k: int) -> bool | None:
        value = stall([k])
        return None if value is None or stall_goal is None else value > stall_goal

    stall_limit = limit(stall_target)
    goal = f"stall {stall_limit}"
    text = f"""\
- Many commands cancelled together, each a shell with {children} sleeping children
  ({params}: a {bound_text} bound per block):
  """
    *group, last = ks
    if group:
        over, total = blocks_over(group)
        if over == 0:
            within = "every block within its\n  bound"
        elif over is None:
            within = f"blocks past their bound: {MISSING}"
        else:
            within = f"{over:,} of {total:,} blocks past their\n  bound"
        missed = [k for k in group if stalled(k)]
        worst = ms(stall(group))
        if stall_goal is None or stall(group) is None:
            stall_text = f", longest event-loop stall {worst}"
        elif not missed:
            stall_text = f", and the event loop stalled at most {worst}\n  (target {stall_limit}, met)"
        elif len(missed) == len(group):
            stall_text = f", but the event loop stalled up to {worst}\n  (target {stall_limit}, missed)"
        else:
            stall_text = (
                f", but the event loop stalled up to {worst}\n  (target {stall_limit}, missed at "
                f"{and_join([f'{k:,}' for k in missed])} commands)"
            )
        text += f"""\
{and_join([f"{k:,}" for k in group])} commands were torn down in {walls(group, "cgroup")} ms
  (cgroup; process-group {walls(group, "process-group")} ms), {within}, {survivors(group)} survivors{stall_text}. """
    over, total = blocks_over([last])
    last_stall = stall([last])
    stall_bad = stalled(last)
    block_bad = over is None or over > 0
    survivors_last = survivors([last])
    # "but" before the first thing that went wrong
    first = "but" if block_bad or survivors_last != "0" else "and"
    then = ", but the event" if stall_bad and first == "and" else " and the event"
    last_points = at([last])
    runs = max((p.runs for p in last_points), default=1)
    runs_total = sum(p.runs for p in last_points)
    runs_over = [p.runs_over for p in last_points]
    runs_text = (
        f"{MISSING} of {runs_total} runs"
        if None in runs_over
        else f"{sum(v or 0 for v in runs_over)} of {runs_total} runs"
    )
    if runs == 1:
        worst = ""
    elif over:
        worst = f" in the worst run of\n  each domain; {runs_text} had a block past it,"
    else:
        worst = f" in each of its {runs}\n  runs"
    if over == total and total:
        blocks = f"every block passed its bound (the receipts say so){worst}"
    elif over is None:
        blocks = f"blocks past their bound: {MISSING}"
    elif over:
        blocks = f"{over:,} of {total:,} blocks passed their bound (the receipts say so){worst}"
    else:
        blocks = f"every block ended within its bound{worst}"
    if stall_bad is None:
        targets = f"the targets (every block within its bound,\n  {goal}): {MISSING}"
    elif block_bad == stall_bad:
        targets = f"the targets (every block within its bound,\n  {goal}) were {'missed' if block_bad else 'met'} there"
    else:
        targets = (
            f"the target of every block within its bound was {'missed' if block_bad else 'met'} there,\n"
            f"  that of a {goal} {'missed' if stall_bad else 'met'}"
        )
    processes = by.get((last, "cgroup")) or by.get((last, "process-group"))
    stall_verb = "stalled up to" if stall_bad or stall_bad is None else "stalled at most"
    text += f"""\
At {last:,} commands ({count(processes.processes if processes else None)} processes) the teardown
  took {"up to " if runs > 1 else ""}{ms(by[(last, "cgroup")].wall if (last, "cgroup") in by else None)} (cgroup) and {ms(by[(last, "process-group")].wall if (last, "process-group") in by else None)} (process-group), {survivors_last} survivors, {first}
  {blocks}{then}
  loop {stall_verb} {ms(last_stall)}: {targets}."""
    scaling = r.data("scaling")
    storm = _max((scaling.get("mass_storm_floor_stall_seconds") or {}).get(str(last)))
    bare = _num((scaling.get("mass_bare_cancel_stall_seconds") or {}).get(str(last)))
    if storm is not None:
        past = (
            "" if stall_goal is None else (" (past the goal)" if storm > stall_goal else " (within the goal)")
        )
        text += f""" With no library at all, plain
  trio killing the same {last:,} trees (killpg from a thread, then awaiting each
  leader) stalled its loop up to {ms(storm)}{past} in the same run: the kill
  storm's floor on this machine (trio's own cancel of {last:,} bare tasks: {ms(bare)})."""
    growth = r.target(
        "scaling", re.compile(r"mass teardown \(cgroup\): cost per command at K=(\d+) vs K=(\d+)")
    )
    if growth is not None:
        match = re.search(r"K=(\d+) vs K=(\d+)", growth["name"])
        assert match is not None
        value = _num(growth.get("value"))
        verb = "grew" if value is None or value >= 1 else "fell to"
        text += f""" The cost per command {verb} {x(value)}
  (cgroup) from {int(match.group(2)):,} to {int(match.group(1)):,} commands."""
    return text


def _concurrent(r: Results) -> str:
    d = _need(r.data("scaling"))
    ours, theirs = d.get("concurrent") or {}, d.get("peers_concurrent") or {}
    if not ours:
        raise Missing
    k = max(int(key.split()[0]) for key in ours)

    def wall(domain: str) -> float | None:
        return _num(_get(ours, f"{k} {domain}", "wall_seconds", "median"))

    left_ours = [_max(_get(ours, f"{k} {domain}", "survivors")) for domain in ("cgroup", "process-group")]
    survivors = MISSING if None in left_ours else f"{sum(v or 0 for v in left_ours):,.0f}"

    def peer(key: str) -> tuple[str, float | None]:
        p = theirs.get(f"{k} {key}") or {}
        return ms(_num(_get(p, "past_deadline_seconds", "median"))), _max(p.get("left"))

    adk, adk_left = peer("adk")
    others = [("`subprocess.run`", *peer("subprocess.run")), ("`trio.run_process`", *peer("trio")),
              ("`anyio.run_process`", *peer("anyio"))]  # fmt: skip
    lefts = [left for _, _, left in others]
    if None not in lefts and len(set(lefts)) == 1:
        leaving = f"each\n  leaving {count(lefts[0])} processes"
    else:
        leaving = f"leaving\n  {and_join([count(left) for left in lefts])} processes"
    return f"""\
- {k:,} commands with one grandchild each, cancelled together: torn down in
  {ms(wall("cgroup"))} median (cgroup) and {ms(wall("process-group"))} (process-group), {survivors} survivors.
  The peers on the same {k:,} commands, from the deadline to the last return:
  the ADK-style teardown {adk}, {count(adk_left)} left; {others[0][0]} {others[0][1]},
  {others[1][0]} {others[1][1]} and {others[2][0]} {others[2][1]}, {leaving}."""


def _keeper(r: Results) -> str:
    d = _need(r.data("keeper"))
    stats, ratio, cleanup = (
        d.get("stats_seconds", {}),
        d.get("keeper_over_no_keeper", {}),
        d.get("cleanup_seconds", {}),
    )

    def med(name: str) -> str:
        return us(_num(_get(stats, name, "median")))

    return f"""\
- The keeper (on by default), spawn-and-wait of `/bin/true` with nothing
  captured, medians of {d.get("rounds", MISSING)} interleaved rounds: cgroup {med("cgroup keeper")} with it and
  {med("cgroup no keeper")} without, {x(_num(ratio.get("cgroup")))} (keeper / no keeper); process-group {med("process-group keeper")} and
  {med("process-group no keeper")}, {x(_num(ratio.get("process-group")))}. After SIGKILL of the owner, its command tree (a
  grandchild and a setsid escapee) was gone in {ms(_median(cleanup.get("cgroup")))} median, {ms(_max(cleanup.get("cgroup")))} at
  most (cgroup), and {ms(_median(cleanup.get("process-group")))}, {ms(_max(cleanup.get("process-group")))} at most (process-group)."""


def _startup(r: Results) -> str:
    d = _need(r.data("startup"))
    stats = d.get("stats_seconds", {})

    def med(name: str) -> str:
        return ms(_num(_get(stats, name, "median")))

    run = r.target("startup", "procown run -- true / import trio")
    plugin = r.target(
        "startup",
        re.compile(r"pytest start-up, plugin off: extra over no plugin( \((isolated, )?paired\))?"),
    )
    paired = d.get("pytest_plugin_off_paired_extra_seconds")
    extra = (
        f"a paired extra of {ms(_num(paired))} (median of per-round differences)"
        if paired is not None
        else f"an extra of {ms(_num(d.get('pytest_plugin_off_extra_seconds')))}"
    )
    isolated = d.get("pytest_plugin_isolated_paired_extra_seconds")
    if isolated is not None:
        extra += (
            f"; with no other plugin autoloaded (judged: the others' start-up varies by far more), "
            f"a paired extra of {ms(_num(isolated))}"
        )
    return f"""\
- Start-up: `procown run -- true` took {med("procown run -- true")}, {x(_num(d.get("procown_run_over_import_trio")))}
  `python -c "import trio"` ({med('python -c "import trio"')}; the target of {limit(run, digits=".2f")} was {verdict((("procown run", run),))}
  in this run); `import trio_procown` alone took {med('python -c "import trio_procown"')}. pytest with the
  plugin off (`--procown-leaks=off`) took {med("pytest --procown-leaks=off")} against {med("pytest -p no:procown")} with
  `-p no:procown`, {extra} (target {limit(plugin, plus=True)}, {verdict((("the plugin", plugin),))}); the
  plugin's import alone took {ms(_median(d.get("plugin_import_seconds")))}."""


# -- rewriting the files ---------------------------------------------------------------


def render(name: str, results: Results, path: Path) -> str:
    """The generated text of region NAME in the file at PATH."""
    if name == "run":
        return render_run(results)
    if name == "header":
        return render_header(results)
    if name == "correctness":
        return render_correctness(results)
    if name == "adk":
        return render_adk(results)
    if name == "cost":
        domains = Path(os.path.relpath(ROOT / "docs" / "domains.md", path.parent)).as_posix()
        return render_cost(results, domains)
    raise KeyError(name)


def rewrite(text: str, results: Results, path: Path, required: Iterable[str]) -> str:
    """TEXT with every quote region re-rendered. A region whose opening
    marker ends its line is a block (blank lines around the content);
    otherwise it is inline."""
    found: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        found.add(name)
        content = render(name, results, path)
        body = f"\n\n{content}\n\n" if match.group("body").startswith("\n") else content
        return match.group("open") + body + match.group("close")

    out = REGION.sub(replace, text)
    missing = [name for name in required if name not in found]
    if missing:
        raise SystemExit(f"{path}: no quote region {', '.join(missing)} (markers <!-- quote:NAME --> ...)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quote",
        description="Render the benchmark figures quoted in README.md and docs/comparison.md "
        "from the committed results.",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 with a diff if the files are not up to date"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="the run's JSON (its .md next to it); default: %(default)s",
    )
    parser.add_argument(
        "--out-dir", type=Path, help="write the rendered files under this directory instead of in place"
    )
    args = parser.parse_args(argv)
    results = Results.load(args.results)
    stale = False
    for relative, required in FILES.items():
        path = ROOT / relative
        before = path.read_text(encoding="utf-8")
        after = rewrite(before, results, path, required)
        if args.check:
            if after != before:
                stale = True
                sys.stdout.writelines(
                    difflib.unified_diff(
                        before.splitlines(keepends=True),
                        after.splitlines(keepends=True),
                        f"{relative} (committed)",
                        f"{relative} (from {args.results.name})",
                    )
                )
            continue
        target = (args.out_dir / relative) if args.out_dir else path
        target.parent.mkdir(parents=True, exist_ok=True)
        if args.out_dir or after != before:
            target.write_text(after, encoding="utf-8")
            print(f"wrote {target}", file=sys.stderr)
    if stale:
        print(
            "\nThe quoted benchmark figures are not those of the results: run `python -m benchmarks.quote`.",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
