# fedforest developer entry points: a local .venv, the demo, tests, lint and the benchmark extras.
SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEV_STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench
# No telemetry and no network from Great Expectations or Prefect. Compiled numba kernels live where fedcore
# puts them for every entry point (this checkout's .numba_cache/, see fedcore/__init__.py).
RUN_ENV := GX_ANALYTICS_ENABLED=false PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
# Python writes the bytecode of what it imports into .venv and the checkout even where the shell says not to
# (PYTHONDONTWRITEBYTECODE, set on some CI and sandbox images): the install does not compile it (--no-compile,
# below), so without this every process of the suite, each agent, CLI and Dask worker among them, compiled
# scikit-learn's, pandas' and Prefect's sources again: 8.1-8.4 s of CPU to import them against 3.5 s from
# the bytecode (2026-11-29).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv bench-venv demo test test-slow test-all lint clean distclean

## venv: create .venv, install the project editable with [dev] (about two minutes the first time, mostly
## downloads; --no-compile: Python writes the bytecode of the modules it imports, not pip of every file:
## 45 s less) and compile the numba kernels once (about 2 minutes on two cores); reinstalls only when
## pyproject.toml changes. Each long step says what it does first; pip lists each package, the warm-up
## each engine mode.
venv: $(DEV_STAMP)

$(BIN)/python:
	@echo "fedforest: creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	@echo "fedforest: installing fedforest and its dependencies (with [dev]) into $(VENV): about two minutes"
	@echo "fedforest: the first time, mostly downloads; pip lists each package as it goes"
	$(BIN)/pip install --no-compile -e '.[dev]'
	$(RUN_ENV) $(BIN)/python -m fedcore.warmup
	touch $@

## bench-venv: also install the [bench] extra (xgboost, lightgbm; pulls ~470 MB of nccl), separate stamp
bench-venv: $(BENCH_STAMP)

$(BENCH_STAMP): pyproject.toml | $(BIN)/python
	@echo "fedforest: installing the [bench] extra into $(VENV) (xgboost, lightgbm; ~470 MB of downloads)"
	$(BIN)/pip install --no-compile -e '.[dev,bench]'
	$(RUN_ENV) $(BIN)/python -m fedcore.warmup
	touch $@ $(DEV_STAMP)

## demo: install, then run the main job on the embedded default
demo: venv
	$(RUN_ENV) $(BIN)/fedforest demo

## test: the suite without the tests marked slow (flows, Prefect servers, agent processes, the README tour),
## one worker per core (at most 4; whole files per worker): about 4.5 minutes on two cores; CI (.ci/run)
## runs test-slow after it. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= auto
test: venv
	$(RUN_ENV) $(BIN)/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile

## test-slow: the slow end-to-end tests only (about fifteen minutes on two cores)
test-slow: venv
	$(RUN_ENV) $(BIN)/python -m pytest -q -m slow

## test-all: the whole suite in one run (test and test-slow together)
test-all: venv
	$(RUN_ENV) $(BIN)/python -m pytest -q

## lint: ruff over every Python tree of the project, mypy over fedcore, tasks and flows ([tool.mypy])
lint: venv
	$(BIN)/ruff check fedcore flows tasks tests benchmarks tools
	$(BIN)/mypy

## clean: remove caches and generated outputs (keeps .venv; see distclean)
clean:
	rm -rf .numba_cache .pytest_cache .ruff_cache .mypy_cache work benchmarks/results *.egg-info build dist
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

## distclean: clean, and remove .venv too
distclean: clean
	rm -rf $(VENV)
