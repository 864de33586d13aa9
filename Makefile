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
# local platform gives each function 0.29 of a core as Lambda would. One function misses a 200 ms SLO; the
# plan splits the model across functions and meets it. Both are deployed and timed side by side.
DEMO_MODEL := $(BUILD)/vgg16-demo.onnx
demo: setup
	$(BIN)/flatpack zoo build vgg16 --width-div 2 --input-size 224 -o $(DEMO_MODEL)
	-@$(BIN)/flatpack undeploy vgg16-split >/dev/null 2>&1
	-@$(BIN)/flatpack undeploy vgg16-unsplit >/dev/null 2>&1
	$(BIN)/flatpack deploy $(DEMO_MODEL) --mode slo --slo 200ms --memory 512 --name vgg16-split --port 8080 --detach
	$(BIN)/flatpack export $(DEMO_MODEL) --stages "0-:none" --memory 512 -o $(BUILD)/vgg16-unsplit
	$(BIN)/flatpack serve $(BUILD)/vgg16-unsplit --name vgg16-unsplit --port 8081 --detach
	$(BIN)/flatpack invoke vgg16-split --input random --repeat 15
	$(BIN)/flatpack invoke vgg16-unsplit --input random --repeat 15
	@echo "both keep serving: flatpack ls; stop them with: $(BIN)/flatpack undeploy vgg16-split; $(BIN)/flatpack undeploy vgg16-unsplit"

# ruff (style, bugs, security), import-linter (DESIGN.md's layers), mypy (every product package), then pytest
test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
