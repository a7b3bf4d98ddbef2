"""Run SGLang's own argument parser and ServerArgs resolution on `sglang.launch_server` command lines; print what
SGLang resolved, as JSON.

Run with the SGLang virtualenv's python (`make test-engines` installs sglang==0.5.23 in its own cached one), never
the project's: `python sglang_check.py CASES.json OUT.json`. CASES.json is a list of `{"name": ..., "argv":
["python", "-m", "sglang.launch_server", ...]}`: one export's command line (manifest.json `argv`), the same export
as `--config config.yaml`, or a probe of what specbuild refuses. Each is judged as launch_server judges it before it
starts anything: `prepare_server_args(argv)` (its argparse parser, `--config` merged) and `ServerArgs.resolve_once()`
(the resolution pipeline: model config from the local directories, speculative hooks, validation); for a
quantized draft also the quantization config the model loader builds from its checkpoint (`get_quant_config`).

Stood in for a GPU, because SGLang's resolution asks the device before it reads an argument and this machine has
none (everything else is SGLang's own code):
- `torch.cuda`: `is_available` True, `device_count` STANDIN_GPUS (8), `get_device_capability` (9, 0) and
  `get_device_name` / `get_device_properties` of an H200 (sm90, 141 GiB), `mem_get_info` all of it free,
  `current_device` 0; `torch.version.cuda` kept (the wheel's CUDA build) or "12.9" if absent;
- `nvidia-smi`: a stand-in script first on PATH answering `--query-gpu=memory.total` (one line per GPU) and
  `--query-gpu=driver_version`, the two queries resolution makes;
- sgl_kernel's compiled `common_ops` library (its import needs libcuda): a module whose every attribute is a kernel
  that raises if called; resolution calls none, and sgl_kernel's pure-Python modules (scalar types) are real.

OUT.json: `{"engine": "sglang", "version": ..., "facts": {...}, "cases": [{"name", "accepted", "error",
"resolved"}]}`; `facts` are SGLang's own lists that specbuild's export names.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import traceback
import types
from typing import Any

STANDIN_GPUS = 8
STANDIN_MEMORY = 141 * 2**30
STANDIN_NAME = "NVIDIA H200"


class _Kernels(types.ModuleType):
    """sgl_kernel's `common_ops` stood in: any attribute is a kernel that refuses to run."""

    __file__ = "<specbuild stand-in for sgl_kernel common_ops>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"common_ops.{name} is a GPU kernel, stood in by specbuild's engine checker")

        kernel.__name__ = name
        return kernel


def stand_in_gpu() -> None:
    """One sm90 machine of STANDIN_GPUS GPUs, as far as SGLang's argument resolution asks (see the docstring)."""
    import torch

    properties = types.SimpleNamespace(name=STANDIN_NAME, major=9, minor=0, total_memory=STANDIN_MEMORY,
                                       multi_processor_count=132, L2_cache_size=50 * 2**20, gcnArchName="")
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: STANDIN_GPUS
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: STANDIN_NAME
    torch.cuda.get_device_properties = lambda device=None: properties
    torch.cuda.mem_get_info = lambda device=None: (STANDIN_MEMORY, STANDIN_MEMORY)
    torch.cuda.current_device = lambda: 0
    if not torch.version.cuda:
        torch.version.cuda = "12.9"
    bin_dir = tempfile.mkdtemp(prefix="specbuild-nvidia-smi-")
    atexit.register(shutil.rmtree, bin_dir, True)  # the stand-in leaves nothing behind in /tmp
    script = os.path.join(bin_dir, "nvidia-smi")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\ncase \"$*\" in\n"
                     f"  *memory.total*) i=0; while [ $i -lt {STANDIN_GPUS} ]; do echo {STANDIN_MEMORY // 2**20}; "
                     "i=$((i + 1)); done;;\n"
                     "  *driver_version*) echo 580.82.07;;\n"
                     "  *) echo \"nvidia-smi $*: not stood in\" >&2; exit 1;;\nesac\n")
    os.chmod(script, 0o755)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    sys.modules.setdefault("common_ops", _Kernels("common_ops"))


FIELDS = ("model_path", "served_model_name", "tp_size", "pp_size", "context_length", "max_running_requests", "dtype",
          "trust_remote_code", "quantization", "speculative_algorithm", "speculative_draft_model_path",
          "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
          "speculative_draft_model_quantization", "speculative_ngram_min_bfs_breadth",
          "speculative_ngram_max_bfs_breadth", "speculative_ngram_max_trie_depth", "speculative_ngram_match_type",
          "device", "kv_cache_dtype", "speculative_draft_kv_cache_dtype", "speculative_adaptive",
          "speculative_adaptive_config")


