# Every target installs what it needs into .venv first (fresh machine: python3 with venv is enough).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := demo

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

# The main job on the built-in demo models: build them (cached), then convert target and draft.
demo: $(STAMP)
	$(BIN)/specbuild demo-models $(DEMO)/models
	$(BIN)/specbuild validate configs/demo.yaml
	$(BIN)/specbuild convert configs/demo.yaml
	@echo "--- written:"
	@find $(DEMO)/build/checkpoints -maxdepth 2 -type f | sort | xargs ls -l

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

# Benchmarks write their figures under bench/results/.
bench: $(STAMP)
	$(BIN)/python bench/convert_bench.py
	$(BIN)/python bench/runtime_bench.py

clean:
	rm -rf $(DEMO) bench/work .pytest_cache
