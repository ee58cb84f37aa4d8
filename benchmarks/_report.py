# Rendering the results: a markdown report for people and a JSON file for
# tools, both written to benchmarks/results/. The header says when (UTC) and
# where (host, kernel, Python, trio, CPUs) the numbers were measured, because
# they mean little without it; a summary of every printed target follows.

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from ._harness import Section, Table


def _table(t: Table) -> list[str]:
    out = ["| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in t.rows]
    if t.caption:
        out += ["", f"_{t.caption}_"]
    return [*out, ""]


def _fmt_value(target: dict[str, Any]) -> str:
    value, unit = target["value"], target["unit"]
    if unit == "s":
        return f"{value * 1e3:.2f} ms"
    if unit == "x":
        return f"{value:.2f} x"
    return f"{value:.2f} {unit}" if unit == "MiB" else f"{value:g} {unit}"


def _fmt_limit(target: dict[str, Any]) -> str:
    op = "≤" if target["at_most"] else "≥"
    limit, unit = target["limit"], target["unit"]
    if unit == "s":
        return f"{op} {limit * 1e3:g} ms"
    if unit == "x":
        return f"{op} {limit:g} x"
    return f"{op} {limit:g} {unit}"


def markdown(
    env: dict[str, Any],
    sections: list[Section],
    final_survivors: list[tuple[int, str]],
    total: float,
    cgroups: list[str],
) -> str:
    lines = [
        "# trio_procown benchmarks",
        "",
        f"Measured {env['date_utc']} (UTC, {env['time_utc']}) on `{env['hostname']}`: "
        f"{env['kernel']} {env['machine']}, {env['python']}, trio {env['trio']}, "
        f"trio_procown {env['trio_procown']} (commit {env['commit']}), "
        f"{env['cpu_count']} CPUs ({env['cpus_usable']} usable), load average at start {env['loadavg_at_start']}; "
        f"peers: anyio {env.get('anyio', '?')}; plots: matplotlib {env.get('matplotlib', '?')}.",
        "",
        "Regenerate every table and plot with `make bench` (installs the `bench` extra) or "
        "`python -m benchmarks`; `python -m benchmarks --quick` is the smoke run (results in `results/quick/`).",
        "",
        f"Mode: **{env['mode']}** (`python -m benchmarks{' --quick' if env['mode'] == 'quick' else ''}`), "
        f"total {total:.1f} s. Variants are interleaved within each scenario (one sample of each per round, in an order shuffled for each round); compare "
        "ratios within this run, not absolute times across runs. Targets are printed, never asserted.",
        "",
        "Domains: " + "; ".join(f"{k}: {v}" for k, v in env["domains"].items()) + ".",
        "",
        "## Targets",
        "",
        "| scenario | target | measured | limit | verdict |",
        "|---|---|---|---|---|",
    ]
    for s in sections:
        for t in s.targets:
            lines.append(f"| {s.key} | {t['name']} | {_fmt_value(t)} | {_fmt_limit(t)} | {t['verdict']} |")
    lines.append("")
    lines += ["## Survivors (live processes carrying the run's marker)", ""]
    for s in sections:
        names = ", ".join(f"{pid} `{cmd[:60]}`" for pid, cmd in s.survivors[:5])
        lines.append(f"- after {s.key}: {len(s.survivors)}" + (f" (killed: {names})" if names else ""))
    lines.append(f"- at the end of the run: {len(final_survivors)}")
    lines.append(
        f"- cgroups trio_procown created for this process and left behind: {len(cgroups)}"
        + (f" ({', '.join(cgroups[:5])})" if cgroups else "")
    )
    lines.append("")
    for s in sections:
        lines += [f"## {s.title}", "", s.what, "", f"_Scenario time: {s.seconds:.1f} s._", ""]
        if s.error:
            lines += ["**Scenario failed:**", "", "```", s.error.rstrip(), "```", ""]
        for table in s.tables:
            lines += _table(table)
        for caption, name in s.images:
            lines += [f"![{caption}]({name})", ""]
        for note in s.notes:
            lines.append(f"- Note: {note}")
        if s.notes:
            lines.append("")
    lines += closing_note(sections)
    return "\n".join(lines)


def _data(sections: list[Section], key: str) -> dict[str, Any]:
    for s in sections:
        if s.key == key and not s.error:
            return s.data
    return {}


def _x(value: Any) -> str:
    return "n/a" if not isinstance(value, (int, float)) or value != value else f"{value:.2f} x"


def closing_note(sections: list[Section]) -> list[str]:
    """The headline ratios and, per peer, the scenarios it does not handle,
    quoted from this run's data (whatever sections ran)."""
    lines = ["## Closing note", ""]
    spawn = _data(sections, "spawn")
    if spawn:
        to_trio, to_floor = spawn.get("ratio_to_trio", {}), spawn.get("ratio_to_floor", {})
        to_capture = spawn.get("ratio_to_trio_capture", {})
        parts = [
            f"`{name}` {_x(to_trio.get(name))} trio.run_process"
            + (
                f" ({_x(to_capture.get(name))} trio.run_process capture, capture on both sides)"
                if name in to_capture and not name.endswith("devnull")
                else ""
            )
            + f" and {_x(to_floor.get(name))} the posix_spawn floor"
            for name in to_trio
            if name.startswith("run_owned")
        ]
        peers = [
            f"{name.removeprefix('peer: ')} {_x(to_trio.get(name))} / {_x(to_floor.get(name))}"
            for name in to_trio
            if name.startswith("peer:")
        ]
        lines.append("- **Spawn-and-wait of `/bin/true`** (medians): " + "; ".join(parts) + ".")
        if peers:
            lines.append(f"  Peers, as ratios to trio.run_process / to the floor: {'; '.join(peers)}.")
        gaps = spawn.get("gap_sweep_seconds", {})
        idle = spawn.get("idle_gap", 0.05)
        if gaps:
            parts = []
            for domain, per in gaps.items():
                back, after = per.get("0.0", []), per.get(str(idle), [])
                if back and after:
                    parts.append(
                        f"{domain} {statistics.median(back) * 1e6:,.0f} µs back to back, "
                        f"{statistics.median(after) * 1e6:,.0f} µs after {idle * 1e3:g} ms idle"
                    )
            lines.append(f"  An occasional command (capturing both streams): {'; '.join(parts)}.")
        loops = spawn.get("loop_seconds", {})
        if loops:
            looped = [f"{name} {statistics.median(v) * 1e6:,.0f} µs" for name, v in loops.items() if v]
            lines.append(f"  In a loop of the same call (capturing both streams): {'; '.join(looped)}.")
    drain = _data(sections, "drain")
    if drain:
        owned_mem = [
            m for m in drain.get("memory", []) if m.get("variant") == "run_owned" and "delta_kib" in m
        ]
        peer_mem = [
            f"{m['variant']} {m['delta_kib'] / 1024:,.0f} MiB for {m['size'] / 1e6:,.0f} MB"
            for m in drain.get("memory", [])
            if m.get("variant") not in ("run_owned", "plain") and "delta_kib" in m
        ]
        owned_text = ", ".join(
            f"{m['delta_kib'] / 1024:.1f} MiB for {m['size'] / 1e6:,.0f} MB" for m in owned_mem
        )
        lines.append(
            f"- **Drain**: run_owned {_x(drain.get('ratio_owned_vs_trio_same_size'))} trio's capture throughput "
            f"(same size) and {_x(drain.get('ratio_owned_vs_plain'))} a plain blocking read loop; "
            f"peak memory above baseline: run_owned {owned_text}"
            + (f"; peers keep everything: {'; '.join(peer_mem)}." if peer_mem else ".")
        )
    scaling = _data(sections, "scaling")
    if scaling:
        lines.append(
            "- **Scaling** (largest points; time to return past the deadline or cancel, processes left):"
        )
        for ours_key, peers_key, unit in (
            ("tree", "peers_tree", "descendants"),
            ("concurrent", "peers_concurrent", "commands"),
        ):
            ours = scaling.get(ours_key, {})
            theirs = scaling.get(peers_key, {})
            if not ours:
                continue
            top = max(int(k.split()[0]) for k in ours)
            parts = []
            for k, v in ours.items():
                if int(k.split()[0]) == top:
                    parts.append(
                        f"trio_procown {k.split(' ', 1)[1]} {v['wall_seconds']['median'] * 1e3:,.0f} ms, "
                        f"{max(v['survivors'], default=0)} left"
                    )
            for k, v in theirs.items():
                if int(k.split()[0]) == top:
                    label = scaling.get("peer_labels", {}).get(k.split(" ", 1)[1], k)
                    med = v["past_deadline_seconds"]["median"]
                    med_s = "n/a" if med is None or med != med else f"{med * 1e3:,.0f} ms"
                    parts.append(f"{label} {med_s}, {max(v['left'], default=0)} left")
            lines.append(f"  - {top} {unit}: " + "; ".join(parts) + ".")
    correctness = _data(sections, "peers")
    if correctness:
        lines += _correctness_lines(correctness)
    if len(lines) == 2:
        return []
    return [*lines, ""]


def _correctness_lines(data: dict[str, Any]) -> list[str]:
    """Per peer: the scenarios where it never returned, lost the early
    output, left processes, or returned late (> T + 1 s)."""
    deadline, cap = data["deadline"], data["cap"]
    titles = {k: v["title"] for k, v in data.get("scenarios", {}).items()}
    lines = [
        f"- **Correctness under a {deadline:g} s deadline** ({len(titles)} scenarios: "
        + ", ".join(titles.values())
        + "). What each peer got wrong:"
    ]
    for key, label in data.get("peers", {}).items():
        cells = [c for c in data.get("cells", []) if c["peer"] == key]
        never = [titles[c["scenario"]] for c in cells if c["never_returned"]]
        lost = [titles[c["scenario"]] for c in cells if not c["never_returned"] and not all(c["early_kept"])]
        left = [
            f"{titles[c['scenario']]} ({max(c['left'])} left)" for c in cells if max(c["left"], default=0) > 0
        ]
        late = [
            f"{titles[c['scenario']]} ({c['median_seconds']:.1f} s)"
            for c in cells
            if not c["never_returned"]
            and c["median_seconds"] is not None
            and c["median_seconds"] > deadline + 1
        ]
        parts = []
        if never:
            parts.append(f"never returned (> {cap:g} s) in {', '.join(never)}")
        if lost:
            parts.append(f"lost the early output in {', '.join(lost)}")
        if left:
            parts.append(f"left processes running in {', '.join(left)}")
        if late:
            parts.append(f"returned late in {', '.join(late)}")
        lines.append(f"  - {label}: " + ("; ".join(parts) if parts else "nothing") + ".")
    lines.append(
        "  - A late trio_procown row is its documented grace (default 2 s) between SIGTERM and SIGKILL; "
        "the ADK-style teardown waits 5 s there, and 5 s more after SIGKILL before giving up on the output."
    )
    return lines


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write(
    out_dir: Path,
    env: dict[str, Any],
    sections: list[Section],
    final_survivors: list[tuple[int, str]],
    total: float,
    cgroups: list[str],
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "latest.md"
    md.write_text(markdown(env, sections, final_survivors, total, cgroups) + "\n")
    payload = {
        "environment": env,
        "total_seconds": total,
        "final_survivors": final_survivors,
        "leftover_cgroups": cgroups,
        "sections": [
            {
                "key": s.key,
                "title": s.title,
                "seconds": s.seconds,
                "error": s.error,
                "targets": s.targets,
                "survivors": s.survivors,
                "notes": s.notes,
                "images": [name for _, name in s.images],
                "data": s.data,
            }
            for s in sections
        ],
    }
    (out_dir / "latest.json").write_text(json.dumps(_clean(payload), indent=1) + "\n")
    return md