def _facts() -> dict[str, Any]:
    import sglang
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return {"version": sglang.__version__, "quantization_choices": list(QUANTIZATION_CHOICES),
            "speculative_algorithms": [member.name for member in SpeculativeAlgorithm if member.name != "NONE"],
            "eagle3_targets": _eagle3_targets()}


def _eagle3_targets() -> dict[str, bool | None]:
    """Per HF architecture in $SPECBUILD_ARCHITECTURES (a JSON list): whether SGLang's model class for it has
    set_eagle3_layers_to_capture, without which the model runner refuses EAGLE3 ("... does not implement
    set_eagle3_layers_to_capture ..."); None where SGLang has no class for the architecture."""
    from sglang.srt.models.registry import ModelRegistry

    found: dict[str, bool | None] = {}
    for arch in json.loads(os.environ.get("SPECBUILD_ARCHITECTURES", "[]")):
        cls = ModelRegistry._try_load_model_cls(arch)
        found[arch] = None if cls is None else hasattr(cls, "set_eagle3_layers_to_capture")
    return found


def _draft_quant_config(server_args: Any, view: Any) -> str | None:
    """The quantization config class SGLang's model loader builds from a quantized draft's checkpoint config
    (sglang/srt/model_loader/weight_utils.py `get_quant_config`, which the loader's `_get_quantization_config` calls
    first; it reads config.json's quantization_config and refuses an algorithm its class lacks), from the draft's
    ModelConfig as the draft worker makes it (`ModelConfig.from_server_args(..., is_draft_model=True)`)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.weight_utils import get_quant_config

    if view.speculative_draft_model_path is None:
        return None
    draft = ModelConfig.from_server_args(server_args, model_path=view.speculative_draft_model_path,
                                         is_draft_model=True)
    if draft.quantization is None:
        return None
    return type(get_quant_config(draft, LoadConfig(), {})).__name__


def _steps_by_batch_size(view: Any) -> list[int] | None:
    """Draft steps per running batch size 1..max_running_requests as SGLang's adaptive speculation starts them
    (sglang/srt/speculative/adaptive_spec_params.py `AdaptiveSpeculativeParams`, built from the resolved
    --speculative-num-steps and --speculative-adaptive-config as the EAGLE worker builds it; the batch size is not
    padded to a CUDA-graph size here, which the worker does); None when resolution left adaptive speculation off."""
    if not view.speculative_adaptive:
        return None
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    params = AdaptiveSpeculativeParams(view.speculative_num_steps, view.speculative_adaptive_config)
    return [params.get_steps_for_batch(batch) for batch in range(1, view.max_running_requests + 1)]


def _argparse_error(text: str) -> str:
    """argparse's own `prog: error: ...` line, without the usage text before it."""
    errors = [line for line in text.splitlines() if ": error: " in line]
    return errors[-1] if errors else text.strip()[-2000:]


def judge(argv: list[str]) -> dict[str, Any]:
    """prepare_server_args + resolve_once on `argv` (`python -m sglang.launch_server ...`); an argparse exit or an
    exception is a refusal, with SGLang's own message."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    assert argv[:3] == ["python", "-m", "sglang.launch_server"], argv
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            server_args = prepare_server_args(argv[3:])
        server_args.resolve_once()
        view = resolving_view(server_args)
        resolved = {name: getattr(view, name) for name in FIELDS}
        resolved["draft_quant_config"] = _draft_quant_config(server_args, view)
        resolved["steps_by_batch_size"] = _steps_by_batch_size(view)
    except SystemExit as exit_:
        return {"accepted": False, "error": f"argparse exit {exit_.code}: {_argparse_error(stderr.getvalue())}"}
    except Exception as err:  # SGLang's refusal
        return {"accepted": False, "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=-4)}
    return {"accepted": True, "error": None, "resolved": resolved}


def main() -> None:
    cases_path, out_path = sys.argv[1], sys.argv[2]
    with open(cases_path, encoding="utf-8") as handle:
        cases = json.load(handle)
    stand_in_gpu()
    facts = _facts()
    results = [{"name": case["name"], **judge(case["argv"])} for case in cases]
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump({"engine": "sglang", "version": facts["version"], "facts": facts, "cases": results}, handle,
                  indent=1, default=str)


if __name__ == "__main__":
    main()
