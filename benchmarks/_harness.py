# Shared machinery of the benchmarks: configuration, interleaving of the
# compared variants in shuffled rounds, summary statistics, the process marker that lets
# us find (and kill) anything a benchmark left behind, and the description of
# the machine the numbers were measured on.
#
# Why interleave: this is a noisy 2-core VM. Measuring variant A for a while
# and then variant B lets a burst of background load land on one of them
# only. Running one sample of each variant per round, in an order shuffled
# anew for each round, spreads the noise over all of them, so their ratio is
# meaningful even when absolute times drift by 15% between runs.
#
# Why shuffle rather than rotate: a rotated cyclic order gives each variant
# one fixed predecessor, and whatever a call leaves behind lands on the next
# one alone. Measured on this VM (2026-12-02): the call right after a
# blocking spawn (subprocess.run) or after trio.run_process pays ~0.2 ms
# more, whichever variant it is; in the rotated order that was always
# run_owned process-group (1.23 x trio there, 0.95-1.01 x in any other
# place). The shuffle is seeded (ORDER_SEED): the same orders every run.
#
# Why a marker: every command a benchmark starts inherits BENCH_MARKER=<uuid>
# from os.environ (set once at start). Scanning /proc/*/environ for it finds
# every descendant that is still alive, including ones that left their
# process group, without ever touching a process that is not ours. Zombies
# have no readable environment, so they are (correctly) not counted as alive.

from __future__ import annotations

import datetime
import gc
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import trio

import trio_procown

MARKER_VAR = "BENCH_MARKER"
T = TypeVar("T")
DomainName = Literal["cgroup", "process-group"]

Measure = Callable[[], Awaitable[float]]


@dataclass(frozen=True)
class Config:
    """What the run was asked to do."""

    quick: bool
    marker: str

    def pick(self, quick: T, full: T) -> T:
        """The quick-mode value in --quick runs, else the full-mode one."""
        return quick if self.quick else full


RESULTS = Path(__file__).resolve().parent / "results"


def results_dir(cfg: Config) -> Path:
    """Where this run's report and plots go: results/ for a full run (the
    committed results), results/quick/ for a --quick smoke run, so a smoke
    run never overwrites the committed full results."""
    return RESULTS / "quick" if cfg.quick else RESULTS


def usable_domains() -> list[DomainName]:
    """The ownership domains this machine offers, strongest first."""
    names: list[DomainName] = []
    for option in trio_procown.available_domains():
        if option.available and option.name in ("cgroup", "process-group"):
            names.append("cgroup" if option.name == "cgroup" else "process-group")
    return names


def install_marker() -> str:
    """Put a fresh marker in os.environ so every child inherits it."""
    marker = uuid.uuid4().hex
    os.environ[MARKER_VAR] = marker
    return marker


# -- statistics -----------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Median and extremes of a list of samples (seconds or any unit)."""

    n: int
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        if not samples:
            return cls(0, float("nan"), float("nan"), float("nan"))
        return cls(len(samples), statistics.median(samples), min(samples), max(samples))

    def scaled(self, factor: float) -> Stats:
        return Stats(self.n, self.median * factor, self.min * factor, self.max * factor)

    def to_dict(self) -> dict[str, float]:
        return {"n": self.n, "median": self.median, "min": self.min, "max": self.max}


