# PNG plots of the benchmark results (matplotlib, Agg backend, no display).
#
# What they show: the same numbers as the markdown tables, drawn so that
# growth and outliers are visible at a glance: spawn cost per variant
# against the posix_spawn floor, drain throughput and peak memory per
# variant, teardown time and processes left against tree size and against
# the number of concurrent commands, and the deadline-correctness grid
# (peer x scenario, coloured by outcome).
#
# Why optional: CI installs only the `test` extra. Without matplotlib every
# plot is skipped with a note in the report (`pip install -e '.[bench]'`
# brings it); the tables are complete without the plots.

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ._harness import Config, Section, results_dir

INSTALL_HINT = "pip install -e '.[bench]'"


def missing() -> str:
    """Why plots cannot be drawn here, or '' if they can."""
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        return f"matplotlib is not installed ({INSTALL_HINT})"
    return ""


def save(section: Section, cfg: Config, name: str, caption: str, draw: Callable[[Any], None]) -> None:
    """Draw one figure with `draw(plt)` into results/<name> and reference it
    from the section, or add a note saying why it was skipped."""
    path = results_dir(cfg) / name
    why = missing()
    if why:
        path.unlink(missing_ok=True)  # no stale figure next to fresh tables
        section.notes.append(f"plot {name} skipped: {why}")
        return
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        draw(plt)
        plt.savefig(path, dpi=110, bbox_inches="tight")
    except Exception:
        section.notes.append(f"plot {name} failed: {traceback.format_exc(limit=2)}")
        return
    finally:
        plt.close("all")
    section.images.append((caption, name))


# -- the figures ------------------------------------------------------------------------------

OURS_COLOR = "#1f6f3f"
PEER_COLOR = "#4a6fa5"
FLOOR_COLOR = "#888888"


def bars(
    title: str,
    xlabel: str,
    rows: Sequence[tuple[str, float, str]],
    *,
    ours: Callable[[str], bool],
    floor: float | None = None,
    floor_label: str = "",
    log: bool = False,
) -> Callable[[Any], None]:
    """Horizontal bars: (label, value, annotation) per row, ours in green."""

    def draw(plt: Any) -> None:
        _fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
        labels = [r[0] for r in rows]
        values = [r[1] if math.isfinite(r[1]) else 0.0 for r in rows]
        colors = [OURS_COLOR if ours(r[0]) else PEER_COLOR for r in rows]
        y = list(range(len(rows)))[::-1]
        ax.barh(y, values, color=colors)
        ax.set_yticks(y, labels, fontsize=8)
        top = max(values, default=1.0) or 1.0
        for yi, v, r in zip(y, values, rows, strict=True):
            ax.text(v, yi, f" {r[2]}", va="center", fontsize=7)
        if floor is not None:
            ax.axvline(floor, color=FLOOR_COLOR, linestyle="--", linewidth=1)
            ax.text(floor, len(rows) - 0.4, f" {floor_label}", color=FLOOR_COLOR, fontsize=7)
        if log:
            ax.set_xscale("log")
        else:
            ax.set_xlim(0, top * 1.5)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)

    return draw


def growth(
    title: str,
    xlabel: str,
    series: dict[str, list[tuple[float, float, float]]],
    *,
    ours: Callable[[str], bool],
    note: str = "",
    ylabel: str = "time to return past the deadline (ms, log)",
) -> Callable[[Any], None]:
    """Two panels against x (log): time past the deadline / cancel (ms, log)
    and processes left, one line per variant; series: label -> [(x, ms, left)]."""

    def draw(plt: Any) -> None:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True, height_ratios=[3, 2])
        markers = "osD^v<>ph*"
        for i, (label, points) in enumerate(series.items()):
            pts = sorted(p for p in points if math.isfinite(p[1]))
            if not pts:
                continue
            xs = [p[0] for p in pts]
            style = "-" if ours(label) else "--"
            lw = 2.2 if ours(label) else 1.3
            top.plot(
                xs,
                [max(p[1], 0.05) for p in pts],
                style,
                marker=markers[i % len(markers)],
                lw=lw,
                label=label,
            )
            bottom.plot(xs, [p[2] for p in pts], style, marker=markers[i % len(markers)], lw=lw, label=label)
        from matplotlib.ticker import FuncFormatter

        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        top.set_xscale("log")
        top.set_yscale("log")
        top.yaxis.set_major_formatter(plain)
        top.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
        top.tick_params(axis="y", which="minor", labelsize=7)
        top.xaxis.set_major_formatter(plain)
        xs_all = sorted({p[0] for points in series.values() for p in points})
        if xs_all:
            top.set_xticks(xs_all)
        top.set_ylabel(ylabel)
        top.set_title(title, fontsize=10)
        top.grid(alpha=0.3, which="both")
        top.legend(fontsize=7, loc="upper left")
        bottom.set_yscale("symlog", linthresh=1)
        most = max((p[2] for points in series.values() for p in points), default=1.0)
        bottom.set_ylim(-0.3, max(most, 1.0) * 2.5)
        bottom.yaxis.set_major_formatter(plain)
        bottom.set_ylabel("processes left running")
        bottom.set_xlabel(xlabel)
        bottom.grid(alpha=0.3, which="both")
        if note:
            fig.text(0.01, -0.01, note, fontsize=7, va="top", wrap=True)

    return draw


def grid(
    title: str,
    rows: Sequence[str],
    columns: Sequence[str],
    cells: dict[tuple[int, int], tuple[str, str]],
    legend: Sequence[tuple[str, str]],
) -> Callable[[Any], None]:
    """A table of coloured cells: cells[(row, col)] = (status, text), status
    one of ok / late / fail / never / skipped."""
    palette = {
        "ok": "#b7e1b0",
        "late": "#f6e3a1",
        "fail": "#f3a8a0",
        "never": "#c0392b",
        "skipped": "#dddddd",
    }

    def draw(plt: Any) -> None:
        _fig, ax = plt.subplots(figsize=(1.75 * len(columns) + 3.2, 0.62 * len(rows) + 1.6))
        for (r, c), (status, text) in cells.items():
            y = len(rows) - 1 - r
            ax.add_patch(
                plt.Rectangle((c, y), 1, 1, facecolor=palette.get(status, "#ffffff"), edgecolor="white")
            )
            ax.text(
                c + 0.5,
                y + 0.5,
                text,
                ha="center",
                va="center",
                fontsize=7.5,
                color="white" if status == "never" else "black",
            )
        ax.set_xlim(0, len(columns))
        ax.set_ylim(0, len(rows))
        ax.set_xticks([c + 0.5 for c in range(len(columns))], columns, fontsize=7.5)
        ax.xaxis.tick_top()
        ax.set_yticks([len(rows) - 1 - r + 0.5 for r in range(len(rows))], rows, fontsize=7.5)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(title, fontsize=10, pad=28)
        handles = [plt.Rectangle((0, 0), 1, 1, facecolor=palette[k]) for k, _ in legend]
        ax.legend(
            handles,
            [text for _, text in legend],
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.02),
            ncol=len(legend),
            frameon=False,
        )

    return draw
