# `make check` while editing (the quick tier), `make test` for everything (CI), `make demo`.
# Everything they need is installed here.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The Levanter integration's venv: Levanter pins its own jax, so it is kept apart from .venv
# (about 1.8 GB, about 2 minutes to install, built once; tests/test_levanter.py drives it).
LEVANTER_VENV ?= .venv-levanter
LEVANTER_STAMP := $(LEVANTER_VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup levanter-venv chromium check test lint demo bench clean

# The package's bytecode, compiled as `pip install` compiles an installed package's: with
# PYTHONDONTWRITEBYTECODE set (as on these machines) an editable checkout would otherwise compile
# ~120 modules at every start of `observatory` (~0.2 s). Only changed files are compiled again.
setup: $(STAMP)
	@$(BIN)/python -m compileall -q observatory trainer bench >/dev/null

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	sync  # flush the install's ~1 GB of dirty pages now, not during the fsync-timed tests
	touch $(STAMP)

levanter-venv: $(LEVANTER_STAMP)

$(LEVANTER_STAMP): pyproject.toml
	$(PYTHON) -m venv $(LEVANTER_VENV)
	$(LEVANTER_VENV)/bin/pip install -q --upgrade pip
	$(LEVANTER_VENV)/bin/pip install -q -e '.[levanter,test]'
	sync
	touch $(LEVANTER_STAMP)

# Debian's chromium for the browser tests (Playwright cannot download its own here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The quick tier: ruff, then the tests that start no child process, drive no browser, import no JAX and
# judge no wall-clock bound, on every core. tests/tiers.py fails a test of this tier that starts a
# process or imports JAX, naming the marker to give it.
CHECK_TIER := not slow and not browser and not timing and not subprocess and not jax
check: lint
	$(BIN)/pytest -q -n auto -m "$(CHECK_TIER)"

# Everything, for CI. The timing tests (readers see new data within 2 s) run first, in a pytest process
# of their own (no other test's load skews their clock); the rest after, on every core, each test module
# on one worker (its fixtures, a trained run or a store of many runs, are made once), the 25 slowest named.
test: lint chromium levanter-venv
	$(BIN)/pytest -q -m timing
	$(BIN)/pytest -q -m "not timing" -n auto --dist loadscope --durations=25

demo: setup
	$(BIN)/python -m observatory.demo

bench: setup chromium
	$(BIN)/pip install -q -e '.[dev,bench]'
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(LEVANTER_VENV) data/observatory.duckdb* data/runs
