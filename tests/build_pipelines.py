"""Converted checkpoints and pipeline specs for the build tests: tiny Llama target/draft pairs and a Medusa
checkpoint, converted once per test session by the real converter, then linked into each test's pipeline."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

from specbuild.contracts.engine_info import engine_roles
from specbuild.spec import PipelineSpec, load_spec
from tests.tiny_models import make_checkpoint

HIDDEN, VOCAB = 64, 1000


def _write_heads(directory: Path, heads: int) -> Path:
    """FasterDecoding-format Medusa heads (medusa_lm_head.safetensors + config.json)."""
    gen = torch.Generator().manual_seed(0)
    state = {}
    for h in range(heads):
        state[f"{h}.0.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=gen).half()
        state[f"{h}.0.linear.bias"] = torch.randn(HIDDEN, generator=gen).half()
        state[f"{h}.1.weight"] = torch.randn(VOCAB, HIDDEN, generator=gen).half()
    directory.mkdir(parents=True)
    save_file(state, directory / "medusa_lm_head.safetensors")
    (directory / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": 1}))
    return directory


def convert_all(root: Path) -> dict[str, Path]:
    """HF sources and converted checkpoints: target, draft, draft_vocab (another vocabulary), medusa (3 heads)."""
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint

    hf = {
        "target": make_checkpoint(root / "hf" / "target", "llama", seed=0),
        "draft": make_checkpoint(root / "hf" / "draft", "llama", seed=1, num_hidden_layers=2),
        "draft_vocab": make_checkpoint(root / "hf" / "draft_vocab", "llama", seed=2, vocab_size=1024,
                                       num_hidden_layers=2),
    }
    heads = _write_heads(root / "hf" / "heads", 3)
    out = {name: root / "ckpt" / name for name in (*hf, "medusa")}
    for name, source in hf.items():
        convert_checkpoint(ConvertRequest(name, source, out[name]))
    convert_checkpoint(ConvertRequest("medusa", hf["target"], out["medusa"], medusa_heads=heads, medusa_tree_nodes=4))
    return {**{f"hf_{k}": v for k, v in hf.items()}, "hf_heads": heads, **out}


def write_pipeline(
    root: Path,
    models: dict[str, Path],
    mode: str = "draft_target",
    *,
    speculative: dict[str, Any] | None = None,
    build: dict[str, Any] | None = None,
    choices: Any = None,
) -> PipelineSpec:
    """A spec file in `root` whose output_dir is `root/out`; checkpoints are not placed (see `place`)."""
    data: dict[str, Any] = {
        "name": "p",
        "output_dir": str(root / "out"),
        "target": {"model": str(models["hf_target"])},
        "speculative": {"mode": mode, **(speculative or {})},
        "build": {"max_batch_size": 2, "max_input_len": 32, "max_output_len": 16, **(build or {})},
    }
    if mode == "draft_target":
        data["draft"] = {"model": str(models["hf_draft"])}
    if mode == "medusa":
        data["medusa"] = {"heads": str(models["hf_heads"]), "choices": choices or [[0], [0, 0], [1], [0, 0, 0]]}
    path = root / "pipeline.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def place(spec: PipelineSpec, role: str, checkpoint: Path) -> Path:
    """Put a converted checkpoint where `convert` would have written the spec's `role` (hard links)."""
    destination = spec.checkpoint_dir(role)
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(checkpoint, destination, copy_function=os.link)
    return destination


def place_all(spec: PipelineSpec, models: dict[str, Path]) -> None:
    for role in engine_roles(spec):
        place(spec, role, models[role])


def edit_checkpoint_config(directory: Path, **changes: Any) -> None:
    """Change fields of a placed checkpoint's config.json (a fresh file, not the shared hard link)."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        target = config
        *parents, last = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    path.unlink()
    path.write_text(json.dumps(config, indent=2))
