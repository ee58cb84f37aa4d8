# Two entry points on a fresh clone: `make demo` and `make test`.
# Both create the virtual environment on first use.

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test chaos lint typecheck check bench bench-quick quote clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m trio_procown demo

test: $(STAMP)
	$(PY) -m pytest -q

# The chaos suite exploring: Hypothesis' "chaos" profile (tests/conftest.py)
# draws a random seed per run, keeps failures in .hypothesis/ and runs 5x the
# examples of `make test` (which is derandomized). The property tests'
# timeouts grow with their example count; the rest get a larger default.
chaos: $(STAMP)
	HYPOTHESIS_PROFILE=chaos $(PY) -m pytest -q tests/test_chaos.py -p no:cacheprovider --timeout=600

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck test

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

# The full comparison needs the peers' and the plots' libraries (the `bench`
# extra); without them the run still completes and says what it skipped.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $(BENCH_STAMP)

# A full run rewrites the figures README.md and docs/comparison.md quote
# (benchmarks/quote.py; tests/test_docs.py fails when they drift).
bench: $(BENCH_STAMP)
	$(PY) -m benchmarks
	$(PY) -m benchmarks.quote

quote: $(STAMP)
	$(PY) -m benchmarks.quote

# HTML documentation (Sphinx), warnings as errors; the docs extra is
# installed into the venv on first use.
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: docs

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[test,docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
