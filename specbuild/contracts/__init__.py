"""Contracts: data that two sides of the pipeline read, kept in one place so that they cannot drift apart.

- `triton_backend`: the TensorRT-LLM 1.2 Triton backend's wire contract (every input, output and parameter of
  NVIDIA's five model templates): `deploy` generates the repository's configs from it and the tests check the
  written configs and the reference models' answers against it.
- `engine_info`: `engine.json`, what `build` leaves in an engine directory and `deploy` reads instead of plans.
- `engine_limits`: what a spec asks of each engine; `build` plans from it, `deploy` refuses engines that differ.
- `checkpoint_facts`: what `build` and `deploy` need of a converted checkpoint, read from its `config.json`.
- `llm_api`: TensorRT-LLM 1.2's LLM-API settings for `build.flow: pytorch`, and which flow runs which mode.
- `quant_formats`: the draft quantization formats (spec name -> ModelOpt preset -> `quant_algo`), for every stage.
- `images`: the TensorRT-LLM build container and the Triton image that serves its engines (build, deploy).
"""
