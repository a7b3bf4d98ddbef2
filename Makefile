# Every target installs what it needs into .venv first (fresh machine: python3 with venv is enough).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := demo

.PHONY: install demo test test-fast test-variant test-engines lint bench gpu-engines clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

# The main job on the built-in demo models, end to end: build the models (cached) and what is trained on the target
# (an EAGLE-3 draft, a self-draft adapter, Medusa-2 base and heads; each cached), convert (the draft quantized with
# ModelOpt int8 SmoothQuant, the target with Medusa and Medusa-2 heads, a plain target, one for Lookahead, a
# self-draft of the target's first layers with its adapter), build reference bundles, deploy seven Triton
# repositories (six in the TensorRT-LLM backend's layout, one around Triton's llmapi model for the PyTorch flow's
# EAGLE-3), then serve the draft-target, the Medusa and the EAGLE-3 repositories with the bundled tritonserver, ask a
# few prompts over gRPC streaming and HTTP, print answers and acceptance, stop. (The others are built and deployed;
# `specbuild serve demo/build-<name>/model_repository` serves one by hand, about 12 s for the server start.)
DEMO_SPECS := configs/demo.yaml configs/demo-medusa.yaml configs/demo-plain.yaml configs/demo-lookahead.yaml \
	configs/demo-self-draft.yaml configs/demo-medusa2.yaml configs/demo-eagle3.yaml
DEMO_PROMPTS := --prompt "The for statement" --prompt "A module can contain" --max-tokens 40
demo: $(STAMP)
	$(BIN)/specbuild demo-models $(DEMO)/models
	for spec in $(DEMO_SPECS); do $(BIN)/specbuild validate $$spec >/dev/null && echo "valid: $$spec" || exit 1; done
	for spec in $(DEMO_SPECS); do $(BIN)/specbuild convert $$spec || exit 1; done
	for spec in $(DEMO_SPECS); do $(BIN)/specbuild build $$spec || exit 1; done
	for spec in $(DEMO_SPECS); do $(BIN)/specbuild deploy $$spec || exit 1; done
	$(BIN)/specbuild deploy --check $(DEMO)/build/model_repository
	@echo "--- draft-target speculation through the BLS (int8 SmoothQuant draft, K and schedule as tune chose them, configs/demo.yaml):"
	$(BIN)/specbuild serve $(DEMO)/build/model_repository $(DEMO_PROMPTS)
	@echo "--- Medusa speculation through the ensemble:"
	$(BIN)/specbuild serve $(DEMO)/build-medusa/model_repository $(DEMO_PROMPTS)
	@echo "--- EAGLE-3 (PyTorch flow) through Triton's llmapi model, served on CPU by the reference backend:"
	$(BIN)/specbuild serve $(DEMO)/build-eagle3/model_repository $(DEMO_PROMPTS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q

# Everything that needs neither the trained demo models nor a tritonserver (markers set in tests/conftest.py).
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -m "not demo_models and not tritonserver"

# The cross-machine check: the whole suite on demo models trained under other conditions (every seed shifted,
# another torch thread count), as another CPU would train other weights. Built in their own directory, so the
# models `make demo` uses stay. `make test-variant VARIANT_SEED=2 VARIANT_THREADS=2` for another variant.
VARIANT_SEED ?= 1
VARIANT_THREADS ?= 1
test-variant: $(STAMP)
	SPECBUILD_DEMO_SEED_OFFSET=$(VARIANT_SEED) SPECBUILD_DEMO_TRAIN_THREADS=$(VARIANT_THREADS) \
	SPECBUILD_TEST_DEMO_MODELS=$(DEMO)/models-variant-s$(VARIANT_SEED)-t$(VARIANT_THREADS) $(BIN)/pytest -q

# The engine tier: vLLM and SGLang judge every `specbuild export` with their own parsers and config classes
# (tests/test_engines_judge.py, marker engines). Each engine is installed from the registry into its own cached
# virtualenv outside .venv (their torch pins differ; about 10 GB each, 7-8 minutes the first time), reused while its
# stamp is there; `rm -rf $(ENGINES_DIR)` to reinstall. Plain `make test` runs the tier only where they exist.
ENGINES_DIR ?= $(HOME)/.cache/specbuild/engines
VLLM_VENV := $(ENGINES_DIR)/vllm-0.33.0
SGLANG_VENV := $(ENGINES_DIR)/sglang-0.5.23
$(ENGINES_DIR)/%/.installed-stamp:
	test -x $(ENGINES_DIR)/$*/bin/python || $(PY) -m venv $(ENGINES_DIR)/$*
	$(ENGINES_DIR)/$*/bin/python -m pip install --quiet --upgrade pip
	$(ENGINES_DIR)/$*/bin/python -m pip install --quiet $(subst -,==,$*)
	touch $@

test-engines: $(STAMP) $(VLLM_VENV)/.installed-stamp $(SGLANG_VENV)/.installed-stamp
	SPECBUILD_ENGINES_DIR=$(ENGINES_DIR) SPECBUILD_REQUIRE_ENGINES=1 $(BIN)/pytest -q -m engines tests/test_engines_judge.py

lint: $(STAMP)
	$(BIN)/ruff check .

# Benchmarks write their figures under bench/results/ (ratios measured side by side in one run). bench/run_all.py
# runs every bench/*_bench.py (a failing one does not stop the others), then the tune dry-run tables, and ends with
# one line per script naming the targets it missed; it exits 1 if any script missed one or crashed.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# GPU CI job (.github/workflows/gpu-engines.yml; needs an NVIDIA GPU and Docker with the NVIDIA toolkit):
# convert on the host, build TensorRT-LLM 1.2 engines in the NGC container, deploy. GPU_SPEC=your.yaml for yours.
GPU_SPEC ?= ci/gpu/demo-gpu.yaml
gpu-engines: $(STAMP)
	bash ci/gpu/engines.sh $(GPU_SPEC)

clean:
	rm -rf $(DEMO) bench/work .pytest_cache
