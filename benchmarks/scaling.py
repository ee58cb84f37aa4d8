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
# After each point we count live processes carrying the benchmark marker
# (survivors; must be 0) and summarise the receipts (forced, not proved
# empty). --quick runs two points of each.
#
# Why: the per-command teardown scans the process table; with many
# processes alive at once, a cost that is linear per command becomes
# quadratic in total. This shows whether teardown stays bounded.

from __future__ import annotations

import trio

import trio_procown

from ._harness import Config, DomainName, Section, Stats, Table, count_marked, ms, usable_domains
from ._trees import phases, tree_argv

READY_LIMIT = 60.0
# DESIGN.md section 3: the teardown is bounded by grace + kill_wait +
# drain_wait (defaults 2 + 1 + 0.5 s) "plus scheduling noise".
DOCUMENTED_BOUND = 3.5
GRANDCHILD_CMD = "sleep 600 & echo ready; wait"


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
    all_points = list(trees.values()) + list(many.values())
    total_survivors = sum(max(p.survivors, default=0) for p in all_points)
    section.target("survivors over all scaling points", float(total_survivors), 0.0, "processes")
    worst = max((max(p.walls, default=0.0) for p in many.values()), default=0.0)
    section.target("slowest concurrent teardown vs documented bound", worst, DOCUMENTED_BOUND, "s")
    for p in all_points:
        for e in p.errors:
            section.notes.append(e)
    section.data = {
        "tree": {f"{n} {d}": p.to_dict() for (n, d), p in trees.items()},
        "concurrent": {f"{k} {d}": p.to_dict() for (k, d), p in many.items()},
    }
    return section
