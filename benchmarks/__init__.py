# Benchmarks of trio_procown against its peers and against the kernel floor.
#
# Run with `python -m benchmarks` (full, a few minutes) or
# `python -m benchmarks --quick` (smoke run for CI, well under a minute).
# Every scenario interleaves the variants it compares round-robin in the same
# run, because the machine is noisy: the numbers to read are the ratios
# between variants measured side by side, not absolute times across runs.
# Results go to benchmarks/results/latest.md and latest.json. Nothing here
# asserts on timing: targets are printed next to the measurements.
"""Benchmark harness for trio_procown (run ``python -m benchmarks``)."""
