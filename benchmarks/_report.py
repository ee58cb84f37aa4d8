# Rendering the results: a markdown report for people and a JSON file for
# tools, both written to benchmarks/results/. The header says when (UTC) and
# where (host, kernel, Python, trio, CPUs) the numbers were measured, because
# they mean little without it; a summary of every printed target follows.

from __future__ import annotations

import json
import math
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
        f"{env['cpu_count']} CPUs ({env['cpus_usable']} usable), load average at start {env['loadavg_at_start']}.",
        "",
        f"Mode: **{env['mode']}** (`python -m benchmarks{' --quick' if env['mode'] == 'quick' else ''}`), "
        f"total {total:.1f} s. Variants are interleaved round-robin within each scenario; compare "
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
    return "\n".join(lines)


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
