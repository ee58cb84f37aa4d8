# Scenario 5: how teardown scales.
#
# What it measures, per ownership domain:
#   (a) tree size: one command whose leader has N descendants (1, 10, 50,
#       200; fan-out 8, so the larger trees are 3 levels deep and their inner
#       nodes become orphans as the teardown proceeds), all obeying SIGTERM.
#       Once the tree reports ready, the block is cancelled from outside with
#       trio.move_on_after (its deadline moved to now); we time from that
#       cancellation to the end of the block.
#   (b) concurrency: K commands (10, 100, 500), each `sh -c 'sleep & echo
#       ready; wait'` (one grandchild), all started in one nursery; once every
#       one printed ready, one trio.move_on_after around the nursery fires
#       and all are torn down together. We time cancellation → all returned.
#   (c) mass teardown (issue 16): K commands (250, 500, 1,000, 2,000), each
#       `sh -c` with 4 sleeping children (5 processes per command: 10,000 at
#       K = 2,000), grace 1 s, kill_wait 0.5 s, drain_wait 0.5 s, so each
#       block's bound is 2.5 s (the budgets plus the teardown's own
#       TEARDOWN_ALLOWANCE, as issue 16 counts it); the documented
#       "scheduling noise" we allow on top is one more TEARDOWN_ALLOWANCE
#       (what OwnedCommand.teardown_bound, the block's own wait, allows).
#       All are cancelled by one scope once every one printed ready. Per
#       point: wall time from the cancel to the last return, the slowest
#       block (cancel -> its own end) against the bound, how many blocks
#       ended past the bound, survivors, and the
#       longest event-loop stall: a task that loops on trio.sleep(0) records
#       the longest gap between two of its wakeups during the teardown (any
#       synchronous stretch of the loop shows up there). Between points we
#       wait for PID 1 to reap the orphaned zombies (it does so every ~2 s),
#       so each point starts with the pid space as free as the first.
# A full run repeats the points of MASS_RUNS_FROM commands and more
# MASS_RUNS times and reports each point's worst run (see MASS_RUNS).
# After each point we count live processes carrying the benchmark marker
# (survivors; must be 0) and summarise the receipts (forced, not proved
# empty). --quick runs two points of each.
#
# The peers (benchmarks/_peers.py) run the same trees and the same K
# commands, each under its own deadline (they have no "ready" hook to cancel
# at): a tree of N gets T = 0.5 s (a 200-process tree is ready in ~0.15 s);
# K commands share one absolute deadline far enough out for all K to have
# started (0.5 s + 4 ms per command), each peer call getting the time left
# until it. We time from that deadline to the last return and count the
# processes left (then kill them by the marker before the next point).
# Blocking peers run K calls in K threads; asyncio ones as K tasks of one
# loop; trio ones as K tasks of one nursery. The communicate and asyncio
# recipes are left out: they never return while a descendant holds the
# pipes, which every member of these trees does (section 6 shows it).
# --quick runs one point of each axis for the peers.
#
# Why: the per-command teardown scans the process table; with many
# processes alive at once, a cost that is linear per command becomes
# quadratic in total. This shows whether teardown stays bounded.

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import trio

import trio_procown
from trio_procown._teardown import TEARDOWN_ALLOWANCE

from . import _plots
from ._harness import Config, DomainName, Section, Stats, Table, count_marked, kill_marked, ms, usable_domains
from ._peers import BY_KEY, Command, Peer, call_async, call_blocking, missing_module
from ._trees import phases, tree_argv

READY_LIMIT = 60.0
# DESIGN.md section 3: the teardown is bounded by grace + kill_wait +
# drain_wait (defaults 2 + 1 + 0.5 s) "plus scheduling noise".
DOCUMENTED_BOUND = 3.5
GRANDCHILD_CMD = "sleep 600 & echo ready; wait"
MASS_CMD = "sleep 600 & sleep 600 & sleep 600 & sleep 600 & echo ready; wait"
MASS_GRACE, MASS_KILL_WAIT, MASS_DRAIN_WAIT = 1.0, 0.5, 0.5
MASS_BOUND = MASS_GRACE + MASS_KILL_WAIT + MASS_DRAIN_WAIT + TEARDOWN_ALLOWANCE  # 2.5 s
MASS_LIMIT = MASS_BOUND + TEARDOWN_ALLOWANCE  # the bound plus the documented scheduling noise
STALL_GOAL = 0.020
# On 2 vCPUs the largest points hold their bound in some runs and not in
# others (docs/chaos.md, "Turns": the kill storm, the host's steal): one
# run each would quote a draw. So a full run repeats the points from
# MASS_RUNS_FROM commands up MASS_RUNS times, and every figure of a point
# is its worst run's; --quick runs each point once.
MASS_RUNS_FROM = 1000
MASS_RUNS = 3


