# Two commands for a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0

.PHONY: setup demo test docs lint bench bench-all bench-quick clean

$(BIN)/.setup-stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/.setup-stamp

demo: setup
	$(BIN)/unipar train gpt-stdlib --workers 2 --steps 200

test: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 -m "not alone" tests
	$(BIN)/python -m pytest -q -m alone tests

# The documentation site in site/ (open site/index.html): strict, so a warning fails it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	$(BIN)/python benchmarks/ddp_vs_torchrun.py
	$(BIN)/python benchmarks/xgboost_vs_peers.py
	$(BIN)/python benchmarks/plan_speed.py

# Every benchmark, its log and RESULT line in bench-results/ (benchmarks/README.md: the
# list, each one's expected time; docs/benchmarks-method.md: what each measures).
bench-all: setup
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	benchmarks/run_all.sh

bench-quick: setup
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	benchmarks/run_all.sh --quick

clean:
	rm -rf $(VENV) unipar_runs site
