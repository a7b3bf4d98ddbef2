"""Run vLLM's own parser and config classes on `vllm serve` command lines; print what vLLM resolved, as JSON.

Run with the vLLM virtualenv's python (`make test-engines` installs vllm==0.33.0 in its own cached one), never the
project's: `python vllm_check.py CASES.json OUT.json`. CASES.json is a list of `{"name": ..., "argv": ["vllm",
"serve", TARGET, ...]}`, each one export's command line (manifest.json `argv`) or a probe of what specbuild refuses.
Each is judged the way `vllm serve` judges it before it starts a server: the `serve` subcommand's own argparse
parser (vllm/entrypoints/cli/serve.py `ServeSubcommand.subparser_init`) and its `validate`, then
`AsyncEngineArgs.from_cli_args(args).create_engine_config()`, which builds ModelConfig, ParallelConfig,
SchedulerConfig and SpeculativeConfig from the local model directories (the demo's real Hugging Face models); for a
quantized draft also the quantization config the model loader builds from its checkpoint (`get_quant_config`).

Nothing is stood in for a GPU: vLLM's own switch `VLLM_TARGET_DEVICE=cpu` (set here if unset) selects its CPU
platform, so device inference succeeds and the platform checks are the CPU platform's. What that cannot show (a
kernel's compute capability, GPU memory) is checked by vLLM only when the model loads, which this script never does.

OUT.json: `{"engine": "vllm", "version": ..., "facts": {...}, "cases": [{"name", "accepted", "error",
"resolved"}]}`; `facts` are the Literal choices and tables that specbuild's export names (read from vLLM's code).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import typing
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _literal_values(alias: object) -> list[str]:
    """Every string of a (possibly nested) typing.Literal."""
    values: list[str] = []
    for arg in typing.get_args(alias):
        if isinstance(arg, str):
            values.append(arg)
        else:
            values += _literal_values(arg)
    return values


def _facts() -> dict[str, Any]:
    import vllm
    from vllm.config.cache import CacheDType
    from vllm.config.model import ModelDType
    from vllm.config.speculative import SpeculativeMethod
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.model_executor.layers.quantization.modelopt import QUANT_ALGOS

    return {"version": vllm.__version__, "speculative_methods": _literal_values(SpeculativeMethod),
            "cache_dtypes": _literal_values(CacheDType), "model_dtypes": _literal_values(ModelDType),
            "quantization_methods": list(QUANTIZATION_METHODS), "modelopt_quant_algos": list(QUANT_ALGOS),
            "eagle3_targets": _eagle3_targets()}


def _eagle3_targets() -> dict[str, bool | None]:
    """Per HF architecture in $SPECBUILD_ARCHITECTURES (a JSON list): whether vLLM's model class for it implements
    SupportsEagle3, without which gpu_model_runner refuses an EAGLE-3 draft ("Model does not support EAGLE3
    interface ..."); None where vLLM has no class for the architecture."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    found: dict[str, bool | None] = {}
    for arch in json.loads(os.environ.get("SPECBUILD_ARCHITECTURES", "[]")):
        cls = ModelRegistry._try_load_model_cls(arch)
        found[arch] = None if cls is None else bool(supports_eagle3(cls))
    return found


def _parser() -> tuple[Any, Any]:
    """The `vllm` CLI's parser with its `serve` subcommand, as vllm/entrypoints/cli/main.py builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return parser, command


def _resolved(config: Any) -> dict[str, Any]:
    """What the engine config says, in the spec's terms."""
    model, parallel, scheduler = config.model_config, config.parallel_config, config.scheduler_config
    out: dict[str, Any] = {
        "model": model.model, "served_model_name": model.served_model_name,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size, "max_model_len": model.max_model_len,
        "max_num_seqs": scheduler.max_num_seqs, "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "dtype": str(model.dtype).removeprefix("torch."), "trust_remote_code": model.trust_remote_code,
        "per_request_spec_decode_metrics": config.observability_config.per_request_spec_decode_metrics,
        "speculative": None,
    }
    spec = config.speculative_config
    if spec is not None:
        draft = spec.draft_model_config
        out["speculative"] = {
            "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens, "model": spec.model,
            "quantization": draft.quantization if draft is not None else None,
            "draft_max_model_len": draft.max_model_len if draft is not None else None,
            "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
            "prompt_lookup_max": spec.prompt_lookup_max, "prompt_lookup_min": spec.prompt_lookup_min,
            "kv_cache_dtype": getattr(spec, "kv_cache_dtype", None),
            "draft_sample_method": getattr(spec, "draft_sample_method", None),
            "k_by_batch_size": _k_by_batch_size(spec, scheduler.max_num_seqs),
        }
    return out


def _k_by_batch_size(spec: Any, max_num_seqs: int) -> list[int] | None:
    """K per running batch size 1..max_num_seqs as vLLM's scheduler looks it up (vllm/v1/core/sched/scheduler.py
    builds `dynamic_sd_lookup` with build_dynamic_sd_schedule_lookup from num_speculative_tokens_per_batch_size,
    after VllmConfig may have switched it off); None when vLLM runs one K at any load."""
    schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
    if not schedule:
        return None
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return build_dynamic_sd_schedule_lookup(schedule, vllm_max_batch_size=max_num_seqs,
                                            vllm_num_speculative_tokens=spec.num_speculative_tokens)[1:]


def _draft_quant_config(config: Any) -> str | None:
    """The quantization config class vLLM's model loader builds from a quantized draft's checkpoint config
    (vllm/model_executor/model_loader/weight_utils.py `get_quant_config`, the loader's first step; it reads
    config.json's quantization_config and refuses an algorithm its class lacks), without loading a weight."""
    from vllm.model_executor.model_loader.weight_utils import get_quant_config

    draft = config.speculative_config.draft_model_config
    if draft is None or draft.quantization is None:
        return None
    return type(get_quant_config(draft, config.load_config)).__name__


def judge(parser: Any, command: Any, argv: list[str]) -> dict[str, Any]:
    """Parse `argv` (`vllm serve ...`) and build the engine config; an argparse exit or an exception is a refusal,
    with vLLM's own message."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    assert argv[:2] == ["vllm", "serve"], argv
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv[1:])
        command.validate(args)
        if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does
            args.model = args.model_tag
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER)
        resolved = _resolved(config)
        if resolved["speculative"] is not None:
            resolved["speculative"]["quant_config"] = _draft_quant_config(config)
    except SystemExit as exit_:
        errors = [line for line in stderr.getvalue().splitlines() if ": error: " in line]  # not the usage text
        return {"accepted": False, "error": f"argparse exit {exit_.code}: "
                + (errors[-1] if errors else stderr.getvalue().strip()[-2000:])}
    except Exception as err:  # vLLM's refusal (ValueError, pydantic ValidationError, ...)
        return {"accepted": False, "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=-4)}
    return {"accepted": True, "error": None, "resolved": resolved}


def main() -> None:
    cases_path, out_path = sys.argv[1], sys.argv[2]
    with open(cases_path, encoding="utf-8") as handle:
        cases = json.load(handle)
    facts = _facts()
    parser, command = _parser()
    results = [{"name": case["name"], **judge(parser, command, case["argv"])} for case in cases]
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump({"engine": "vllm", "version": facts["version"], "facts": facts, "cases": results}, handle,
                  indent=1, default=str)


if __name__ == "__main__":
    main()
