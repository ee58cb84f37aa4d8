# Scenario 10: returning after a deadline, whole processes: `procown run
# --timeout 1 -- sh -c 'sleep 9 & sleep 9'` against GNU `timeout 1 sh -c
# 'sleep 9 & sleep 9'` (issue 16: goal <= +20 ms over GNU timeout).
#
# What it measures: the wall time from starting each whole process to its
# exit, interleaved in the same (shuffled) rounds, each child with cached
# bytecode (as startup.py: PYTHONPYCACHEPREFIX in a private directory,
# filled by a warm-up), stdout/stderr to /dev/null. The reported figure is
# the difference of the medians, procown - GNU timeout, and the median of
# the per-round differences. GNU timeout runs twice: by default (it makes
# itself a process-group leader and signals the whole group, so the
# backgrounded `sleep 9` is ended too) and with --foreground (it signals its
# child only: the shell dies, both sleeps live on). Each sample carries a
# tag of its own in its environment; 0.1 s after the exit we count the live
# processes with that tag (survivors) and SIGKILL them by verified pidfd.
# Beside them, `python -c pass`: the start and exit of the interpreter
# alone, the floor of any command line written in Python.
#
# Where procown's extra time goes: a few more runs of the same command
# through a driver that runs procown's own main() in the same way as the
# console script, stamping CLOCK_MONOTONIC (system-wide, so comparable with
# the parent's stamps) at its first line, after `import trio_procown._cli`,
# around open_owned_command (wrapped, not changed) and after main()
# returns; the parent stamps the start and the exit. The phases:
# interpreter start, import, setup up to open_owned_command, spawn, the
# timeout itself, deadline -> owned block left (the teardown; the receipt's
# steps split it), block left -> main() returned (forwarding done, trio.run
# shut down), main() returned -> exit seen (the keeper's goodbye and
# os._exit, as the console script ends). And
# `python -X importtime -c "import trio_procown._cli"`: the biggest imports.
# Two counts give the context of a profile run: the processes on the
# machine and the pids allocated during the run (a teardown scans /proc
# narrowly only while few pids were allocated since its spawn, so a busy
# machine makes it slower).
#
# Returning after the deadline. The whole-process time includes each
# tool's start-up (procown's is Python's and trio's import, ~0.2 s, measured
# on its own in scenario 8), so the figure the target is about is the time
# from the deadline to the exit the caller sees: the command's first act
# writes its wall-clock start (`date +%s.%N` to a per-sample file), the
# deadline is that + T, and the parent takes the wall clock when the
# process has exited. Both tools run the same script, so the stamp's own
# cost (one `date`) is on both sides.
#
# Target (printed, not asserted): deadline -> exit, procown - GNU timeout
# <= +20 ms.

from __future__ import annotations

import ast
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from ._harness import (
    Config,
    Measure,
    Section,
    Stats,
    Table,
    interleaved,
    kill_marked,
    marked_processes,
    ms,
    paired_differences,
)
from .startup import _child_env, _procown_argv

TARGET = 0.020  # s over GNU timeout
T = 1
SCRIPT = "sleep 9 & sleep 9"
STAMP_VAR = "BENCH_CLI_STAMP"
TIMED_SCRIPT = f'date +%s.%N >"${STAMP_VAR}"; {SCRIPT}'
TAG_VAR = "BENCH_CLI_TAG"
PROCOWN = f"procown run --timeout {T} -- sh -c '{SCRIPT}'"
GNU = f"timeout {T} sh -c '{SCRIPT}'"
GNU_FG = f"timeout --foreground {T} sh -c '{SCRIPT}'"
FLOOR = 'python -c "pass" (no deadline)'

DRIVER = r"""
import time
t1 = time.monotonic()
import sys
import trio_procown._cli as cli
t2 = time.monotonic()
import contextlib
marks = {"t1": t1, "t2": t2}
original = cli.open_owned_command

@contextlib.asynccontextmanager
async def timed(*args, **kwargs):
    marks["enter"] = time.monotonic()
    run = None
    try:
        async with original(*args, **kwargs) as run:
            marks["inside"] = time.monotonic()
            yield run
    finally:
        marks["left"] = time.monotonic()
        if run is not None and run.receipt is not None:
            marks["steps"] = [(str(getattr(s.action, "value", s.action)), str(s.outcome), s.at) for s in run.receipt.steps]

cli.open_owned_command = timed
rc = cli.main(sys.argv[2:])
marks["t3"] = time.monotonic()
marks["rc"] = rc
with open(sys.argv[1], "w") as f:
    f.write(repr(marks))
from trio_procown._exit import exit_now  # as the console script ends
exit_now(rc)
"""

