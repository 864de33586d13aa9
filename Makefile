# Two entry points for a fresh machine: `make demo` (main job) and `make test` (the test suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
BUILD  ?= build

.PHONY: setup demo test lint clean

$(BIN)/flatpack: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build on this disk; anything that depends on it must not pull another.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

setup: $(BIN)/flatpack

# The product's promise on this machine: VGG-16 (width/2, 224 px) with every function at 512 MB, where the
# local platform gives each function 0.29 of a core as Lambda would. `flatpack demo` predicts one function and
# the fastest plan on this machine, asks for an SLO between the two (one function misses it), deploys the
# cheapest plan that meets it beside the unsplit function, and prints both live latencies.
demo: setup
	$(BIN)/flatpack demo --model vgg16 --width-div 2 --input-size 224 --memory 512 --port 8080

# the docs (mkdocs, strict: a broken link or a page missing from the nav fails), ruff (style, bugs, security),
# import-linter (DESIGN.md's layers), mypy (every product package), then pytest, which fails when the run
# leaves files in $HOME or /tmp (--leak-check, tests/hygiene.py)
test: setup
	$(BIN)/mkdocs build --strict --quiet --site-dir $(abspath $(BUILD))/site
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 -q --leak-check --durations=25

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
