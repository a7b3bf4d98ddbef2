"""FasterDecoding Medusa heads -> vLLM's Medusa checkpoint (config.json + model.safetensors), values unchanged.

Both compute the same thing per head: `x + SiLU(W x + b)` per ResBlock, then a vocabulary projection (FasterDecoding
`medusa/model/medusa_model.py`; vLLM `Medusa`/`ResidualBlock`, see `sources.VLLM_MEDUSA_MODEL`). Only the names
differ, and vLLM needs a config that says bias is present (`medusa_fc_bias`; its default is no bias) and that each
head has its own projection (`original_lm_head: false`). Why convert instead of pointing vLLM at the heads: vLLM
loads `model.safetensors` with its parameter names and reads config.json through MedusaConfig; FasterDecoding's
`medusa_lm_head.safetensors` has neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.contracts.model_fit import MEDUSA_FIT_HINT, medusa_fit_problem
from specbuild.errors import CheckpointError
from specbuild.export.sources import VLLM_MEDUSA_CONFIG, VLLM_MEDUSA_MODEL
from specbuild.medusa.heads_format import KEY_RE, count_heads, heads_file, read_heads

if TYPE_CHECKING:
    import torch

MEDUSA_DIR = "medusa"
"""The converted heads' directory inside an export; --speculative-config's `model` points here."""
WEIGHTS = "model.safetensors"

TENSOR_NAMES = {  # FasterDecoding key kind -> vLLM parameter name (VLLM_MEDUSA_MODEL)
    "linear.weight": "blocks.{head}.layers.{layer}.weight",
    "linear.bias": "blocks.{head}.layers.{layer}.bias",
    "weight": "lm_heads.{head}.weight",
}
CONFIG_SOURCE = VLLM_MEDUSA_CONFIG
MODEL_SOURCE = VLLM_MEDUSA_MODEL


@dataclass
class VllmMedusaHeads:
    """The converted heads, in memory until written."""

    tensors: dict[str, torch.Tensor]
    config: dict[str, Any]
    source: Path
    renamed: dict[str, str]
    """vLLM name -> the FasterDecoding key its values come from."""

    @property
    def num_heads(self) -> int:
        return int(self.config["num_heads"])

    def write(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        save_file(self.tensors, str(directory / WEIGHTS), metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(self.config, indent=2) + "\n", encoding="utf-8")


def _target_sizes(target: Path) -> tuple[int, int]:
    path = Path(target) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        return int(config["hidden_size"]), int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: cannot read the target's hidden_size and vocab_size ({err})",
                              hint="target.model must be a Hugging Face checkpoint directory") from None


def convert_heads(heads: Path, target: Path, *, allow_pickle: bool = False) -> VllmMedusaHeads:
    """Rename every head tensor to vLLM's name, checking the heads fit the target (hidden size, vocabulary)."""
    path = heads_file(heads)
    state = read_heads(path, allow_pickle=allow_pickle)
    num_heads, num_layers = count_heads(state, path)
    hidden, vocab = _target_sizes(target)
    problem = medusa_fit_problem({key: tuple(tensor.shape) for key, tensor in state.items()}, hidden, vocab, target)
    if problem is not None:
        raise CheckpointError(f"{path}: {problem}", hint=MEDUSA_FIT_HINT)
    tensors: dict[str, torch.Tensor] = {}
    renamed: dict[str, str] = {}
    for key in sorted(state):
        match = KEY_RE.match(key)
        assert match is not None  # count_heads accepted every key
        head, layer, kind = int(match[1]), int(match[2]), match[3]
        name = TENSOR_NAMES[kind].format(head=head, layer=layer)
        tensors[name] = state[key].contiguous()
        renamed[name] = key
    dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": hidden,
        "vocab_size": vocab,
        "truncated_vocab_size": vocab,
        "num_heads": num_heads,
        "num_hidden_layers": num_layers,
        "medusa_fc_bias": True,  # FasterDecoding's ResBlock Linear has a bias
        "original_lm_head": False,  # one projection per head, as FasterDecoding's heads carry
        "dtype": dtype,
        "torch_dtype": dtype,  # the older transformers spelling, for vLLM releases pinned to it
    }
    return VllmMedusaHeads(tensors, config, path, renamed)