PHASES = (
    ("interpreter start", "t0", "t1"),
    ("import trio_procown._cli (trio, ...)", "t1", "t2"),
    ("argparse, trio.run, up to open_owned_command", "t2", "enter"),
    ("open_owned_command: spawn, block entered", "enter", "inside"),
    ("deadline -> owned block left (teardown)", "deadline", "left"),
    ("block left -> main() returned", "left", "t3"),
    ("main() returned -> exit seen (keeper goodbye, os._exit)", "t3", "t4"),
)


def _gnu_timeout() -> str | None:
    for d in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin", "/bin"]:
        path = os.path.join(d, "timeout")
        if d and os.access(path, os.X_OK):
            return path
    return None


def _last_pid() -> int:
    with open("/proc/loadavg") as f:
        return int(f.read().split()[4])


def _pid_max() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read())


def _process_count() -> int:
    return sum(name.isdigit() for name in os.listdir("/proc"))


def _survivors(tag: str) -> int:
    """Live processes carrying this sample's tag, 0.1 s after its exit;
    SIGKILLs them (by verified pidfd) after counting."""
    time.sleep(0.1)
    found = len(marked_processes(tag, TAG_VAR))
    kill_marked(tag, TAG_VAR)
    return found


def _whole(
    argv: Sequence[str],
    env: Mapping[str, str],
    left: list[int],
    codes: list[int],
    past: list[float] | None = None,
    tmp: str = "",
) -> Measure:
    """A measure of one whole process (start to exit), in a worker thread;
    with `past`, also the time from the command's deadline (its stamped
    start + T) to the exit."""

    def once() -> float:
        tag = secrets.token_hex(8)
        stamp = os.path.join(tmp, f"stamp-{tag}")
        start = time.perf_counter()
        done = subprocess.run(
            argv,
            env={**env, TAG_VAR: tag, STAMP_VAR: stamp},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        ended = time.time()
        elapsed = time.perf_counter() - start
        if past is not None:
            with open(stamp) as f:
                past.append(ended - (float(f.read()) + T))
            os.unlink(stamp)
        codes.append(done.returncode)
        left.append(_survivors(tag))
        return elapsed

    async def measure() -> float:
        return await trio.to_thread.run_sync(once)

    return measure


def _profile_once(env: Mapping[str, str], tmp: str) -> dict[str, Any]:
    """One procown run through DRIVER; the phase durations in seconds."""
    out = os.path.join(tmp, "marks")
    tag = secrets.token_hex(8)
    argv = [sys.executable, "-c", DRIVER, out, "run", "--timeout", str(T), "--", "sh", "-c", SCRIPT]
    pid_before, procs = _last_pid(), _process_count()
    t0 = time.monotonic()
    subprocess.run(
        argv,
        env={**env, TAG_VAR: tag},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    t4 = time.monotonic()
    pids = _last_pid() - pid_before
    _survivors(tag)
    with open(out) as f:
        marks: dict[str, Any] = ast.literal_eval(f.read())
    marks.update(t0=t0, t4=t4)
    marks["deadline"] = marks["inside"] + T
    phases = {name: marks[b] - marks[a] for name, a, b in PHASES}
    phases["total - timeout"] = t4 - t0 - T
    steps = {
        action + (f" {outcome}" if outcome else ""): at for action, outcome, at in marks.get("steps", [])
    }
    # The receipt's own view of the teardown (its times are from its start).
    if "stop" in steps and "spawn" in steps:
        phases["receipt: deadline noticed (stop - spawn - T)"] = steps["stop"] - steps["spawn"] - T
    empty = next((v for k, v in steps.items() if k.startswith("wait") and "empty" in k), None)
    if "signal" in steps and empty is not None:
        phases["receipt: SIGTERM -> domain empty"] = empty - steps["signal"]
    released = next((v for k, v in steps.items() if k.startswith("release")), None)
    if "stop" in steps and released is not None:
        phases["receipt: stop -> domain released"] = released - steps["stop"]
    # Not seconds: how busy the machine was (a teardown's /proc scan is
    # narrow only while few pids were allocated since the spawn).
    phases["context: processes on the machine"] = procs
    phases["context: pids allocated during the run"] = pids if pids >= 0 else pids + _pid_max()
    return phases


def _importtime(env: Mapping[str, str]) -> tuple[float, list[tuple[str, float]]]:
    """`import trio_procown._cli` under -X importtime: its total and its
    biggest direct imports (cumulative seconds)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import trio_procown._cli"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    total, children = 0.0, []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip())) // 2
        if depth == 0 and name.strip() == "trio_procown._cli":
            total = int(parts[1]) / 1e6
        elif depth == 1:
            children.append((name.strip(), int(parts[1]) / 1e6))
    children.sort(key=lambda c: -c[1])
    return total, children[:6]


async def run(cfg: Config) -> Section:
    section = Section(
        "cli_deadline",
        f"10. Returning after a deadline, whole processes: `{PROCOWN}` vs GNU timeout",
        f"Whole processes, start to exit, interleaved in shuffled rounds: `{PROCOWN}` against `{GNU}` "
        f"(and, in full runs, `{GNU_FG}`), with `python -c pass` as the floor of any Python command line; survivors of each sample counted 0.1 s after its exit by a tag "
        "in its environment, then killed. Then where procown's extra time goes, phase by phase.",
    )
    gnu = _gnu_timeout()
    if gnu is None:
        section.notes.append("GNU timeout not found on PATH: scenario skipped")
        return section
    rounds = cfg.pick(1, 10)
    profiles = cfg.pick(1, 3)
    sh = ["sh", "-c", TIMED_SCRIPT]
    left: dict[str, list[int]] = {}
    past: dict[str, list[float]] = {}
    codes: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="procown-bench-cli-deadline-") as tmp:
        env = _child_env(os.path.join(tmp, "pycache"))
        argvs = {PROCOWN: [*_procown_argv(), "run", "--timeout", str(T), "--", *sh], GNU: [gnu, str(T), *sh]}
        if not cfg.quick:
            argvs[GNU_FG] = [gnu, "--foreground", str(T), *sh]
        # The floor of any Python command line: the interpreter's start and exit.
        argvs[FLOOR] = [sys.executable, "-c", "pass"]
        # Fill the bytecode cache (a deadline-free run, cheap) before any timed round.
        await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [*_procown_argv(), "run", "--", "true"], env=env, stdout=subprocess.DEVNULL, check=False
            )
        )
        variants = {}
        for name, argv in argvs.items():
            left[name], codes[name] = [], []
            if name == FLOOR:
                variants[name] = _whole(argv, env, left[name], codes[name])
            else:
                past[name] = []
                variants[name] = _whole(argv, env, left[name], codes[name], past[name], tmp)
        samples = await interleaved(variants, rounds, warmup=0)
        profile = [await trio.to_thread.run_sync(_profile_once, env, tmp) for _ in range(profiles)]
        import_total, imports = await trio.to_thread.run_sync(_importtime, env)

    stats = {name: Stats.of(s) for name, s in samples.items()}
    extra = stats[PROCOWN].median - stats[GNU].median
    paired = Stats.of(paired_differences(samples[PROCOWN], samples[GNU]))
    after = {name: Stats.of(p) for name, p in past.items()}
    after_extra = after[PROCOWN].median - after[GNU].median
    after_paired = Stats.of(paired_differences(past[PROCOWN], past[GNU]))
    verdict = section.target(
        "procown run --timeout 1: deadline -> exit, extra over GNU timeout", after_extra, TARGET, "s"
    )
    rows = []
    for name, st in stats.items():
        is_procown = name == PROCOWN
        rows.append(
            [
                f"`{name}`",
                ms(st.median),
                ms(st.min),
                ms(st.max),
                "" if name == FLOOR else ms(st.median - T),
                "" if name in (GNU, FLOOR) else ms(st.median - stats[GNU].median),
                ms(paired.median) if is_procown else "",
                f"{max(left[name], default=0)} (total {sum(left[name])})",
                ",".join(sorted({str(c) for c in codes[name]})),
                "",
            ]
        )
    section.tables.append(
        Table(
            [
                "process",
                "median ms",
                "min ms",
                "max ms",
                "past the deadline ms",
                "minus GNU timeout ms",
                "paired diff ms",
                "survivors (max per sample)",
                "exit status",
                "target",
            ],
            rows,
            caption=f"{rounds} rounds, one sample of each per round, in a shuffled order; bytecode cached. "
            "'paired diff' is the median of the per-round differences procown - GNU timeout. Survivors: "
            "live processes of the sample 0.1 s after its exit (killed after counting).",
        )
    )

    section.tables.insert(
        0,
        Table(
            [
                "process",
                "deadline -> exit: median ms",
                "min ms",
                "max ms",
                "minus GNU timeout ms",
                "paired diff ms",
                "target",
            ],
            [
                [
                    f"`{name}`",
                    ms(st.median),
                    ms(st.min),
                    ms(st.max),
                    "" if name == GNU else ms(st.median - after[GNU].median),
                    ms(after_paired.median) if name == PROCOWN else "",
                    f"≤ +{TARGET * 1e3:g} ms → {verdict}" if name == PROCOWN else "",
                ]
                for name, st in after.items()
            ],
            caption="From the deadline (the command's stamped start + T) to the exit the caller sees: "
            "the teardown and the tool's own exit, without its start-up (scenario 8 measures that).",
        ),
    )

    names = list(profile[0]) if profile else []
    prof_rows = []
    for name in names:
        st = Stats.of([p[name] for p in profile if name in p])
        if name.startswith("context:"):
            prof_rows.append([name, f"{st.median:,.0f}", f"{st.min:,.0f}", f"{st.max:,.0f}"])
        else:
            prof_rows.append([name, ms(st.median), ms(st.min), ms(st.max)])
    section.tables.append(
        Table(
            ["procown phase", "median ms", "min ms", "max ms"],
            prof_rows,
            caption=f"{len(profile)} runs of `{PROCOWN}` through a driver that calls procown's main() as the "
            "console script does, stamping CLOCK_MONOTONIC at its first line, after the import, around "
            "open_owned_command (wrapped, not changed) and after main(); the deadline is taken as block "
            f"entry + {T} s. The 'receipt:' rows are from the receipt's steps. GNU timeout's own overhead is "
            f"its median - {T} s in the table above. 'context:' rows are counts, not ms.",
        )
    )
    section.tables.append(
        Table(
            ["import (direct, of trio_procown._cli)", "cumulative ms"],
            [[name, ms(sec)] for name, sec in imports]
            + [["total: import trio_procown._cli", ms(import_total)]],
            caption="`python -X importtime -c 'import trio_procown._cli'`, one run, bytecode cached "
            "(importtime itself inflates the figures).",
        )
    )
    timed = [(name, Stats.of([p[name] for p in profile]).median * 1e3) for name, _, _ in PHASES]
    if timed:
        from ._plots import bars, save

        save(
            section,
            cfg,
            "cli_deadline.png",
            "Where procown's time past GNU timeout goes",
            bars(
                f"{PROCOWN}: phases (median ms of {len(profile)} runs)",
                "ms",
                [(name, value, f"{value:.1f} ms") for name, value in timed],
                ours=lambda name: True,
                floor=stats[GNU].median * 1e3 - T * 1e3,
                floor_label="GNU timeout: total - T",
            ),
        )
    section.data = {
        "timeout": T,
        "rounds": rounds,
        "samples_seconds": samples,
        "stats_seconds": {k: v.to_dict() for k, v in stats.items()},
        "extra_over_gnu_seconds": extra,
        "deadline_to_exit_seconds": past,
        "deadline_to_exit_extra_over_gnu_seconds": after_extra,
        "paired_extra_seconds": paired.to_dict(),
        "survivors": left,
        "exit_status": codes,
        "profile_seconds": profile,
        "import_seconds": {"total": import_total, "direct": dict(imports)},
    }
    return section
