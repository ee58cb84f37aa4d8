# Benchmarks of trio_procown against its peers and against the kernel floor.
#
# Run with `python -m benchmarks` or `make bench` (full; results/latest.md
# records how long the run took) or `python -m benchmarks --quick` (smoke
# run, under a minute).
# The peers (subprocess.run, the communicate recipe, trio.run_process,
# anyio.run_process, the asyncio recipe, an ADK-style teardown written from
# its published description) run in the same run, on the same scenarios.
# Every scenario interleaves the variants it compares (one sample of each per
# round, in an order shuffled for each round) in the same run, because the machine is noisy: the numbers to read are the ratios
# between variants measured side by side, not absolute times across runs.
# Results go to benchmarks/results/latest.md and latest.json, with PNG plots
# next to them (matplotlib, optional: the `bench` extra); a --quick run
# writes to benchmarks/results/quick/ instead, so it never overwrites the
# committed full results. Nothing here asserts on timing: targets are
# printed next to the measurements.
"""Benchmark harness for trio_procown (run ``python -m benchmarks``)."""
