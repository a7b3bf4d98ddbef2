"""Self-drafting in the reference runtime: the target's own first L layers propose, the whole target verifies, and
the two share the weights and the KV cache of those L layers instead of holding copies.

Why the cache can be shared: the target's verify forward computes layers 0..L-1 for every token it verifies, with
the very weight tensors the draft uses, so the K/V the draft would keep for a committed token in those layers are
the ones the target already holds. The draft therefore needs only its own speculative slots, which it writes into
the target's cache after the committed prefix (slots the verify forward overwrites next), through a cache alias
with lengths of its own (`KVCache.alias`). An adapter (`specbuild draft train`: one more decoder layer after layer
L-1, trained by distillation) adds one cache layer of its own, stored after the target's layers; the target's
forward fills it for every token it computes (`CausalLM.forward(side_layers=...)`), so the draft never recomputes
a committed token. What this costs over plain decoding: the adapter's parameters and one layer of K/V per token
(nothing at all without an adapter), where a separate copy of the draft costs L (+1) layers of both.

The TensorRT path cannot do this: draft-target runs two engines, each with its own weights and KV cache
(`draft.source: target_layers` in the spec says so). A checkpoint `convert` wrote for the self-draft is still an
ordinary draft there, and here `self_draft_model` takes its adapter layer from it.

Acceptance is the runtime's (`specbuild.runtime.acceptance`): greedy output equals plain greedy decoding; with a
temperature, modified rejection sampling keeps the target's distribution.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from specbuild.runtime.acceptance import AcceptRule, accept_greedy, accept_rejection_sampling
from specbuild.runtime.checkpoint import load_checkpoint
from specbuild.runtime.config import RuntimeCheckpointError
from specbuild.runtime.kv_cache import KVCache
from specbuild.runtime.model import CausalLM, DecoderLayer
from specbuild.runtime.proposers import ModelProposer
from specbuild.runtime.sampling import SamplingParams, draw, probabilities
from specbuild.runtime.sequence import (
    GenerationResult,
    GenerationStats,
    RoundLoop,
    SequenceState,
    StopCriteria,
    check_prompts,
)
from specbuild.runtime.speculative import DraftTargetConfig, best_k
from specbuild.self_draft.adapter_format import CONFIG_NAME as ADAPTER_CONFIG

__all__ = ["generate_self_draft", "self_draft_model", "self_draft_proposer", "shared_draft", "shared_memory"]

# Every config field that must agree between the target and a self-draft checkpoint (the rest is layer count,
# quantization and parallelism, which the loaded tensors no longer depend on).
_SAME_FIELDS = ("vocab_size", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                "hidden_act", "norm_epsilon", "rotary_base", "rotary_dim", "qkv_bias", "dense_bias", "mlp_bias",
                "family", "sliding_window", "attention_windows", "qk_norm", "attn_logit_softcap",
                "final_logit_softcap", "inter_layernorms", "rotary_base_local", "moe_num_experts", "moe_top_k",
                "moe_normalization")


def _check_layers(target: CausalLM, num_layers: int) -> None:
    total = target.config.num_layers
    if not 1 <= num_layers < total:
        raise ValueError(f"a self-draft keeps 1 to {total - 1} of the target's {total} layers (got {num_layers})")


def adapter_layer(target: CausalLM, num_layers: int, checkpoint: Path) -> DecoderLayer:
    """The adapter of a self-draft checkpoint (`convert` with draft.adapter writes it as layer `num_layers`), after
    checking that the checkpoint is a self-draft of this very target: the same shape of model, num_layers + 1
    layers, and its layers below `num_layers` the target's own tensors (a quantized draft's are not)."""
    _check_layers(target, num_layers)
    if (Path(checkpoint) / ADAPTER_CONFIG).is_file():
        raise RuntimeCheckpointError(
            f"{checkpoint}: this is an adapter directory (`specbuild draft train`); the runtime takes the self-draft "
            "checkpoint `convert` writes from it (draft.adapter in the spec, or ConvertRequest(self_draft_layers=L, "
            "self_draft_adapter=DIR)), whose layer L is the adapter in the runtime's tensor layout")
    loaded = load_checkpoint(Path(checkpoint), dtype=target.dtype)
    path = loaded.directory / "config.json"
    config = loaded.model_config
    for name in _SAME_FIELDS:
        if getattr(config, name) != getattr(target.config, name):
            raise RuntimeCheckpointError(f"{path}: {name} is {getattr(config, name)!r}, the target's is "
                                         f"{getattr(target.config, name)!r}: not a self-draft of this target")
    if config.num_layers != num_layers + 1:
        raise RuntimeCheckpointError(
            f"{path}: num_hidden_layers is {config.num_layers}; a self-draft of {num_layers} layers with an adapter "
            f"has {num_layers + 1} (the adapter is its last layer)")
    if config.quant_algo is not None or config.kv_cache_quant_algo is not None:
        raise RuntimeCheckpointError(f"{path}: a quantized self-draft cannot share the target's weights (its "
                                     "layers are not the target's tensors); convert it without draft.quantization")
    for index in range(num_layers):
        theirs = dict(DecoderLayer(config, loaded.tensors, index).named_buffers())
        for name, tensor in target.layers[index].named_buffers():
            other = theirs.get(name)
            if other is None or not torch.equal(other.to(tensor.device), tensor):  # named_buffers skips None
                raise RuntimeCheckpointError(
                    f"{path}: layer {index}'s {name} is not the target's: this checkpoint was not converted from "
                    "this target (draft.source: target_layers)")
    prefix = f"transformer.layers.{num_layers}."
    missing = [n for n in ("attention.qkv.weight", "attention.dense.weight", "mlp.proj.weight")
               if prefix + n not in loaded.tensors]
    if missing:
        raise RuntimeCheckpointError(f"{path}: tensor {prefix + missing[0]!r} is missing (the adapter layer)")
    return DecoderLayer(config, loaded.tensors, num_layers).to(target.device)


def _draft(target: CausalLM, num_layers: int, adapter: DecoderLayer | None) -> CausalLM:
    """A CausalLM over the target's own modules: layers 0..L-1 are the target's layer objects, the embedding,
    final norm and LM head its very tensors (registered again, never copied)."""
    _check_layers(target, num_layers)
    tensors = {"transformer.vocab_embedding.weight": target.vocab_embedding, "lm_head.weight": target.lm_head,
               "transformer.ln_f.weight": target.ln_f.weight}
    if target.ln_f.bias is not None:
        tensors["transformer.ln_f.bias"] = target.ln_f.bias
    if target.position_embedding is not None:
        tensors["transformer.position_embedding.weight"] = target.position_embedding
    layers = [*target.layers[:num_layers], *([adapter] if adapter is not None else [])]
    config = dataclasses.replace(target.config, num_layers=len(layers), num_medusa_heads=0, num_medusa_layers=0)
    draft = CausalLM(dataclasses.replace(config, num_layers=0), tensors)
    draft.config = config
    draft.layers = torch.nn.ModuleList(layers)
    draft.rope = target.rope
    return draft.eval()


def shared_draft(target: CausalLM, num_layers: int, adapter: DecoderLayer | None
                 ) -> tuple[CausalLM, tuple[int, list[torch.nn.Module]] | None]:
    """The draft that shares the target's KV cache, and the side layers the target's forward runs to fill the
    adapter's cache layer (stored after the target's last: the same tensors, another cache index)."""
    side = None
    if adapter is not None:
        side = copy.copy(adapter)
        side.index = target.config.num_layers
    return _draft(target, num_layers, side), (None if side is None else (num_layers, [side]))


def self_draft_proposer(target: CausalLM, num_layers: int, max_draft_len: int,
                        adapter: Path | str | None = None) -> ModelProposer:
    """The serving engine's self-draft: the target's first `num_layers` layers (+ the adapter layer of the
    self-draft checkpoint `adapter`) drafting K-token chains in the target's own KV cache, weights shared."""
    return self_draft_proposers(target, num_layers, adapter)(max_draft_len)


