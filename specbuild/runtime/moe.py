"""A mixture-of-experts MLP as TensorRT-LLM's MixtureOfExperts layer computes it (Mixtral, Qwen3-MoE).

Facts from NVIDIA/TensorRT-LLM tensorrt_llm/layers/moe.py @03961722: the router is a float32 linear layer
`mlp.router.weight` [num_experts, hidden] applied to the hidden state cast to float32 ("Routing is sensitive since
it conditions what experts are used"); `normalization_mode` RENORMALIZE takes the top-k router logits and a softmax
over those k (the same weights as a softmax over every expert renormalised over the top k: Mixtral, and Qwen3-MoE with
norm_topk_prob), NONE a softmax over every expert and then its top-k probabilities as they are; every expert's
`mlp.fc.weight` [num_experts, 2 * inter, hidden] holds the linear rows first and the activated (gate) rows second
("The left matrix is a linear projection (no activation applied), the right matrix is the gating value"), and
`mlp.proj.weight` [num_experts, hidden, inter]. Written here anew; the token's output is the routing-weighted sum of
its top-k experts' `proj(x_up * act(x_gate))`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specbuild.runtime.config import ModelConfig, RuntimeCheckpointError


class MixtureOfExperts(nn.Module):
    """Per token, the top-k experts by the router, their outputs weighted and summed. The tokens of a forward are
    grouped by expert, so a batch runs one matmul pair per expert it routes to rather than one per token."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], prefix: str,
                 act: Callable[[torch.Tensor], torch.Tensor], gated: bool) -> None:
        super().__init__()
        names = ("router.weight", "fc.weight", "proj.weight")
        missing = [prefix + n for n in names if prefix + n not in tensors]
        if missing:
            raise RuntimeCheckpointError(f"tensor {missing[0]!r} is missing (a mixture-of-experts layer)")
        if cfg.mlp_bias:
            raise RuntimeCheckpointError(f"{prefix}: experts with biases (mlp_bias) are not supported")
        self.register_buffer("router_t", tensors[prefix + "router.weight"].float().t().contiguous())  # [H, E]
        # Input-major [E, in, out] so that an expert's tokens are one matmul each.
        self.register_buffer("fc_t", tensors[prefix + "fc.weight"].transpose(1, 2).contiguous())  # [E, H, 2I or I]
        self.register_buffer("proj_t", tensors[prefix + "proj.weight"].transpose(1, 2).contiguous())  # [E, I, H]
        self.top_k, self.renormalize = cfg.moe_top_k, cfg.moe_normalization == "renormalize"
        self.act, self.gated = act, gated

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [N, k] float32, expert ids [N, k]) for tokens x [N, H]."""
        logits = torch.matmul(x.float(), self.router_t)
        if self.renormalize:
            values, experts = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(values, dim=-1), experts
        return torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.matmul(x, self.fc_t[e])
        if self.gated:
            up, gate = hidden.chunk(2, dim=-1)
            hidden = up * self.act(gate)
        else:
            hidden = self.act(hidden)
        return torch.matmul(hidden, self.proj_t[e])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, experts = self.route(flat)
        out = torch.zeros_like(flat)
        if flat.shape[0] == 1:  # a single token (the common decode step): its k experts, no grouping needed
            for slot, e in enumerate(experts[0].tolist()):  # the layer's one host sync; weights stay on the device
                out += self.expert(e, flat) * weights[0, slot].to(flat.dtype)
            return out.reshape(shape)
        # The (token, slot) pairs sorted by expert, and each expert's count: one host sync per layer, not one per
        # expert. A stable sort keeps each expert's tokens in order, so the sums are those of a per-expert scan.
        order = experts.flatten().argsort(stable=True)
        counts = torch.bincount(experts.flatten(), minlength=self.fc_t.shape[0]).tolist()
        flat_weights = weights.flatten().to(flat.dtype)
        for e, pairs in enumerate(order.split(counts)):
            if pairs.numel():
                tokens = pairs // self.top_k
                out.index_add_(0, tokens, self.expert(e, flat[tokens]) * flat_weights[pairs, None])
        return out.reshape(shape)

