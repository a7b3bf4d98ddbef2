"""A short CUDA check of the reference runtime, for a machine with an NVIDIA GPU.

Prepare on any machine (converts the demo checkpoints and picks prompts):
    .venv/bin/python bench/runtime_cuda_check.py prepare gpu_check
Run where a GPU is (needs only torch and safetensors beside this repository):
    python3 bench/runtime_cuda_check.py run gpu_check OUT_DIR

It checks that the runtime on CUDA gives the CPU's logits (float32: max abs difference; float16: argmax
agreement), that greedy draft-target and Medusa output on CUDA equals plain greedy output there, that seeded
sampling runs on CUDA, and measures tokens/s of each method. Figures go to OUT_DIR/cuda_check.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def prepare(folder: Path) -> None:
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.demo.models import build_demo_models, heldout_texts
    from specbuild.tokenizer import load_tokenizer

    models = build_demo_models(REPO / "demo" / "models", progress=False)
    # The Medusa checkpoint doubles as the plain target (its base tensors are the target's): one copy travels.
    convert_checkpoint(ConvertRequest("draft", models["draft"], folder / "draft", "float32"))
    convert_checkpoint(ConvertRequest("medusa", models["target"], folder / "medusa", "float32",
                                      medusa_heads=models["medusa-heads"], medusa_tree_nodes=24))
    tok = load_tokenizer(models["target"])
    prompts = [tok.encode(t, add_special_tokens=False)[:24] for t in heldout_texts()[:8]]
    (folder / "prompts.json").write_text(json.dumps(prompts))


def _timed(fn):  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def run(folder: Path, out: Path) -> dict[str, object]:
    from specbuild.medusa.tree import load_choices
    from specbuild.runtime.generation import generate
    from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sampling import SamplingParams
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target

    assert torch.cuda.is_available(), "no CUDA device"
    prompts: list[list[int]] = json.loads((folder / "prompts.json").read_text())
    report: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    cpu = CausalLM.from_checkpoint(folder / "medusa")
    ids = torch.tensor([p[:16] for p in prompts])
    reference = cpu(ids, cpu.new_cache(len(prompts), 32)).logits
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        gpu = CausalLM.from_checkpoint(folder / "medusa", dtype=dtype, device="cuda")
        logits = gpu(ids, gpu.new_cache(len(prompts), 32)).logits.cpu()
        report[f"logits_{dtype}"] = {
            "max_abs_diff_vs_cpu_fp32": float((logits - reference).abs().max()),
            "argmax_agreement": float((logits.argmax(-1) == reference.argmax(-1)).float().mean()),
        }

    medusa = CausalLM.from_checkpoint(folder / "medusa", device="cuda")
    target = medusa  # plain and draft-target decoding ignore the heads
    draft = CausalLM.from_checkpoint(folder / "draft", device="cuda")
    stop = StopCriteria(max_new_tokens=64)
    generate(target, prompts[:1], stop=StopCriteria(max_new_tokens=4))  # warm-up (CUDA context, kernels)
    methods = {
        "plain": lambda p: generate(target, p, stop=stop),
        "draft_target_k4": lambda p: generate_draft_target(target, draft, p, stop=stop, config=DraftTargetConfig(4)),
        "medusa_top24": lambda p: generate_medusa(
            medusa, p, MedusaConfig(tuple(tuple(c) for c in load_choices("mc_sim_7b_top24"))), stop=stop),
    }
    outputs: dict[str, list[list[int]]] = {}
    for name, method in methods.items():
        for batch_name, batch in (("batch1", [[p] for p in prompts]), ("batch8", [prompts])):
            results, seconds = _timed(lambda method=method, batch=batch: [method(b) for b in batch])
            tokens = sum(r.stats.generated_tokens for r in results)
            forwards = sum(r.stats.target_forwards for r in results)
            outputs[f"{name}_{batch_name}"] = [o for r in results for o in r.output_ids]
            report[f"{name}_{batch_name}"] = {"tokens_per_second": tokens / seconds,
                                              "tokens_per_target_forward": tokens / forwards}
    plain = outputs["plain_batch1"]
    report["greedy_outputs_equal_plain"] = {k: v == plain for k, v in outputs.items()}
    sampled = generate_draft_target(target, draft, prompts, SamplingParams(0.8, 50, 0.95, seed=3), stop)
    report["sampling_ok"] = all(len(o) == 64 for o in sampled.output_ids)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_check.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == ["prepare"]:
        prepare(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["run"]:
        print(json.dumps(run(Path(sys.argv[2]), Path(sys.argv[3])), indent=2))
    else:
        sys.exit(__doc__)