def self_draft_proposers(target: CausalLM, num_layers: int,
                         adapter: Path | str | None = None) -> Callable[[int], ModelProposer]:
    """K -> `self_draft_proposer(target, num_layers, K, adapter)`, the adapter read once for every K (tune
    measures several K on the engine the server runs)."""
    layer = adapter_layer(target, num_layers, Path(adapter)) if adapter is not None else None
    draft, side = shared_draft(target, num_layers, layer)
    return lambda max_draft_len: ModelProposer(draft, max_draft_len, shared=True, side_layers=side)


def self_draft_model(target: CausalLM, num_layers: int, adapter: Path | None = None) -> CausalLM:
    """The self-draft of `target` as a model of its own: its first `num_layers` layers, final norm and LM head,
    sharing the target's weight tensors (no copies), then the adapter layer of `adapter` (a self-draft checkpoint
    `convert` wrote with draft.adapter) when given. Its own `new_cache` holds its own K/V; `generate_self_draft`
    shares the target's instead."""
    layer = adapter_layer(target, num_layers, adapter) if adapter is not None else None
    return _draft(target, num_layers, layer)


def shared_memory(target: CausalLM, draft: CausalLM) -> dict[str, int]:
    """What a self-draft adds to plain decoding with the target, shared (this module) or copied (two engines):
    parameters, and K/V bytes per token of one sequence."""
    target_ids = {t.data_ptr() for t in target.buffers()}
    own = sum(t.numel() for t in draft.buffers() if t.data_ptr() not in target_ids)
    layer_kv = 2 * target.config.num_kv_heads * target.config.head_dim * target.dtype.itemsize
    extra_layers = draft.config.num_layers - sum(1 for layer in draft.layers if layer in set(target.layers))
    return {"shared_extra_params": own, "shared_extra_kv_bytes_per_token": extra_layers * layer_kv,
            "copied_extra_params": sum(t.numel() for t in draft.buffers()),
            "copied_extra_kv_bytes_per_token": draft.config.num_layers * layer_kv}