class _Point:
    def __init__(self) -> None:
        self.walls: list[float] = []
        self.survivors: list[int] = []
        self.forced = 0
        self.not_empty = 0
        self.not_cancelled = 0
        self.abandoned = 0
        self.teardowns: list[float] = []  # per command: stop step -> receipt written
        self.receipts = 0
        self.errors: list[str] = []

    def record(self, receipt: trio_procown.Receipt | None) -> None:
        if receipt is None:
            self.errors.append("no receipt")
            return
        self.receipts += 1
        self.forced += receipt.forced
        self.not_empty += not receipt.domain_empty
        self.not_cancelled += receipt.cause != "cancelled"
        self.abandoned += receipt.output == "abandoned"
        ph = phases(receipt)
        if "stop" in ph:
            self.teardowns.append(ph["receipt"] - ph["stop"])

    def to_dict(self) -> dict[str, object]:
        return {
            "wall_seconds": Stats.of(self.walls).to_dict(),
            "samples_seconds": self.walls,
            "survivors": self.survivors,
            "receipts": self.receipts,
            "forced": self.forced,
            "not_proved_empty": self.not_empty,
            "cause_not_cancelled": self.not_cancelled,
            "output_abandoned": self.abandoned,
            "per_command_teardown_seconds": Stats.of(self.teardowns).to_dict(),
            "errors": self.errors[:5],
        }


async def _tree_once(cfg: Config, n: int, domain: DomainName, point: _Point) -> None:
    argv = tree_argv(n, fanout=8)
    run: trio_procown.OwnedCommand | None = None
    t0 = None
    with trio.move_on_after(READY_LIMIT) as scope:
        async with trio_procown.open_owned_command(argv, domain=domain, stderr="devnull") as run:
            async for line in run.lines():
                if line.startswith("ready"):
                    break
            t0 = trio.current_time()
            scope.deadline = t0  # the move_on_after fires now
            await trio.sleep_forever()
    t1 = trio.current_time()
    if t0 is None:
        point.errors.append(f"tree {n} never became ready")
        t0 = t1
    point.walls.append(t1 - t0)
    point.survivors.append(count_marked(cfg.marker))
    point.record(run.receipt if run is not None else None)


async def _many_once(cfg: Config, k: int, domain: DomainName, point: _Point) -> None:
    ready = 0
    all_ready = trio.Event()
    runs: list[trio_procown.OwnedCommand] = []

    async def one() -> None:
        nonlocal ready
        async with trio_procown.open_owned_command(GRANDCHILD_CMD, domain=domain, stderr="devnull") as run:
            runs.append(run)
            async for line in run.lines():
                if line.startswith("ready"):
                    break
            ready += 1
            if ready == k:
                all_ready.set()
            await trio.sleep_forever()

    t0 = None
    with trio.move_on_after(READY_LIMIT) as scope:
        async with trio.open_nursery() as nursery:
            for _ in range(k):
                nursery.start_soon(one)
            await all_ready.wait()
            t0 = trio.current_time()
            scope.deadline = t0  # every command is cancelled together, now
    t1 = trio.current_time()
    if t0 is None:
        point.errors.append(f"only {ready} of {k} commands became ready")
        t0 = t1
    point.walls.append(t1 - t0)
    point.survivors.append(count_marked(cfg.marker))
    for run in runs:
        point.record(run.receipt)


class _MassPoint:
    """One mass-teardown point (K commands cancelled together)."""

    def __init__(self) -> None:
        self.walls: list[float] = []  # cancel -> the last block returned
        self.slowest: list[float] = []  # the slowest block: cancel -> its end
        self.over: list[int] = []  # blocks that ended past MASS_BOUND
        self.stalls: list[float] = []  # longest gap between two loop wakeups
        self.stall_cpu: list[float] = []  # the loop thread's CPU time in that gap
        self.stall_wait: list[float] = []  # the loop thread's wait for a CPU in that gap
        self.busiest: list[float] = []  # the most CPU time the loop thread spent in any gap
        self.survivors: list[int] = []
        self.spawn: list[float] = []  # start -> every command ready
        # The machine's CPU from the cancel to the last return, one per run (None: never cancelled).
        self.cpu: list[_CpuUse | None] = []
        self.forced = 0
        self.not_empty = 0
        self.receipts = 0
        self.errors: list[str] = []

    def to_dict(self) -> dict[str, object]:
        return {
            "wall_seconds": self.walls,
            "slowest_block_seconds": self.slowest,
            "blocks_over_limit": self.over,
            "max_loop_stall_seconds": self.stalls,
            "loop_cpu_in_max_stall_seconds": self.stall_cpu,
            "loop_cpu_wait_in_max_stall_seconds": self.stall_wait,
            "max_loop_cpu_in_a_gap_seconds": self.busiest,
            "survivors": self.survivors,
            "ready_seconds": self.spawn,
            "cpu_in_teardown": [None if c is None else c.to_dict() for c in self.cpu],
            "receipts": self.receipts,
            "forced": self.forced,
            "not_proved_empty": self.not_empty,
            "bound_seconds": MASS_BOUND,
            "limit_seconds": MASS_LIMIT,
            "errors": self.errors[:5],
        }


