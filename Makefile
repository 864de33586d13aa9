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

demo: setup
	$(BIN)/flatpack zoo build vgg11 --width-div 4 --input-size 64 -o $(BUILD)/vgg11-small.onnx
	-$(BIN)/flatpack undeploy vgg11-small 2>/dev/null
	$(BIN)/flatpack deploy $(BUILD)/vgg11-small.onnx --mode slo --slo 200ms --name vgg11-small --port 8080 --detach
	$(BIN)/flatpack invoke vgg11-small --input random
	@echo "the endpoint keeps serving: flatpack status vgg11-small; stop it with: $(BIN)/flatpack undeploy vgg11-small"

# ruff (style, bugs, security), import-linter (DESIGN.md's layers), mypy (every product package), then pytest
test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
