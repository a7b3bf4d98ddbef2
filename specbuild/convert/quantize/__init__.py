"""Draft quantization with NVIDIA ModelOpt 0.47: plan, calibrate, export a TensorRT-LLM checkpoint, repair, check
(or export a Hugging Face checkpoint).

`mtq.quantize` fake-quantizes a transformers model in place and calibrates its scales on token batches;
`export_tensorrt_llm_checkpoint` then writes the real quantized tensors. One module per job:

* `settings` — the `draft.quantization` vocabulary (formats, KV formats) and `QuantizeSettings`; no torch;
* `plan` — every check and decision before anything is loaded (export dtype, int4 group size, calibration
  batches), shared with `specbuild validate`; no ModelOpt;
* `modelopt_calls` — the ModelOpt calls: the list-form config, calibration, `match_export`, the export;
* `repair` — what the export writes wrongly, put right, and the coverage check of the result;
* `write` — the four in order into the conversion's temporary directory (`shared_quantization`: one calibration
  for two exports of a draft);
* `hf_export` — ModelOpt's Hugging Face export (`export_hf_checkpoint`) instead, the draft TensorRT-LLM's PyTorch
  backend loads on `build.flow: pytorch`, cast to the export dtype and checked.

ModelOpt's known gaps, each repaired with a test (tests/test_quantize.py); sources: NVIDIA/Model-Optimizer
0.47.0 (PyPI `nvidia-modelopt`; CHANGELOG, `modelopt/torch/quantization/model_quant.py`,
`modelopt/torch/export/model_config_export.py`):

* configs are the ordered list form since 0.44: built from the `mtq.*_CFG` constants (already lists) and only
  ever appended to or edited by entry, never indexed by quantizer name (`modelopt_calls._check_list_form`);
* `inference_tensor_parallel=0` (its default) divides by zero on one process: tp and pp are always passed;
* export mutates the model, so it is exported once and then dropped;
* the config fields and the vocabulary layout it writes its own way (`repair`).

ModelOpt is imported lazily (about 7 s and 240 MB): only a quantized conversion pays for it. This package
imports nothing itself, so that `settings` stays cheap to import.
"""
