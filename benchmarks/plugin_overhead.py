# Per-test overhead of the pytest plugin (trio_procown.pytest_plugin).
#
# Run: `python -m benchmarks.plugin_overhead [--quick] [--tests N] [--rounds R]`.
# Standalone (not one of `python -m benchmarks`' scenarios): it runs pytest.
#
# Two measurements:
#
# 1. End to end. A throwaway project with N trivial tests (and N tests that
#    each spawn and wait for /bin/true) is run by a fresh pytest per sample,
#    with the plugin off, with the cookie mechanism only, and with the
#    cgroup mechanism (where this machine offers it). A conftest in the
#    throwaway project times pytest_runtestloop, so interpreter start-up and
#    collection are left out; the overhead per test is
#    (median loop time of the variant - median loop time with the plugin off) / N.
#    Variants are interleaved, in an order shuffled for each round, because
#    the machine is noisy (see _harness.py).
# 2. The mechanism alone, in-process: one window as a test uses it (open,
#    two phase changes, close, find, release), timed in a loop. This is the
#    floor of (1) without pytest's own hook dispatch.
#
# The cookie scan reads /proc/*/environ of every process on the machine, so
# its cost grows with the process count, which is printed with the results.
# Target (printed, not asserted): under 5 ms per test with the cgroup
# mechanism.

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trio_procown import pytest_plugin

from ._harness import round_orders

TARGET_MS = 5.0

CONFTEST = """\
import json, os, time
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        with open(os.environ["PLUGIN_BENCH_OUT"], "w") as f:
            json.dump({"loop": time.perf_counter() - start, "n": session.testscollected}, f)
"""

TESTS = {
    "empty": """\
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_empty(i):
    pass
""",
    "spawn": """\
import os
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_spawn(i):
    os.waitpid(os.posix_spawn("/bin/true", ["true"], os.environ), 0)
""",
}


def _variants(cgroups: bool) -> dict[str, list[str]]:
    variants = {
        "off": ["--procown-leaks=off"],
        "cookie": ["--procown-leaks=fail", "--procown-leaks-mechanism=cookie"],
    }
    if cgroups:
        variants["cgroup"] = ["--procown-leaks=fail", "--procown-leaks-mechanism=cgroup"]
    return variants


def _run_pytest(project: Path, workload: str, args: list[str]) -> float:
    out = project / "loop.json"
    env = dict(os.environ, PLUGIN_BENCH_OUT=str(out), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, f"test_{workload}.py"],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        msg = (
            f"pytest {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
        raise RuntimeError(msg)
    return float(json.loads(out.read_text())["loop"])


def end_to_end(n: int, rounds: int, cgroups: bool) -> dict[str, dict[str, list[float]]]:
    """Loop time samples per workload and variant."""
    samples: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="procown-plugin-bench-") as tmp:
        project = Path(tmp)
        (project / "pytest.ini").write_text("[pytest]\n")
        (project / "conftest.py").write_text(CONFTEST)
        for workload, source in TESTS.items():
            (project / f"test_{workload}.py").write_text(source.format(n=n))
        variants = _variants(cgroups)
        names = list(variants)
        for workload in TESTS:
            per = samples.setdefault(workload, {name: [] for name in names})
            _run_pytest(project, workload, variants["off"])  # warm-up: caches, bytecode
            for order in round_orders(names, rounds):
                for name in order:
                    per[name].append(_run_pytest(project, workload, variants[name]))
    return samples


def mechanism_alone(mechanism: pytest_plugin.Mechanism, iterations: int) -> list[float]:
    """Seconds per window (as one test uses it), one sample per batch of 50."""
    tracker = pytest_plugin.Tracker(mechanism)
    batches = []
    for _ in range(max(1, iterations // 50)):
        start = time.perf_counter()
        for _ in range(50):
            watch = pytest_plugin.Watch(tracker, "bench", "test")
            watch.open("setup")
            watch.set_phase("call")
            watch.set_phase("teardown")
            watch.close()
            watch.sweep(keep=False)
            watch.release()
        batches.append((time.perf_counter() - start) / 50)
    return batches


def _processes() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit()) if os.path.isdir("/proc") else -1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plugin_overhead", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer tests and rounds (smoke run)")
    parser.add_argument("--tests", type=int, help="tests per workload (default 400, quick 100)")
    parser.add_argument("--rounds", type=int, help="samples per variant (default 7, quick 3)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    n = args.tests or (100 if args.quick else 400)
    rounds = args.rounds or (3 if args.quick else 7)

    cg, note = pytest_plugin._probe_cgroups()
    cgroups = cg is not None
    print(
        f"plugin overhead per test: {n} tests per workload, {rounds} rounds, {_processes()} processes on the machine"
    )
    print(f"cgroup mechanism: {note}")

    alone = {"cookie": mechanism_alone("cookie", 500 if not args.quick else 100)}
    if cgroups:
        alone["cgroup"] = mechanism_alone("cgroup", 500 if not args.quick else 100)
    print("\n| mechanism alone (one window) | median | min |")
    print("|---|---|---|")
    for name, batches in alone.items():
        print(f"| {name} | {statistics.median(batches) * 1e3:.3f} ms | {min(batches) * 1e3:.3f} ms |")

    samples = end_to_end(n, rounds, cgroups)
    results: dict[str, dict[str, float]] = {}
    print("\n| workload | variant | loop median | per test | overhead per test vs off |")
    print("|---|---|---|---|---|")
    for workload, per in samples.items():
        base = statistics.median(per["off"])
        for name, values in per.items():
            med = statistics.median(values)
            over = (med - base) / n
            results.setdefault(workload, {})[name] = over
            shown = "-" if name == "off" else f"{over * 1e3:+.3f} ms"
            print(f"| {workload} | {name} | {med:.3f} s | {med / n * 1e3:.3f} ms | {shown} |")
    if cgroups:
        worst = max(results[w]["cgroup"] for w in results) * 1e3
        verdict = "meets" if worst < TARGET_MS else "MISSES"
        print(
            f"\ncgroup mechanism: worst overhead {worst:.3f} ms per test, {verdict} the target (< {TARGET_MS} ms)"
        )
    if args.json:
        payload = {
            "tests": n,
            "rounds": rounds,
            "processes": _processes(),
            "cgroup": note,
            "mechanism_alone_ms": {k: statistics.median(v) * 1e3 for k, v in alone.items()},
            "overhead_per_test_ms": {w: {k: v * 1e3 for k, v in r.items()} for w, r in results.items()},
            "samples_s": samples,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