class _SelfDraftRun(RoundLoop):
    """A batch decoded to completion with one KV cache. Each round: K draft forwards (one token per row, over the
    cache alias), then one target forward over [pending, d1..dK] per row, which also fills the adapter's cache
    layer; rows commit what they accepted. Rows of different lengths share the forwards (each row's own slots and
    positions); rows that finished, or need fewer drafts, pad their block and commit nothing past their own."""

    def __init__(self, target: CausalLM, num_layers: int, adapter: DecoderLayer | None,
                 prompts: Sequence[Sequence[int]], params: SamplingParams, stop: StopCriteria,
                 config: DraftTargetConfig, accept: AcceptRule) -> None:
        self.target, self.params, self.stop, self.config, self.accept = target, params, stop, config, accept
        self.seqs = [SequenceState(list(p)) for p in prompts]
        total = target.config.num_layers
        self.draft, self.side = shared_draft(target, num_layers, adapter)
        k = config.num_draft_tokens
        capacity = max(len(p) for p in prompts) + stop.max_new_tokens + k + 2
        c = target.config
        self.cache = KVCache(total + (adapter is not None), len(prompts), c.num_kv_heads, c.head_dim, capacity,
                             target.dtype, target.device)
        self.draft_cache = self.cache.alias()
        self.stats = GenerationStats()
        self.generators = [params.for_row(i).generator(target.device) for i in range(len(prompts))]
        self.alpha = [config.prior_acceptance] * len(prompts)
        self.cost_ratio = config.cost_ratio if config.cost_ratio is not None else self.draft.config.num_layers / total

    def _ids(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        width = max(1, max(len(r) for r in rows))
        return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long,
                            device=self.target.device)

    def prefill(self) -> None:
        """Every prompt but its last token into the cache (one forward, shorter prompts padded at the end)."""
        heads = [s.prompt[:-1] for s in self.seqs]
        if any(heads):
            self.target(self._ids(heads), self.cache, side_layers=self.side)
            self.cache.advance(torch.tensor([len(h) for h in heads], device=self.cache.device))
            self.stats.target_forwards += 1

    def round_k(self, index: int, seq: SequenceState) -> int:
        if seq.done:
            return 0
        k = self.config.num_draft_tokens
        if self.config.adaptive:
            k = best_k(self.alpha[index], self.cost_ratio, k)
        return max(0, min(k, self.stop.max_new_tokens - len(seq.output) - 1))

    def propose(self, ks: list[int]) -> tuple[list[list[int]], torch.Tensor | None]:
        """max(ks) draft forwards from each row's pending token; returns each row's drafts (and the draft's
        distributions [B, K, V] when sampling)."""
        self.draft_cache.lengths.copy_(self.cache.lengths)
        current = [s.tokens[-1] for s in self.seqs]
        drafts: list[list[int]] = [[] for _ in self.seqs]
        dists = []
        for step in range(max(ks)):
            logits = self.draft(self._ids([[t] for t in current]), self.draft_cache).logits[:, 0]
            self.stats.draft_forwards += 1
            if self.params.greedy:
                chosen = logits.argmax(-1).tolist()
            else:
                q = probabilities(logits, self.params)
                dists.append(q)
                chosen = [int(draw(q[i], self.generators[i])) for i in range(len(self.seqs))]
            for i, token in enumerate(chosen):
                if step < ks[i]:
                    drafts[i].append(token)
            current = chosen
            if step + 1 < max(ks):
                self.draft_cache.advance(1)
        return drafts, torch.stack(dists, 1) if dists else None

    def round(self) -> None:
        ks = [self.round_k(i, s) for i, s in enumerate(self.seqs)]
        drafts, q = self.propose(ks) if max(ks) else ([[] for _ in self.seqs], None)
        blocks = [[s.tokens[-1], *d] for s, d in zip(self.seqs, drafts, strict=True)]
        logits = self.target(self._ids([b + [0] * (max(ks) + 1 - len(b)) for b in blocks]), self.cache,
                             side_layers=self.side).logits
        self.stats.target_forwards += 1
        commits = []
        for i, seq in enumerate(self.seqs):
            if seq.done:
                commits.append(0)
                continue
            k = ks[i]
            rows = logits[i, : k + 1]
            p = rows if self.params.greedy else probabilities(rows, self.params)
            q_row = q[i, :k] if q is not None else p[:k]
            accepted, token = self.accept(p, q_row, torch.tensor(drafts[i], dtype=torch.long, device=p.device),
                                          self.generators[i])
            if k:
                self.stats.record_acceptance(k, accepted)
                self.alpha[i] += self.config.smoothing * (accepted / k - self.alpha[i])
            commits.append(accepted + 1)
            for emitted in [*drafts[i][:accepted], token]:
                if not seq.emit(emitted, self.stop):
                    break
        self.cache.advance(torch.tensor(commits, device=self.cache.device))


@torch.no_grad()
def generate_self_draft(
    target: CausalLM,
    num_layers: int,
    prompts: Sequence[Sequence[int]],
    config: DraftTargetConfig = DraftTargetConfig(),
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
    adapter: Path | None = None,
    accept: AcceptRule | None = None,
) -> GenerationResult:
    """Draft-target decoding with the target's first `num_layers` layers (plus the adapter of the self-draft
    checkpoint `adapter`) as the draft, weights and KV cache shared; stats as `generate_draft_target`'s (target
    and draft forwards, acceptance by position). `accept` overrides the acceptance rule (tests)."""
    check_prompts(prompts, target.config.vocab_size)
    layer = adapter_layer(target, num_layers, adapter) if adapter is not None else None
    _check_layers(target, num_layers)
    rule = accept or (accept_greedy if params.greedy else accept_rejection_sampling)
    return _SelfDraftRun(target, num_layers, layer, prompts, params, stop, config, rule).run()