def paired_differences(samples: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per round, sample - baseline taken in the same round (the machine's drift
    between rounds cancels; a difference of two medians keeps it)."""
    return [a - b for a, b in zip(samples, baseline, strict=True)]


def paired_ratio(samples: Sequence[float], baseline: Sequence[float]) -> float:
    """Median over rounds of sample/baseline taken in the same round."""
    ratios = [a / b for a, b in zip(samples, baseline, strict=False) if b > 0]
    return statistics.median(ratios) if ratios else float("nan")


def verdict(value: float, limit: float, *, at_most: bool = True) -> str:
    """'met' or 'MISSED' for a printed (never asserted) target."""
    if value != value:  # NaN
        return "n/a"
    ok = value <= limit if at_most else value >= limit
    return "met" if ok else "MISSED"


# -- timing -----------------------------------------------------------------------


def timed_async(call: Callable[[], Awaitable[object]]) -> Measure:
    """A measure that times one await of `call()` with perf_counter."""

    async def measure() -> float:
        start = time.perf_counter()
        await call()
        return time.perf_counter() - start

    return measure


def timed_sync(call: Callable[[], object]) -> Measure:
    """A measure that times one blocking call (run in the trio thread)."""

    async def measure() -> float:
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        await trio.lowlevel.checkpoint()
        return elapsed

    return measure


# The seed of the rounds' orders: the runs differ by the machine, not by the order.
ORDER_SEED = 16


def round_orders(names: Sequence[str], rounds: int, seed: int = ORDER_SEED) -> Iterator[list[str]]:
    """`rounds` orders of `names`, each shuffled anew (seeded): over the
    rounds every variant goes first, and follows each other one, about
    equally often."""
    rng = random.Random(seed)
    order = list(names)
    for _ in range(rounds):
        rng.shuffle(order)
        yield list(order)


async def interleaved(variants: Mapping[str, Measure], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Run `warmup` unrecorded rounds, then `rounds` recorded ones; each round
    takes one sample of every variant, in its own shuffled order (round_orders)."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            await variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for order in round_orders(names, rounds):
        gc.collect()  # outside any timed region: no collection lands in one variant only
        for name in order:
            samples[name].append(await variants[name]())
    return samples


# -- the marker and survivors ------------------------------------------------------------


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return ""


def marked_processes(marker: str, var: str = MARKER_VAR) -> list[tuple[int, str]]:
    """Live processes (zombies excluded) carrying `var=marker`, except us."""
    needle = f"{var}={marker}".encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        if _environ_has(pid, needle):
            found.append((pid, _cmdline(pid)))
    return found


def kill_marked(marker: str, var: str = MARKER_VAR) -> list[tuple[int, str]]:
    """SIGKILL every live process carrying `var=marker`, through a pidfd that
    is re-verified after opening (never a recycled pid). Returns the killed."""
    needle = f"{var}={marker}".encode()
    killed = []
    for pid, cmd in marked_processes(marker, var):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if _environ_has(pid, needle):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed.append((pid, cmd))
        except OSError:
            pass
        finally:
            os.close(fd)
    return killed


def count_marked(marker: str) -> int:
    return len(marked_processes(marker))


# -- cgroup v2 (for the raw cgroup.kill reference) ------------------------------------


def cgroup2_dir() -> str | None:
    """Our own cgroup v2 directory (mount point + our path), or None."""
    mount = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    mount = left.split()[4]
                    break
        with open("/proc/self/cgroup") as f:
            rel = next((ln.strip()[3:] for ln in f if ln.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or rel is None:
        return None
    path = os.path.join(mount, rel.lstrip("/"))
    return path if os.access(path, os.W_OK) else None


def leftover_cgroups(pid: int, *, remove: bool = False) -> list[str]:
    """Child cgroups that trio_procown created for process `pid` (named
    procown-<pid>-...) and that still exist; with `remove`, rmdir the empty
    ones after listing them (they are ours)."""
    root = cgroup2_dir()
    if root is None:
        return []
    prefix = f"procown-{pid}-"
    try:
        found = sorted(n for n in os.listdir(root) if n.startswith(prefix))
    except OSError:
        return []
    if remove:
        for name in found:
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass
    return found


# -- the machine -------------------------------------------------------------------


def _git_commit() -> str:
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip() or "unknown"
    return commit + (" (+uncommitted changes)" if dirty.stdout.strip() else "")


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def environment(cfg: Config) -> dict[str, Any]:
    """When and where the numbers were measured."""
    now = datetime.datetime.now(datetime.UTC)
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 0
    return {
        "date_utc": now.strftime("%Y-%m-%d"),
        "time_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": "quick" if cfg.quick else "full",
        "hostname": socket.gethostname(),
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "executable": sys.executable,
        "trio": trio.__version__,
        "trio_procown": getattr(trio_procown, "__version__", "unknown"),
        "anyio": _version("anyio"),
        "matplotlib": _version("matplotlib"),
        "commit": _git_commit(),
        "cpu_count": os.cpu_count() or 0,
        "cpus_usable": affinity,
        "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "domains": {
            o.name: ("available: " if o.available else "UNAVAILABLE: ") + o.reason
            for o in trio_procown.available_domains()
        },
    }


# -- what a scenario hands back -------------------------------------------------------------


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Section:
    """One scenario's results: tables and notes for the markdown report,
    plain data for the JSON one."""

    key: str
    title: str
    what: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)
    survivors: list[tuple[int, str]] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)  # (caption, file name in results/)
    seconds: float = 0.0
    error: str = ""

    def target(self, name: str, value: float, limit: float, unit: str, *, at_most: bool = True) -> str:
        """Record a printed target and return its verdict."""
        v = verdict(value, limit, at_most=at_most)
        self.targets.append(
            {"name": name, "value": value, "limit": limit, "unit": unit, "at_most": at_most, "verdict": v}
        )
        return v


# -- formatting helpers -----------------------------------------------------------------------


def us(x: float) -> str:
    return f"{x * 1e6:,.0f}"


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"
