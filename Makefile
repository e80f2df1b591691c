# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Everything lives in a project-local venv built with pip (later extras need pip's
# view of this machine's local wheels, which uv and poetry do not have).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test lint typecheck pytest docs-tables bench vectors clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# One stamp per install set, rebuilt when the project metadata changes.
$(VENV)/.core: pyproject.toml | $(VENV)/bin/python
	$(PIP) -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(VENV)/bin/python
	$(PIP) -e '.[test,grpc]'
	touch $@

demo: $(VENV)/.core
	$(VENV)/bin/pd-policy demo

lint: $(VENV)/.test
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(VENV)/.test
	$(VENV)/bin/mypy

pytest: $(VENV)/.test
	$(PY) -m pytest

test: lint typecheck pytest

# Regenerate the tables in docs/ from the code (a test checks they are current).
docs-tables: $(VENV)/.core
	$(VENV)/bin/pd-policy tables decisions --write docs/decisions.md
	$(VENV)/bin/pd-policy tables errors --write docs/errors.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Benchmarks: prints a table, writes bench/results.json and docs/performance.md.
bench: $(VENV)/.test
	$(PY) bench/run.py

# Regenerate the committed conformance vectors (a test fails until they are current).
vectors: $(VENV)/.core
	$(VENV)/bin/pd-policy vectors tests/vectors/pd-policy-vectors.json