def _schedstat() -> int | None:
    """A descriptor of this thread's scheduler statistics (None: not offered)."""
    try:
        return os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _run_delay(fd: int | None) -> float:
    """How long the thread of `fd` (see _schedstat) has waited for a CPU
    while runnable, in seconds (the second field); NaN where it cannot be read."""
    if fd is None:
        return float("nan")
    try:
        return int(os.pread(fd, 256, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


class _StallWatch:
    """The longest time the event loop went without scheduling a task that
    loops on trio.sleep(0): any synchronous stretch of the loop shows there.
    And what the loop's thread spent on a CPU meanwhile (its thread CPU
    time, user and system): in that gap (`longest_cpu`), and the most in any
    gap (`busiest`, the longest stretch of the loop's own work: trio's and
    the tasks' steps). A gap far longer than its CPU is the loop's thread
    not working: `longest_wait` is how much of the gap it was runnable and
    waiting for a CPU (the kernel's run-queue delay); what is left of the
    gap it slept (waiting for the interpreter lock, say)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_cpu = 0.0
        self.longest_wait = float("nan")
        self.busiest = 0.0

    async def run(self) -> None:
        stats = _schedstat()  # (opened by the loop's thread: its own statistics)
        try:
            last = time.perf_counter()
            last_cpu = time.thread_time()
            last_wait = _run_delay(stats)
            while True:
                await trio.sleep(0)
                now = time.perf_counter()
                cpu = time.thread_time()
                wait = _run_delay(stats)
                if now - last > self.longest:
                    self.longest, self.longest_cpu = now - last, cpu - last_cpu
                    self.longest_wait = wait - last_wait
                self.busiest = max(self.busiest, cpu - last_cpu)
                last, last_cpu, last_wait = now, cpu, wait
        finally:
            if stats is not None:
                os.close(stats)


async def _pid1_reaped(limit: float = 10.0) -> None:
    """Wait (at most `limit`) until no zombie is left waiting for PID 1."""
    with trio.move_on_after(limit):
        while True:
            waiting = 0
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        fields = f.read().rpartition(b") ")[2].split(b" ", 2)
                except OSError:
                    continue
                waiting += fields[0] == b"Z" and fields[1] == b"1"
            if not waiting:
                return
            await trio.sleep(0.25)


async def _mass_once(cfg: Config, k: int, domain: DomainName, point: _MassPoint) -> None:
    ready = 0
    all_ready = trio.Event()
    runs: list[trio_procown.OwnedCommand] = []
    ends: list[float] = []
    t0: float | None = None
    # Runs from just before the cancel until the last block returned.
    watch = _StallWatch()
    cpu: _CpuUse | None = None

    async def one() -> None:
        nonlocal ready
        try:
            async with trio_procown.open_owned_command(
                MASS_CMD,
                domain=domain,
                stderr="devnull",
                grace=MASS_GRACE,
                kill_wait=MASS_KILL_WAIT,
                drain_wait=MASS_DRAIN_WAIT,
            ) as run:
                runs.append(run)
                async for line in run.lines():
                    if line.startswith("ready"):
                        break
                ready += 1
                if ready == k:
                    all_ready.set()
                await trio.sleep_forever()
        finally:
            ends.append(trio.current_time())

    started = trio.current_time()
    async with trio.open_nursery() as outer:
        with trio.move_on_after(READY_LIMIT + k * 0.02) as scope:
            async with trio.open_nursery() as nursery:
                for _ in range(k):
                    nursery.start_soon(one)
                await all_ready.wait()
                point.spawn.append(trio.current_time() - started)
                outer.start_soon(watch.run)
                await trio.sleep(0)  # the watcher is running before the cancel
                cpu = _CpuUse()
                t0 = trio.current_time()
                scope.deadline = t0  # every command is cancelled together, now
        t1 = trio.current_time()
        point.cpu.append(None if cpu is None else cpu.stop())  # one per run, as walls
        outer.cancel_scope.cancel()
    if t0 is None or len(ends) < k:
        point.errors.append(f"{k} {domain}: only {ready} of {k} commands became ready")
        t0 = t1 if t0 is None else t0
    point.walls.append(t1 - t0)
    slowest = max((e - t0 for e in ends), default=float("nan"))
    point.slowest.append(slowest)
    point.over.append(sum(e - t0 > MASS_BOUND for e in ends))
    point.stalls.append(watch.longest)
    point.stall_cpu.append(watch.longest_cpu)
    point.stall_wait.append(watch.longest_wait)
    point.busiest.append(watch.busiest)
    point.survivors.append(count_marked(cfg.marker))
    for run in runs:
        receipt = run.receipt
        if receipt is None:
            point.errors.append("no receipt")
            continue
        point.receipts += 1
        point.forced += receipt.forced
        point.not_empty += not receipt.domain_empty
    await _clean(cfg)
    await _pid1_reaped()


async def _bare_cancel_stall(k: int) -> float:
    """trio's own floor for the stall: K tasks that each wait, cancelled
    together by one scope, each then waiting in a shielded scope (as an
    owned block waits for its teardown) until released. The longest gap
    between two wakeups of a task looping on trio.sleep(0)."""
    watch = _StallWatch()

    async def one(release: trio.Event) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await release.wait()

    async def let_go(release: trio.Event) -> None:
        with trio.CancelScope(shield=True):
            for _ in range(3):  # the cancelled tasks have all run by then
                await trio.sleep(0)
            release.set()

    release = trio.Event()
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            for _ in range(k):
                nursery.start_soon(one, release)
            await trio.sleep(0.1)
            outer.start_soon(watch.run)
            await trio.sleep(0)
            nursery.cancel_scope.cancel()
            outer.start_soon(let_go, release)
        outer.cancel_scope.cancel()
    return watch.longest


def _in_longest(point: _MassPoint, per_run: list[float]) -> float:
    """`per_run`'s figure (one per run, as point.stalls) for the point's
    longest stall (its worst run's): the loop thread's CPU time in it, or
    its wait for a CPU."""
    if not point.stalls:
        return float("nan")
    return per_run[point.stalls.index(max(point.stalls))]


class _CpuUse:
    """Where the machine's CPU time went between two readings: every CPU's
    busy time (user, nice, system, irq, softirq), idle time (idle and
    iowait), time the host took (steal) from /proc/stat, and this process's
    own CPU time (getrusage: every thread, user and system), in seconds.
    NaN where /proc/stat cannot be read (not Linux)."""

    def __init__(self) -> None:
        self._machine = self._read_machine()
        self._ours = self._read_ours()
        self.busy = self.idle = self.steal = self.ours = float("nan")

    @staticmethod
    def _read_machine() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", "rb") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
            tick = float(os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError):
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = fields
        return (user + nice + system + irq + softirq) / tick, (idle + iowait) / tick, steal / tick

    @staticmethod
    def _read_ours() -> float:
        use = resource.getrusage(resource.RUSAGE_SELF)
        return use.ru_utime + use.ru_stime

    def stop(self) -> _CpuUse:
        """Take the second reading; the fields are now the differences."""
        machine, ours = self._read_machine(), self._read_ours()
        if self._machine is not None and machine is not None:
            self.busy, self.idle, self.steal = (b - a for a, b in zip(self._machine, machine, strict=True))
        self.ours = ours - self._ours
        return self

    @property
    def busy_share(self) -> float:
        """The machine's busy share of the CPU time it had (steal left out)."""
        total = self.busy + self.idle
        return self.busy / total if total > 0 else float("nan")

    def to_dict(self) -> dict[str, float]:
        return {
            "machine_busy_cpu_seconds": self.busy,
            "machine_idle_cpu_seconds": self.idle,
            "steal_seconds": self.steal,
            "our_process_cpu_seconds": self.ours,
        }


def _worst(values: list[float]) -> float:
    """The largest of `values` that is a number; NaN if none is."""
    return max((v for v in values if v == v), default=float("nan"))


class _Storm:
    """One run of the kill storm floor: its longest loop stall, the time
    from the first signal until every leader was reaped, and the machine's
    CPU meanwhile (NaN, None: the trees were not all ready in time)."""

    def __init__(self, stall: float, reaped: float, cpu: _CpuUse | None) -> None:
        self.stall = stall
        self.reaped = reaped
        self.cpu = cpu

    def to_dict(self) -> dict[str, object]:
        return {
            "max_loop_stall_seconds": self.stall,
            "all_reaped_seconds": self.reaped,
            "cpu": None if self.cpu is None else self.cpu.to_dict(),
        }


async def _storm_floor(cfg: Config, k: int) -> _Storm:
    """The kill storm's floor for the stall: the same K trees with no
    library, as plain trio runs them (each started by
    trio.lowlevel.open_process in a session of its own, its "ready" read
    from a pipe), then every group sent SIGTERM by killpg from one worker
    thread (as the library's signaller does) and every leader awaited
    (Process.wait) once they are all signalled. The longest gap between two
    wakeups of a task looping on trio.sleep(0) from the first signal until
    every leader is reaped: what the loop's thread gets of the CPU while
    10,000 processes die, before any census, receipt or drain. The leaders
    are reaped only after the signals, so no killpg can reach a recycled
    group. Also the time from the first signal until every leader was
    reaped, and the machine's CPU meanwhile: what the kill itself costs
    here, before any census, receipt or drain (its orphans may still be
    dying then). NaN if the trees were not all ready in time."""
    watch = _StallWatch()
    procs: list[trio.Process] = []
    ready = 0
    all_ready, signalled = trio.Event(), trio.Event()

    async def one() -> None:
        nonlocal ready
        proc = await trio.lowlevel.open_process(
            ["sh", "-c", MASS_CMD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
        procs.append(proc)
        assert proc.stdout is not None
        seen = b""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(READY_LIMIT):
                while b"ready" not in seen:
                    chunk = await proc.stdout.receive_some()
                    if not chunk:
                        break
                    seen += chunk
            ready += 1
            if ready == k:
                all_ready.set()
            await signalled.wait()
            await proc.wait()
            await proc.stdout.aclose()

    def signal_all() -> None:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass

    longest = float("nan")
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            for _ in range(k):
                nursery.start_soon(one)
            with trio.move_on_after(READY_LIMIT + k * 0.02):
                await all_ready.wait()
            if all_ready.is_set():
                outer.start_soon(watch.run)
                await trio.sleep(0)  # the watcher is running before the first signal
            cpu = _CpuUse()
            t0 = trio.current_time()
            await trio.to_thread.run_sync(signal_all)
            signalled.set()
        reaped = trio.current_time() - t0
        cpu.stop()
        if all_ready.is_set():
            longest = watch.longest
        outer.cancel_scope.cancel()
    await _clean(cfg)
    await _pid1_reaped()
    if not all_ready.is_set():
        return _Storm(float("nan"), float("nan"), None)
    return _Storm(longest, reaped, cpu)


def _cpu_table(mass: dict[tuple[int, DomainName], _MassPoint], storms: dict[int, list[_Storm]]) -> Table:
    """Where the machine's CPU time went in each point's slowest run, from
    the cancel to the last return, beside plain trio's kill storm of the
    same K trees (its slowest run)."""

    def pct(x: float) -> str:
        return "" if x != x else f"{100 * x:.0f} %"

    rows = []
    for (k, d), p in mass.items():
        if not p.walls:
            continue
        slowest = max(range(len(p.walls)), key=lambda i: p.walls[i])
        use = p.cpu[slowest]
        if use is None:
            continue
        ran = [f for f in storms.get(k, []) if f.cpu is not None]
        storm = max(ran, key=lambda f: f.reaped) if ran else None
        rows.append(
            [
                str(k),
                d,
                ms(p.walls[slowest]),
                pct(use.busy_share),
                ms(use.busy),
                ms(use.ours),
                ms(use.busy - use.ours),
                ms(use.steal),
                ms(storm.reaped) if storm else "",
                ms(storm.cpu.busy) if storm and storm.cpu else "",
                pct(storm.cpu.busy_share) if storm and storm.cpu else "",
            ]
        )
    return Table(
        [
            "commands",
            "domain",
            "all returned ms",
            "machine busy",
            "all CPUs' busy time ms",
            "our process's CPU ms",
            "everything else's CPU ms",
            "steal ms",
            "plain trio's kill storm: all leaders reaped ms",
            "its CPUs' busy time ms",
            "its machine busy",
        ],
        rows,
        caption="Where the CPU went during each mass teardown (the point's slowest run), from the cancel "
        "to the last return: the machine's busy share of the CPU time it had (/proc/stat: user, nice, "
        "system, irq and softirq against idle and iowait, on every CPU), that busy time, this process's "
        "own CPU time (every thread, user and system: the loop, the signaller, the scanner), the rest "
        "(the dying processes' exits, the kernel's workers, PID 1's reaping), and the time the host "
        "took from the VM (steal). Beside it, plain trio's kill storm of the same K trees (no census, "
        "receipt or drain; its slowest run): the time from its first signal until every leader was "
        "reaped, and the CPU time it kept the machine busy.",
    )


def _mass_runs(cfg: Config, k: int) -> int:
    """How many times the mass-teardown point of `k` commands runs."""
    return MASS_RUNS if not cfg.quick and k >= MASS_RUNS_FROM else 1


async def _mass(cfg: Config, section: Section, domains: list[DomainName]) -> None:
    counts = cfg.pick([20, 50], [250, 500, 1000, 2000])
    mass = {(k, d): _MassPoint() for k in counts for d in domains}
    floors: dict[int, float] = {}
    storms: dict[int, list[_Storm]] = {}
    for k in counts:
        floors[k] = await _bare_cancel_stall(k)
        print(f"[benchmarks] scaling: kill storm floor of {k} trees ...", file=sys.stderr, flush=True)
        storms[k] = [await _storm_floor(cfg, k) for _ in range(_mass_runs(cfg, k))]
        for d in domains:
            print(
                f"[benchmarks] scaling: mass teardown of {k} commands ({d}) ...", file=sys.stderr, flush=True
            )
            for _ in range(_mass_runs(cfg, k)):
                await _mass_once(cfg, k, d, mass[(k, d)])
    section.tables.append(
        Table(
            [
                "commands",
                "processes",
                "domain",
                "all returned ms",
                "slowest block ms",
                f"blocks past {MASS_BOUND:g} s",
                "runs with a block past it",
                "survivors",
                "longest loop stall ms",
                "loop's CPU in it ms",
                "its wait for a CPU in it ms",
                "most loop CPU in a gap ms",
                "trio's floor: stall of a bare cancel ms",
                "kill storm floor: stall of plain trio ms",
                "forced",
                "not proved empty",
                "ready after s",
            ],
            [
                [
                    str(k),
                    str(5 * k),
                    d,
                    ms(max(p.walls, default=float("nan"))),
                    ms(max(p.slowest, default=float("nan"))),
                    f"{max(p.over, default=0)}/{k}",
                    f"{sum(o > 0 for o in p.over)}/{len(p.over)}",
                    str(max(p.survivors, default=0)),
                    ms(max(p.stalls, default=float("nan"))),
                    ms(_in_longest(p, p.stall_cpu)),
                    ms(_in_longest(p, p.stall_wait)),
                    ms(max(p.busiest, default=float("nan"))),
                    ms(floors[k]),
                    ms(_worst([f.stall for f in storms[k]])),
                    f"{p.forced}/{p.receipts}",
                    str(p.not_empty),
                    f"{max(p.spawn, default=float('nan')):.1f}",
                ]
                for (k, d), p in mass.items()
            ],
            caption=f"Mass teardown (issue 16): K commands, each `sh -c '{MASS_CMD}'` (5 processes), "
            f"grace {MASS_GRACE:g} s, kill_wait {MASS_KILL_WAIT:g} s, drain_wait {MASS_DRAIN_WAIT:g} s, "
            f"cancelled together by one scope. Each block's bound is {MASS_BOUND:g} s (the budgets plus "
            f"the teardown's allowance, {TEARDOWN_ALLOWANCE:g} s); with the documented scheduling noise "
            f"(one more allowance), {MASS_LIMIT:g} s. Longest loop stall: the longest "
            "gap between two wakeups of a task looping on trio.sleep(0) during the teardown; loop's CPU in it: the CPU time "
            "(user and system) the loop's thread had in that gap; its wait for a CPU: how long in that gap "
            "it was runnable but not running (the kernel's run-queue delay, from /proc/thread-self/schedstat: "
            "on a 2-vCPU machine, behind the dying processes); most loop CPU in a gap: the longest "
            "stretch of the loop's own work (trio's and every task's steps between two wakeups); trio's floor: "
            "the same measure when K bare trio tasks, each waiting, are cancelled together by one scope and "
            "each waits once more in a shielded scope (what trio's scheduler costs before any teardown "
            "work); kill storm floor: the same measure when plain trio, with no library, has started the "
            "same K trees (trio.lowlevel.open_process, a session each), sends each group SIGTERM by killpg "
            "from one worker thread and awaits every leader, run as many times as each domain's point "
            "(its worst run): what the loop gets of the machine while the K trees die. "
            + (
                f"Points of {MASS_RUNS_FROM:,} commands and more ran {MASS_RUNS} times each, the others once; "
                "every figure of a point is its worst run's (forced and not proved empty: over all its runs)."
                if any(_mass_runs(cfg, k) > 1 for k in counts)
                else "One run per point."
            ),
        )
    )
    section.tables.append(_cpu_table(mass, storms))
    for p in mass.values():
        section.notes += p.errors

    def series(pick: Callable[[_MassPoint], float]) -> dict[str, list[tuple[float, float, float]]]:
        out: dict[str, list[tuple[float, float, float]]] = {}
        for (k, d), p in mass.items():
            out.setdefault(f"trio_procown {d}", []).append(
                (float(k), pick(p) * 1e3, float(max(p.survivors, default=0)))
            )
        return out

    _plots.save(
        section,
        cfg,
        "mass_teardown.png",
        "Mass teardown: time until all returned, and survivors, against concurrent commands",
        _plots.growth(
            "K commands (5 processes each) cancelled together: cancel -> all returned, processes left",
            "concurrent commands (log)",
            series(lambda p: max(p.walls, default=float("nan"))),
            ours=lambda label: True,
            ylabel="cancel -> all returned (ms, log)",
            note=f"grace {MASS_GRACE:g} s, kill_wait {MASS_KILL_WAIT:g} s, drain_wait {MASS_DRAIN_WAIT:g} s; "
            f"bound per block {MASS_BOUND:g} s ({MASS_LIMIT:g} s with the documented noise).",
        ),
    )
    _plots.save(
        section,
        cfg,
        "mass_teardown_stall.png",
        "Mass teardown: longest event-loop stall against concurrent commands",
        _plots.growth(
            "K commands cancelled together: longest gap between two event-loop wakeups",
            "concurrent commands (log)",
            {
                **series(lambda p: max(p.stalls, default=float("nan"))),
                "trio: bare cancel of K tasks (floor)": [(float(k), f * 1e3, 0.0) for k, f in floors.items()],
                "plain trio: killpg of K trees from a thread (kill storm floor)": [
                    (float(k), _worst([run.stall for run in f]) * 1e3, 0.0) for k, f in storms.items()
                ],
            },
            ours=lambda label: label.startswith("trio_procown"),
            note=f"goal: <= {STALL_GOAL * 1e3:g} ms. Bottom panel: processes left.",
            ylabel="longest event-loop stall (ms, log)",
        ),
    )
    points = list(mass.values())
    section.target(
        "mass teardown: survivors over all points",
        float(sum(max(p.survivors, default=0) for p in points)),
        0.0,
        "processes",
    )
    section.target(
        f"mass teardown: blocks past their {MASS_BOUND:g} s bound (all points)",
        float(sum(max(p.over, default=0) for p in points)),
        0.0,
        "blocks",
    )
    section.target(
        "mass teardown: slowest block vs its bound + documented noise",
        max((max(p.slowest, default=0.0) for p in points), default=0.0),
        MASS_LIMIT,
        "s",
    )
    section.target(
        "mass teardown: longest event-loop stall",
        max((max(p.stalls, default=0.0) for p in points), default=0.0),
        STALL_GOAL,
        "s",
    )
    biggest = max(counts)
    smallest = min(counts)
    for d in domains:
        lo, hi = mass[(smallest, d)], mass[(biggest, d)]
        per_lo = max(lo.walls, default=float("nan")) / smallest
        per_hi = max(hi.walls, default=float("nan")) / biggest
        # Linear: the cost per command at the largest K is at most twice that
        # at the smallest (a quadratic cost would grow by K_max / K_min).
        section.target(
            f"mass teardown ({d}): cost per command at K={biggest} vs K={smallest}",
            per_hi / per_lo if per_lo > 0 else float("nan"),
            2.0,
            "x",
        )
    section.data["mass"] = {f"{k} {d}": p.to_dict() for (k, d), p in mass.items()}
    section.data["mass_bare_cancel_stall_seconds"] = {str(k): f for k, f in floors.items()}
    section.data["mass_storm_floor_stall_seconds"] = {str(k): [f.stall for f in v] for k, v in storms.items()}
    section.data["mass_storm_floor_runs"] = {str(k): [f.to_dict() for f in v] for k, v in storms.items()}


PEER_KEYS = ("subprocess.run", "trio", "anyio", "adk")
PEER_TREE_DEADLINE = 0.5


class _PeerPoint:
    def __init__(self) -> None:
        self.late: list[float] = []  # seconds from the deadline to the last return
        self.left: list[int] = []
        self.errors: list[str] = []

    def to_dict(self) -> dict[str, object]:
        return {
            "past_deadline_seconds": Stats.of(self.late).to_dict(),
            "samples_seconds": self.late,
            "left": self.left,
            "errors": self.errors[:3],
        }


async def _clean(cfg: Config) -> None:
    """Kill what a peer left (by the benchmark marker) and wait until gone."""
    for _ in range(100):
        if not kill_marked(cfg.marker):
            return
        await trio.sleep(0.02)


async def _peer_batch(
    peer: Peer, commands: list[Command], deadline: float, loop: asyncio.AbstractEventLoop
) -> float:
    """Run every command through `peer`, all due at the absolute
    time.perf_counter() `deadline`; return the time of the last return."""
    if peer.kind == "trio":
        call = call_async(peer)

        async def one(command: Command) -> None:
            await call(command, max(deadline - time.perf_counter(), 0.0))

        async with trio.open_nursery() as nursery:
            for command in commands:
                nursery.start_soon(one, command)
        return time.perf_counter()
    if peer.kind == "asyncio":

        async def gather() -> None:
            coros = []
            for command in commands:
                coros.append(peer.call(command, max(deadline - time.perf_counter(), 0.0)))
            await asyncio.gather(*coros)

        loop.run_until_complete(gather())
        return time.perf_counter()
    blocking = call_blocking(peer, None)
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        futures = [
            pool.submit(lambda c: blocking(c, max(deadline - time.perf_counter(), 0.0)), c) for c in commands
        ]
        for f in futures:
            f.result()
    return time.perf_counter()


async def _peer_once(
    cfg: Config,
    peer: Peer,
    commands: list[Command],
    budget: float,
    loop: asyncio.AbstractEventLoop,
    point: _PeerPoint,
) -> None:
    deadline = time.perf_counter() + budget
    try:
        end = await _peer_batch(peer, commands, deadline, loop)
        point.late.append(end - deadline)
    except Exception as exc:
        point.errors.append(f"{peer.key}: {exc!r}")
    point.left.append(count_marked(cfg.marker))
    await _clean(cfg)


async def _peers(
    cfg: Config, section: Section
) -> tuple[dict[tuple[str, int], _PeerPoint], dict[tuple[str, int], _PeerPoint]]:
    sizes = cfg.pick([50], [1, 10, 50, 200])
    counts = cfg.pick([100], [10, 100, 500])
    reps = cfg.pick(1, 2)
    peers = []
    for key in PEER_KEYS:
        peer = BY_KEY[key]
        why = missing_module(peer)
        if why:
            section.notes.append(
                f"peer `{peer.label}` skipped: {why} is not installed ({_plots.INSTALL_HINT})"
            )
        else:
            peers.append(peer)
    trees = {(p.key, n): _PeerPoint() for p in peers for n in sizes}
    many = {(p.key, k): _PeerPoint() for p in peers for k in counts}
    loop = asyncio.new_event_loop()
    try:
        for r in range(reps):
            order = peers if r % 2 == 0 else peers[::-1]
            for n in sizes:
                for p in order:
                    await _peer_once(
                        cfg, p, [tree_argv(n, fanout=8)], PEER_TREE_DEADLINE, loop, trees[(p.key, n)]
                    )
            for k in counts:
                for p in order:
                    await _peer_once(cfg, p, [GRANDCHILD_CMD] * k, 0.5 + 0.004 * k, loop, many[(p.key, k)])
    finally:
        loop.close()
    return trees, many


async def run(cfg: Config) -> Section:
    section = Section(
        "scaling",
        "5. Teardown scaling",
        "Teardown wall time from an outer trio.move_on_after firing to the block's end; "
        "survivors = live processes carrying the benchmark marker right after.",
    )
    domains = usable_domains()
    sizes = cfg.pick([1, 50], [1, 10, 50, 200])
    counts = cfg.pick([10, 100], [10, 100, 500])
    reps = cfg.pick(1, 3)
    reps_many = cfg.pick(1, 2)

    trees = {(n, d): _Point() for n in sizes for d in domains}
    many = {(k, d): _Point() for k in counts for d in domains}
    for r in range(reps):
        for n in sizes:
            order = domains if r % 2 == 0 else domains[::-1]
            for d in order:
                await _tree_once(cfg, n, d, trees[(n, d)])
    for r in range(reps_many):
        for k in counts:
            order = domains if r % 2 == 0 else domains[::-1]
            for d in order:
                await _many_once(cfg, k, d, many[(k, d)])

    headers = [
        "domain",
        "teardown median ms",
        "min ms",
        "max ms",
        "slowest command stop→receipt ms",
        "survivors (max)",
        "forced",
        "not proved empty",
        "output abandoned",
        "cause ≠ cancelled",
    ]

    def row(label: str, d: str, p: _Point) -> list[str]:
        st = Stats.of(p.walls)
        over = " (over the documented bound)" if st.max > DOCUMENTED_BOUND else ""
        return [
            label,
            d,
            ms(st.median),
            ms(st.min),
            ms(st.max) + over,
            ms(max(p.teardowns, default=float("nan"))),
            str(max(p.survivors, default=0)),
            f"{p.forced}/{p.receipts}",
            str(p.not_empty),
            str(p.abandoned),
            str(p.not_cancelled),
        ]

    t_tree = Table(
        ["descendants", *headers],
        [row(str(n), d, p) for (n, d), p in trees.items()],
        caption=f"{reps} repetition(s) per point, fan-out 8.",
    )
    t_many = Table(
        ["commands", *headers],
        [row(str(k), d, p) for (k, d), p in many.items()],
        caption=f"{reps_many} repetition(s) per point; each command is `sh -c '{GRANDCHILD_CMD}'`. "
        f"Documented teardown bound (DESIGN.md §3, default budgets): {DOCUMENTED_BOUND:g} s plus scheduling noise.",
    )
    section.tables += [t_tree, t_many]
    await _mass(cfg, section, domains)

    peer_trees, peer_many = await _peers(cfg, section)
    peer_headers = ["peer", "past the deadline: median ms", "min ms", "max ms", "processes left (max)"]

    def peer_row(label: str, key: str, p: _PeerPoint) -> list[str]:
        st = Stats.of(p.late)
        return [label, BY_KEY[key].label, ms(st.median), ms(st.min), ms(st.max), str(max(p.left, default=0))]

    section.tables.append(
        Table(
            ["descendants", *peer_headers],
            [peer_row(str(n), key, p) for (key, n), p in sorted(peer_trees.items(), key=lambda kv: kv[0][1])],
            caption=f"Peers on the same trees, deadline {PEER_TREE_DEADLINE:g} s; time from the deadline to the "
            "return; processes left right after the return (then killed).",
        )
    )
    section.tables.append(
        Table(
            ["commands", *peer_headers],
            [peer_row(str(k), key, p) for (key, k), p in sorted(peer_many.items(), key=lambda kv: kv[0][1])],
            caption="Peers on K concurrent commands sharing one deadline (0.5 s + 4 ms per command after the "
            "first call); time from the deadline to the last return. The communicate and asyncio recipes are "
            "not run here: they never return while a descendant holds the pipes (section 6).",
        )
    )
    for pp in list(peer_trees.values()) + list(peer_many.values()):
        section.notes += pp.errors

    def series(
        ours: dict[tuple[int, DomainName], _Point], theirs: dict[tuple[str, int], _PeerPoint]
    ) -> dict[str, list[tuple[float, float, float]]]:
        out: dict[str, list[tuple[float, float, float]]] = {}
        for (x, d), p in ours.items():
            out.setdefault(f"trio_procown {d} (from the cancel)", []).append(
                (float(x), Stats.of(p.walls).median * 1e3, float(max(p.survivors, default=0)))
            )
        for (key, x), pp in theirs.items():
            out.setdefault(BY_KEY[key].label, []).append(
                (float(x), Stats.of(pp.late).median * 1e3, float(max(pp.left, default=0)))
            )
        return out

    def is_ours(label: str) -> bool:
        return label.startswith("trio_procown")

    _plots.save(
        section,
        cfg,
        "teardown_vs_tree.png",
        "Teardown time and processes left against tree size",
        _plots.growth(
            "One command whose leader has N descendants: time to return, processes left",
            "descendants (log)",
            series(trees, peer_trees),
            ours=is_ours,
            note="trio_procown: from an outer cancel once the tree is ready; peers: from their own 0.5 s deadline.",
        ),
    )
    _plots.save(
        section,
        cfg,
        "teardown_vs_concurrency.png",
        "Teardown time and processes left against concurrent commands",
        _plots.growth(
            "K concurrent `sh -c 'sleep 600 & echo ready; wait'`: time until all returned, processes left",
            "concurrent commands (log)",
            series(many, peer_many),
            ours=is_ours,
            note="trio_procown: from one outer cancel of all K; peers: from one shared deadline.",
        ),
    )
    all_points = list(trees.values()) + list(many.values())
    total_survivors = sum(max(p.survivors, default=0) for p in all_points)
    section.target("survivors over all scaling points", float(total_survivors), 0.0, "processes")
    worst = max((max(p.walls, default=0.0) for p in many.values()), default=0.0)
    section.target("slowest concurrent teardown vs documented bound", worst, DOCUMENTED_BOUND, "s")
    for p in all_points:
        for e in p.errors:
            section.notes.append(e)
    # update, not replace: _mass() stored its points under "mass" already.
    section.data.update(
        {
            "tree": {f"{n} {d}": p.to_dict() for (n, d), p in trees.items()},
            "concurrent": {f"{k} {d}": p.to_dict() for (k, d), p in many.items()},
            "peers_tree": {f"{n} {key}": p.to_dict() for (key, n), p in peer_trees.items()},
            "peers_concurrent": {f"{k} {key}": p.to_dict() for (key, k), p in peer_many.items()},
            "peer_labels": {key: BY_KEY[key].label for key in PEER_KEYS},
        }
    )
    return section
