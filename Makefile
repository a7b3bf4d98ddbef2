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

# The main job on the built-in demo models: build them (cached), convert the draft-target and the Medusa
# pipelines, then generate with each speculative method through the reference runtime.
demo: $(STAMP)
	$(BIN)/specbuild demo-models $(DEMO)/models
	$(BIN)/specbuild validate configs/demo.yaml
	$(BIN)/specbuild convert configs/demo.yaml
	$(BIN)/specbuild convert configs/demo-medusa.yaml
	@echo "--- written:"
	@find $(DEMO)/build/checkpoints $(DEMO)/build-medusa/checkpoints -maxdepth 2 -type f | sort | xargs ls -l
	@echo "--- plain greedy decoding of the target:"
	$(BIN)/specbuild generate $(DEMO)/build/checkpoints/target --tokenizer $(DEMO)/models/target \
		--prompt "The for statement" --max-tokens 40
	@echo "--- draft-target speculative decoding (same text, fewer target forwards):"
	$(BIN)/specbuild generate $(DEMO)/build/checkpoints/target --tokenizer $(DEMO)/models/target \
		--prompt "The for statement" --max-tokens 40 --draft $(DEMO)/build/checkpoints/draft --num-draft-tokens 4
	@echo "--- Medusa speculative decoding:"
	$(BIN)/specbuild generate $(DEMO)/build-medusa/checkpoints/medusa --tokenizer $(DEMO)/models/target \
		--prompt "The for statement" --max-tokens 40 --medusa --medusa-choices mc_sim_7b_top8

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
