# Two entry points on a fresh clone: `make demo` and `make test`.
# Both create the virtual environment on first use.

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck check bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m trio_procown demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck test

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
