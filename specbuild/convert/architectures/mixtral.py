"""Mixtral: Mistral attention with a mixture of experts in every layer, under TensorRT-LLM's `LLaMAForCausalLM`.

Facts from NVIDIA/TensorRT-LLM (1.x engine flow), shared with Qwen3-MoE (`qwen3.py`):
- `MODEL_MAP['MixtralForCausalLM'] = LLaMAForCausalLM` (tensorrt_llm/models/__init__.py @02267d3d).
- `LLaMAConfig.from_hugging_face` (tensorrt_llm/models/llama/config.py @04100fd0): for model_type mixtral,
  `hidden_act` becomes "swiglu" and the MoE normalisation RENORMALIZE; `moe.num_experts` = HF `num_local_experts`,
  `moe.top_k` = `num_experts_per_tok`; `intermediate_size` is HF's (each expert's); `moe` is serialised with
  `MoeConfig.to_dict()` (dataclasses.asdict).
- `MixtureOfExperts` (tensorrt_llm/layers/moe.py @03961722): `mlp.router` is a float32 RowLinear (hidden ->
  num_experts, never TP-split) read from `block_sparse_moe.gate`; `mlp.fc` is `MOEWeightWrapper` of shape
  (experts_per_node, 2 * inter / moe_tp, hidden) whose sources are `experts.{e}.w3` for every expert, then
  `experts.{e}.w1` ("the left matrix is a linear projection, the right the gating value"), each split on its output
  dim and fused as cat(stack(w3), stack(w1), dim=-2); `mlp.proj` stacks `experts.{e}.w2` split on dim 1.
- `Mapping` (tensorrt_llm/mapping.py, 1.x): with neither moe_tp_size nor moe_ep_size given (specbuild writes
  neither), moe_tp_size = tp_size and moe_ep_size = 1: every rank holds every expert, each one's intermediate dim
  split by tp.
- `MoeConfig` fields (tensorrt_llm/layers/moe.py, the 1.x dataclass with device-limited routing): num_experts,
  shared_expert_intermediate_size, top_k, normalization_mode (0 NONE: softmax over all experts, then the top-k
  probabilities as they are; 1 RENORMALIZE: softmax over the top-k logits), sparse_mixer_epsilon, tp_mode,
  device_limited_n_group, device_limited_topk_group, device_limited_routed_scaling_factor.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import torch

from specbuild.convert.architectures.base import register
from specbuild.convert.architectures.llama import Mistral
from specbuild.convert.mapping import TensorMapping
from specbuild.convert.sharding import Rank, fuse_experts, stack_experts
from specbuild.errors import CheckpointError

#: MoeConfig.ExpertScaleNormalizationMode values (tensorrt_llm/layers/moe.py).
NORMALIZE_NONE, NORMALIZE_RENORMALIZE = 0, 1


def moe_config(num_experts: int, top_k: int, normalization_mode: int) -> dict[str, Any]:
    """TensorRT-LLM's `moe` dict (MoeConfig.to_dict()), every 1.x field written out (num_experts 0: a dense model)."""
    return {
        "num_experts": num_experts,
        "shared_expert_intermediate_size": 0,
        "top_k": top_k,
        "normalization_mode": normalization_mode,
        "sparse_mixer_epsilon": 0.01,
        "tp_mode": 0,
        "device_limited_n_group": 0,
        "device_limited_topk_group": 0,
        "device_limited_routed_scaling_factor": 1.0,
    }


class MixtureOfExperts:
    """What Mixtral and Qwen3-MoE share: the router and experts of every layer, the `moe` config dict. A family
    names its HF tensors (`moe_module`, `expert_names`) and its routing normalisation."""

    experts: int
    top_k: int
    expert_intermediate: int
    hidden: int
    #: The HF module under `model.layers.{l}.` holding the router (`gate`) and the `experts`, and each expert's
    #: up (linear), gate (activated) and down projections.
    moe_module: ClassVar[str]
    expert_names: ClassVar[tuple[str, str, str]]
    #: The config.json field holding each expert's intermediate size.
    expert_intermediate_field: ClassVar[str]

    def normalization_mode(self) -> int:
        raise NotImplementedError

    def moe_config(self) -> dict[str, Any]:
        return moe_config(self.experts, self.top_k, self.normalization_mode())

    @property
    def dense_intermediate(self) -> None:
        """Decoder's tp rule for the dense MLP does not apply: no layer has one (an HF `intermediate_size` beside
        `moe_intermediate_size`, as Qwen3-MoE configs carry, is never split); the experts' size is checked below."""
        return None

    def parallelism_problems(self, tp_size: int, pp_size: int) -> list[str]:
        problems = super().parallelism_problems(tp_size, pp_size)  # type: ignore[misc]  # the Decoder's
        if self.expert_intermediate % tp_size:  # moe_tp = tp splits each expert's intermediate dim (mapping.py, 1.x)
            problems.append(f"tp_size {tp_size} does not divide the experts' intermediate size "
                            f"{self.expert_intermediate} ({self.expert_intermediate_field})")
        return problems

    def check_routing(self, config_path: Any) -> None:
        if not 0 < self.top_k <= self.experts:
            raise CheckpointError(
                f"{config_path}: num_experts_per_tok {self.top_k} must be between 1 and the model's {self.experts} "
                "experts", hint="check that config.json belongs to these weights")

    def add_mlp(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        """Decoder's MLP hook: the router (float32, whole), fused up+gate experts and stacked down experts of one
        layer, in place of the dense MLP."""
        h, inter, count, tp = self.hidden, self.expert_intermediate, self.experts, rank.tp_size
        module = src + self.moe_module
        up, gate, down = (module + ".experts.{e}." + name + ".weight" for name in self.expert_names)
        router = module + ".gate.weight"
        m.add(dst + "mlp.router.weight", (count, h), {router: (count, h)}, dtype=torch.float32)
        fc_sources = {name.format(e=e): (inter, h) for name in (up, gate) for e in range(count)}
        m.add(dst + "mlp.fc.weight", (count, 2 * inter // tp, h), fc_sources, partial(fuse_experts, rank=rank))
        m.add(dst + "mlp.proj.weight", (count, h, inter // tp), {down.format(e=e): (h, inter) for e in range(count)},
              partial(stack_experts, rank=rank, dim=1))


@register
class Mixtral(MixtureOfExperts, Mistral):
    """Mixtral 8x7B / 8x22B and anything with its tensor names: Mistral's attention (and window), experts in every
    layer, routing renormalised over the top-k experts."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("MixtralForCausalLM",)
    moe_module: ClassVar[str] = "block_sparse_moe"
    expert_names: ClassVar[tuple[str, str, str]] = ("w3", "w1", "w2")
    expert_intermediate_field: ClassVar[str] = "intermediate_size"

    def __init__(self, config: dict[str, Any], config_path: Any) -> None:
        super().__init__(config, config_path)
        self.experts = self.field("num_local_experts")
        self.top_k = self.field("num_experts_per_tok")
        self.expert_intermediate = self.intermediate
        self.check_routing(config_path)

    def normalization_mode(self) -> int:
        return NORMALIZE_RENORMALIZE

    def family_config(self) -> dict[str, Any]:
        return {**super().family_config(), "hidden_act": "swiglu", "moe": self.moe_config()}
