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
	$(BIN)/flatpack inspect $(BUILD)/vgg11-small.onnx
	$(BIN)/flatpack export $(BUILD)/vgg11-small.onnx --stages "0-3:spatial=2x2,4:channel=4,5-7:none,8:reduction=4,9:channel=4,10:none" -o $(BUILD)/vgg11-small.bundle
	$(BIN)/flatpack verify $(BUILD)/vgg11-small.bundle
	$(BIN)/flatpack verify $(BUILD)/vgg11-small.onnx --all-options

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache
