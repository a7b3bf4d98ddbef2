"""The EAGLE-3 draft checkpoint: an HF-style directory (`config.json` + `model.safetensors`) that TensorRT-LLM's
PyTorch backend, vLLM and SGLang all load, with one table of its config keys and one of its tensors.

Sources read (the names, shapes and rules below come from them):
- vllm-project/vllm vllm/model_executor/models/llama_eagle3.py @ 00bd1493 (`Eagle3LlamaForCausalLM`: `midlayer.`
  renamed to `layers.0.`, `fc` over `target_hidden_size * 3`, `d2t` loaded as `draft_id_to_target_id`, `t2d`
  skipped, `embed_tokens` optional); vllm/model_executor/models/llama.py (`get_eagle3_aux_hidden_state_layers`
  returns (2, n // 2, n - 3); `LlamaModel.forward` appends `hidden_states + residual` *before* layer idx runs);
  vllm/v1/worker/gpu_model_runner.py (`_get_eagle3_aux_layers_from_config` reads the draft config's top-level
  `eagle_aux_hidden_state_layer_ids` first); vllm/model_executor/models/registry.py (`LlamaForCausalLMEagle3` and
  `Eagle3LlamaForCausalLM` both load this module).
- NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/modeling_speculative.py @ 00679c66 (`Eagle3DecoderLayer`,
  `Eagle3DraftModel`: `embed_tokens` shared with the target unless `target_hidden_size` differs, `d2t` int32 when
  `draft_vocab_size != vocab_size`, `layers.0.*` accepted for `midlayer.*`, lm_head from the target when absent);
  tensorrt_llm/_torch/speculative/eagle3.py @ 001e6700 (`Eagle3SpecMetadata.layers_to_capture` defaults to
  (1, n // 2 - 1, n - 4) and refuses n <= 5; `maybe_capture_hidden_states(layer_id, hidden, residual)` saves
  `hidden + residual` after decoder layer layer_id).
- sgl-project/sglang python/sglang/srt/models/llama_eagle3.py @ 03d5a777 (`LlamaForCausalLMEagle3`, `midlayer`,
  `d2t` "stores diffs between draft id and target id": target = draft + d2t[draft]); python/sglang/srt/models/
  llama.py (`set_eagle3_layers_to_capture`: default [2, n // 2, n - 3], else `eagle_config`'s ids + 1, "for the ith
  layer, it takes the output of the (i-1)th layer").
- NVIDIA/Model-Optimizer modelopt/torch/export/plugins/hf_spec_export.py @ 03713649 (ModelOpt's EAGLE-3 export:
  architectures ["LlamaForCausalLMEagle3"], `eagle_config.eagle_aux_hidden_state_layer_ids`, `use_aux_hidden_state`;
  its tensors are named `layers.0.*`, which every loader above also takes).

Which hidden states feed the draft. Here, as in TensorRT-LLM (`eagle3_layers_to_capture`), ModelOpt and SGLang's
`eagle_config`, layer id i means the **output of decoder layer i** (0-based, before the final norm; for an HF model
that is `output_hidden_states[i + 1]`, except for the last layer whose HF entry is after the final norm). vLLM and
SGLang capture the *input* of layer j, so their own ids are ours + 1 (vLLM id 0 would be the embeddings): vLLM's
default (2, n // 2, n - 3) is TensorRT-LLM's (1, n // 2 - 1, n - 4). `config.json` therefore carries both:
`eagle_config.eagle_aux_hidden_state_layer_ids` in our counting (what SGLang and ModelOpt read) and the top-level
`eagle_aux_hidden_state_layer_ids` in vLLM's (what vLLM reads first); the reader checks that they agree.

The draft vocabulary. `lm_head` scores `draft_vocab_size` tokens; draft index d is target token `d + d2t[d]`
(`draft_to_target`). `t2d` [vocab_size] bool marks the target tokens the draft can propose (SpecForge writes it;
vLLM and SGLang skip it). With `draft_vocab_size == vocab_size` and no `d2t`, d is target token d.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.atomic import atomic_directory
from specbuild.errors import CheckpointError

if TYPE_CHECKING:
    import torch

ARCHITECTURE = "LlamaForCausalLMEagle3"
"""What `write_eagle3_draft` writes (the EAGLE authors', ModelOpt's and SGLang's name)."""
ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")  # both load vLLM's llama_eagle3 module
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
LAYER_PREFIX = "midlayer."
ALIAS_PREFIXES = ("layers.0.",)  # ModelOpt's export names the one decoder layer so; readers rename it
NUM_CAPTURED = 3  # low, middle and high features: the EAGLE-3 paper's and every loader's fc width


def default_layer_ids(num_target_layers: int) -> tuple[int, int, int]:
    """TensorRT-LLM's default capture for a target of n layers, in our counting: (1, n // 2 - 1, n - 4); like
    TensorRT-LLM, refused for n <= 5 (the ids would collide or leave the target)."""
    n = num_target_layers
    if n <= 5:
        raise CheckpointError(f"a target of {n} layers has no default EAGLE-3 capture layers (TensorRT-LLM needs > 5)",
                              hint="set the draft's eagle_config.eagle_aux_hidden_state_layer_ids explicitly")
    return (1, n // 2 - 1, n - 4)


def vllm_layer_ids(layer_ids: tuple[int, ...]) -> tuple[int, ...]:
    """Our ids (output of layer i) in vLLM's and SGLang's capture counting (input of layer i + 1)."""
    return tuple(i + 1 for i in layer_ids)


@dataclass(frozen=True)
class Eagle3DraftConfig:
    """What a one-layer Llama-style EAGLE-3 draft is; `target_layer_ids` in our counting (output of layer i),
    None for the default of whatever target it is paired with (`resolve_layer_ids`)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary: embed_tokens' rows, the range of draft_to_target
    draft_vocab_size: int | None = None  # lm_head's rows; None: vocab_size
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    target_hidden_size: int | None = None  # width of each captured feature; None: hidden_size
    target_layer_ids: tuple[int, ...] | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    torch_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.target_layer_ids is not None:
            object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))

    @property
    def draft_vocab(self) -> int:
        return self.draft_vocab_size if self.draft_vocab_size is not None else self.vocab_size

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def feature_size(self) -> int:
        return self.target_hidden_size if self.target_hidden_size is not None else self.hidden_size

    @property
    def num_captured(self) -> int:
        return len(self.target_layer_ids) if self.target_layer_ids is not None else NUM_CAPTURED

    @property
    def needs_vocab_maps(self) -> bool:
        return self.draft_vocab != self.vocab_size

    def resolve_layer_ids(self, num_target_layers: int) -> tuple[int, ...]:
        """The captured layers for a target of `num_target_layers`: the config's, else TensorRT-LLM's default."""
        if self.target_layer_ids is not None:
            return self.target_layer_ids
        return default_layer_ids(num_target_layers)


# -- the config keys: one table ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigKey:
    key: str  # in config.json ("eagle_config." prefix: inside that object)
    attr: str | None  # Eagle3DraftConfig field it fills (None: written constant / checked only)
    required: bool
    why: str


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("architectures", None, True, f"[{ARCHITECTURE!r}]; the engines pick their EAGLE-3 class by it"),
    ConfigKey("model_type", None, False, "'llama': the HF config class the engines parse it with"),
    ConfigKey("num_hidden_layers", None, True, "1: one decoder layer `midlayer` (multi-layer drafts are refused)"),
    ConfigKey("hidden_size", "hidden_size", True, "the draft's width H; attention reads [embedding; hidden] = 2H"),
    ConfigKey("intermediate_size", "intermediate_size", True, "the gated MLP's inner width"),
    ConfigKey("num_attention_heads", "num_attention_heads", True, "query heads"),
    ConfigKey("num_key_value_heads", "num_key_value_heads", True, "K/V heads (GQA)"),
    ConfigKey("head_dim", "head_dim", False, "per-head width; default hidden_size // num_attention_heads"),
    ConfigKey("vocab_size", "vocab_size", True, "the target's vocabulary (embed_tokens, d2t's targets)"),
    ConfigKey("draft_vocab_size", "draft_vocab_size", False, "lm_head rows; TensorRT-LLM and vLLM default vocab_size"),
    ConfigKey("target_hidden_size", "target_hidden_size", False, "captured feature width; default hidden_size"),
    ConfigKey("rms_norm_eps", "rms_norm_eps", False, "every RMSNorm's epsilon"),
    ConfigKey("rope_theta", "rope_theta", False, "RoPE base"),
    ConfigKey("rope_scaling", "rope_scaling", False, "HF rope_scaling, as the target's"),
    ConfigKey("max_position_embeddings", "max_position_embeddings", False, "RoPE table length"),
    ConfigKey("hidden_act", "hidden_act", False, "the MLP's activation ('silu')"),
    ConfigKey("torch_dtype", "torch_dtype", False, "the tensors' dtype"),
    ConfigKey("tie_word_embeddings", None, False, "false: lm_head is the draft's own"),
    ConfigKey("eagle_aux_hidden_state_layer_ids", None, False, "vLLM's capture ids (ours + 1), read by vLLM first"),
    ConfigKey("eagle_config.eagle_aux_hidden_state_layer_ids", "target_layer_ids", False,
              "captured target layers, output of layer i (SGLang and ModelOpt read it); default: the target's default"),
    ConfigKey("eagle_config.use_aux_hidden_state", None, False, "true: fc fuses the captured features"),
)

UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    # Variants some loaders implement that the reference runtime does not: refused rather than computed otherwise.
    "norm_before_residual": False,  # vLLM llama_eagle3: hidden_norm before the residual is taken
    "eagle_config.eh_proj_before_attn": False,  # TensorRT-LLM Eagle3DraftModel
    "eagle_config.norm_before_fc": False,
    "fc_norm": False,
    "eagle_config.return_hidden_post_norm": False,
    "norm_output": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bias": False,
    "quantization_config": None,
}


def _get(data: Mapping[str, Any], key: str) -> Any:
    if key.startswith("eagle_config."):
        inner = data.get("eagle_config") or {}
        return inner.get(key.removeprefix("eagle_config.")) if isinstance(inner, Mapping) else None
    return data.get(key)


# -- the tensors: one table ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: Callable[[Eagle3DraftConfig], tuple[int, ...]]
    required: Callable[[Eagle3DraftConfig], bool] = lambda c: True
    why: str = ""


def _q(c: Eagle3DraftConfig) -> int:
    return c.num_attention_heads * c.head_size


def _kv(c: Eagle3DraftConfig) -> int:
    return c.num_key_value_heads * c.head_size


def _never(c: Eagle3DraftConfig) -> bool:
    return False


_L = LAYER_PREFIX
TENSORS: tuple[TensorSpec, ...] = (
    TensorSpec("fc.weight", lambda c: (c.hidden_size, c.num_captured * c.feature_size),
               why="fuses the concatenated low/mid/high target features into H"),
    TensorSpec(_L + "hidden_norm.weight", lambda c: (c.hidden_size,), why="RMSNorm of the hidden input"),
    TensorSpec(_L + "input_layernorm.weight", lambda c: (c.hidden_size,), why="RMSNorm of the token embedding"),
    TensorSpec(_L + "self_attn.q_proj.weight", lambda c: (_q(c), 2 * c.hidden_size), why="reads [embedding; hidden]"),
    TensorSpec(_L + "self_attn.k_proj.weight", lambda c: (_kv(c), 2 * c.hidden_size)),
    TensorSpec(_L + "self_attn.v_proj.weight", lambda c: (_kv(c), 2 * c.hidden_size)),
    TensorSpec(_L + "self_attn.o_proj.weight", lambda c: (c.hidden_size, _q(c))),
    TensorSpec(_L + "post_attention_layernorm.weight", lambda c: (c.hidden_size,)),
    TensorSpec(_L + "mlp.gate_proj.weight", lambda c: (c.intermediate_size, c.hidden_size)),
    TensorSpec(_L + "mlp.up_proj.weight", lambda c: (c.intermediate_size, c.hidden_size)),
    TensorSpec(_L + "mlp.down_proj.weight", lambda c: (c.hidden_size, c.intermediate_size)),
    TensorSpec("norm.weight", lambda c: (c.hidden_size,), why="final RMSNorm before lm_head"),
    TensorSpec("lm_head.weight", lambda c: (c.draft_vocab, c.hidden_size), why="scores the draft vocabulary"),
    TensorSpec("embed_tokens.weight", lambda c: (c.vocab_size, c.hidden_size), _never,
               why="optional: the draft's own embedding; absent, it shares the target's"),
    TensorSpec("d2t", lambda c: (c.draft_vocab,), lambda c: c.needs_vocab_maps,
               why="int64 offsets: target id = d + d2t[d]; required when draft_vocab_size < vocab_size"),
    TensorSpec("t2d", lambda c: (c.vocab_size,), _never, why="optional bool mask of target ids in the draft vocab"),
)


def expected_shapes(config: Eagle3DraftConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config may hold, with its shape (required or not: `TENSORS`)."""
    return {t.name: t.shape(config) for t in TENSORS}


def canonical_name(name: str) -> str:
    """A tensor name with ModelOpt's `layers.0.` spelled as `midlayer.` (the name this module uses)."""
    for alias in ALIAS_PREFIXES:
        if name.startswith(alias):
            return LAYER_PREFIX + name.removeprefix(alias)
    return name


# -- the vocabulary maps -------------------------------------------------------------------------------------------
def vocab_maps(draft_to_target_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for a draft vocabulary given as the target ids of draft indices 0..Vd-1 (strictly increasing,
    as SpecForge orders them): d2t[d] = target - d (int64), t2d[t] = whether t is in the draft vocabulary."""
    import torch

    ids = torch.as_tensor(draft_to_target_ids, dtype=torch.long)
    if ids.dim() != 1 or ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"draft token ids must be a non-empty 1-D list within [0, {vocab_size})")
    if ids.numel() > 1 and bool((ids[1:] <= ids[:-1]).any()):
        raise ValueError("draft token ids must be strictly increasing (distinct target tokens, in id order)")
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def draft_to_target(config: Eagle3DraftConfig, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The target token id of each draft index [draft_vocab] (int64): `d + d2t[d]`, or d without a d2t."""
    import torch

    base = torch.arange(config.draft_vocab, dtype=torch.long)
    d2t = tensors.get("d2t")
    return base if d2t is None else base + d2t.to(torch.long).cpu()


# -- config.json ---------------------------------------------------------------------------------------------------
def config_json(config: Eagle3DraftConfig) -> dict[str, Any]:
    """The HF-style config.json every engine's EAGLE-3 loader parses."""
    data: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_size, "vocab_size": config.vocab_size, "draft_vocab_size": config.draft_vocab,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings, "hidden_act": config.hidden_act,
        "torch_dtype": config.torch_dtype, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "eagle_config": {"use_aux_hidden_state": True},
    }
    if config.target_hidden_size is not None:
        data["target_hidden_size"] = config.target_hidden_size
    if config.target_layer_ids is not None:
        data["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(config.target_layer_ids)
        data["eagle_aux_hidden_state_layer_ids"] = list(vllm_layer_ids(config.target_layer_ids))
    return data


def _int(value: Any, path: Path, key: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"{path}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def _layer_ids(data: Mapping[str, Any], path: Path) -> tuple[int, ...] | None:
    ours, theirs = _get(data, "eagle_config.eagle_aux_hidden_state_layer_ids"), data.get(
        "eagle_aux_hidden_state_layer_ids")
    for key, value, low in (("eagle_config.eagle_aux_hidden_state_layer_ids", ours, 0),
                            ("eagle_aux_hidden_state_layer_ids", theirs, 1)):
        if value is not None and (not isinstance(value, list) or not value
                                  or any(isinstance(i, bool) or not isinstance(i, int) or i < low for i in value)):
            raise CheckpointError(f"{path}: {key} must be a non-empty list of layer ids >= {low}, got {value!r}",
                                  hint="id 0 in vLLM's counting is the embeddings, which no EAGLE-3 draft here reads"
                                  if low else None)
    if ours is not None and theirs is not None and list(vllm_layer_ids(tuple(ours))) != list(theirs):
        raise CheckpointError(
            f"{path}: eagle_config.eagle_aux_hidden_state_layer_ids {ours} (output of layer i) and "
            f"eagle_aux_hidden_state_layer_ids {theirs} (vLLM: input of layer i) name different layers",
            hint="vLLM's ids are the eagle_config ids + 1; fix one of them")
    if ours is not None:
        return tuple(ours)
    if theirs is not None:
        return tuple(i - 1 for i in theirs)
    return None


def parse_config(data: Mapping[str, Any], path: Path) -> Eagle3DraftConfig:
    """config.json's content -> Eagle3DraftConfig; every refusal names `path` and the key."""
    arch = data.get("architectures")
    if not isinstance(arch, list) or not arch or arch[0] not in ARCHITECTURES:
        raise CheckpointError(f"{path}: architectures is {arch!r}, not an EAGLE-3 draft ({' or '.join(ARCHITECTURES)})",
                              hint="is this the target or an EAGLE-1/2 draft? EAGLE-3 drafts say "
                                   f"architectures: [{ARCHITECTURE!r}]")
    missing = [k.key for k in CONFIG_KEYS if k.required and _get(data, k.key) is None]
    if missing:
        raise CheckpointError(f"{path}: missing {', '.join(missing)}")
    if data.get("num_hidden_layers") != 1:
        raise CheckpointError(f"{path}: num_hidden_layers is {data.get('num_hidden_layers')!r}; the reference runtime "
                              "runs one-layer EAGLE-3 drafts (midlayer) only")
    for key, default in UNSUPPORTED_DEFAULTS.items():
        value = _get(data, key)
        if value is not None and value != default:
            raise CheckpointError(f"{path}: {key} = {value!r} is an EAGLE-3 variant the reference runtime does not run "
                                  f"(supported: {default!r})")
    if _get(data, "eagle_config.use_aux_hidden_state") is False:
        raise CheckpointError(f"{path}: eagle_config.use_aux_hidden_state is false (an EAGLE-1-style draft without fc)")
    fields: dict[str, Any] = {}
    for spec in CONFIG_KEYS:
        if spec.attr is None or spec.attr == "target_layer_ids":
            continue
        value = _get(data, spec.key)
        if value is None:
            continue
        if spec.attr in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                         "vocab_size", "draft_vocab_size", "head_dim", "target_hidden_size",
                         "max_position_embeddings"):
            value = _int(value, path, spec.key)
        fields[spec.attr] = value
    fields["target_layer_ids"] = _layer_ids(data, path)
    config = Eagle3DraftConfig(**fields)
    if config.num_attention_heads % config.num_key_value_heads:
        raise CheckpointError(f"{path}: num_attention_heads {config.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads {config.num_key_value_heads}")
    if config.draft_vocab > config.vocab_size:
        raise CheckpointError(f"{path}: draft_vocab_size {config.draft_vocab} exceeds vocab_size {config.vocab_size}")
    return config


# -- fitting a target ----------------------------------------------------------------------------------------------
LAST_LAYER = -1
"""TensorRT-LLM's `eagle3_layers_to_capture` id for the target's last layer."""


@dataclass(frozen=True)
class Eagle3Target:
    """What an EAGLE-3 draft reads of its target: its architecture, hidden states' width, vocabulary and depth."""

    architecture: str
    hidden_size: int
    vocab_size: int
    num_layers: int


def target_from_config(data: Mapping[str, Any], path: Path) -> Eagle3Target:
    """A target's Hugging Face config.json content -> Eagle3Target (GPT-2's n_embd/n_layer spellings too)."""
    arch = data.get("architectures")
    architecture = str(arch[0]) if isinstance(arch, list) and arch else str(data.get("model_type", "unknown"))
    sizes = {key: next((data[k] for k in spellings if data.get(k) is not None), None)
             for key, spellings in (("hidden_size", ("hidden_size", "n_embd")), ("vocab_size", ("vocab_size",)),
                                    ("num_hidden_layers", ("num_hidden_layers", "n_layer")))}
    return Eagle3Target(architecture, *(_int(value, path, key) for key, value in sizes.items()))


def layer_id_problems(layer_ids: Sequence[int], num_layers: int, num_captured: int, *,
                      last: bool = False) -> list[str]:
    """Why `layer_ids` cannot be the captured layers of a target of `num_layers` for a draft whose fc reads
    `num_captured` features: each must be a distinct layer of the target (0..n-1 in our counting, output of
    layer i; with `last`, also TensorRT-LLM's -1), and there must be as many as fc reads."""
    valid = f"0..{num_layers - 1}" + (f" or {LAST_LAYER} (the last)" if last else "")
    outside = [i for i in layer_ids if not (0 <= i < num_layers or (last and i == LAST_LAYER))]
    problems = []
    if outside:
        problems.append(f"{outside} {'is' if len(outside) == 1 else 'are'} not a layer of the target's {num_layers} "
                        f"(valid ids: {valid}; id i is the output of decoder layer i)")
    if len(set(layer_ids)) != len(layer_ids):
        problems.append(f"{list(layer_ids)} names a layer twice")
    if len(layer_ids) != num_captured:
        problems.append(f"{len(layer_ids)} layers, but the draft's fc reads {num_captured} captured features")
    return problems


def fit_problems(config: Eagle3DraftConfig, target: Eagle3Target, *, own_embedding: bool,
                 llama_only: bool = True) -> list[str]:
    """Why this draft cannot run on `target`, one message per misfit (empty: it fits). The draft reads the
    target's hidden states (fc over `feature_size` each, from layers within its depth), its token embedding
    (unless `own_embedding`) and proposes its vocabulary's ids. `llama_only`: the target must be of the LLaMA
    family, the only one the reference runtime pairs a draft with (the engines take more)."""
    problems = []
    if llama_only:
        from specbuild.runtime.config import LLAMA_FAMILY

        if target.architecture not in LLAMA_FAMILY:
            problems.append(f"EAGLE-3 drafts pair with LLaMA-family targets on the reference runtime "
                            f"({', '.join(LLAMA_FAMILY)}), not {target.architecture}")
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocab_size {config.vocab_size} differs from the target's {target.vocab_size}: an EAGLE-3 "
                        "draft is trained for one target and its tokenizer")
    if config.feature_size != target.hidden_size:
        problems.append(f"target_hidden_size {config.feature_size} (the width of the hidden states fc reads) differs "
                        f"from the target's hidden_size {target.hidden_size}")
    if not own_embedding and config.hidden_size != target.hidden_size:
        problems.append(f"hidden_size {config.hidden_size} differs from the target's {target.hidden_size} and the "
                        "draft has no embed_tokens of its own to use instead of the target's")
    try:
        layer_ids = config.resolve_layer_ids(target.num_layers)
    except CheckpointError as err:
        return [*problems, f"{err.message} ({err.hint})" if err.hint else err.message]
    problems += [f"eagle_config.eagle_aux_hidden_state_layer_ids: {problem}"
                 for problem in layer_id_problems(layer_ids, target.num_layers, config.num_captured)]
    return problems


# -- reading and writing -------------------------------------------------------------------------------------------
def tensor_problems(config: Eagle3DraftConfig, shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Both ways, from the shapes alone (a safetensors header is enough): every tensor the config needs is there,
    nothing unknown is, and each has its table shape."""
    expected = expected_shapes(config)
    problems = [f"missing tensor {t.name!r} (shape {list(t.shape(config))})"
                for t in TENSORS if t.required(config) and t.name not in shapes]
    for name, shape in shapes.items():
        if name not in expected:
            problems.append(f"unexpected tensor {name!r}")
        elif tuple(shape) != expected[name]:
            problems.append(f"tensor {name!r} has shape {list(shape)}, expected {list(expected[name])}")
    return problems


def _refuse_tensors(problems: list[str], path: Path) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:6])})" if len(problems) > 1 else ""
        raise CheckpointError(f"{path}: {problems[0]}{more}",
                              hint="EAGLE-3 draft tensors are listed in specbuild.eagle.format.TENSORS")


def check_tensors(config: Eagle3DraftConfig, tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """`tensor_problems`, then what needs the values: the vocabulary maps are consistent."""
    _refuse_tensors(tensor_problems(config, {name: tuple(t.shape) for name, t in tensors.items()}), path)
    if "d2t" in tensors:
        targets = draft_to_target(config, tensors)
        outside = int(targets.min()) < 0 or int(targets.max()) >= config.vocab_size
        if outside or targets.unique().numel() != len(targets):
            raise CheckpointError(f"{path}: tensor 'd2t' maps draft ids to target ids outside [0, {config.vocab_size}) "
                                  "or to one target id twice (target = draft + d2t[draft])")
        if "t2d" in tensors and not (bool(tensors["t2d"].bool()[targets].all())
                                     and int(tensors["t2d"].bool().sum()) == config.draft_vocab):
            raise CheckpointError(f"{path}: tensors 't2d' and 'd2t' disagree (t2d must mark exactly the target ids "
                                  "that d2t maps to)")


def _read_config(directory: Path) -> Eagle3DraftConfig:
    """config.json of an EAGLE-3 draft directory, parsed; a missing directory or file is named as such."""
    config_path = directory / CONFIG_NAME
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: EAGLE-3 draft directory does not exist",
                              hint="point draft.model at an EAGLE-3 draft (config.json + model.safetensors), e.g. "
                                   "one `specbuild eagle train` wrote")
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: no such file", hint="is this an EAGLE-3 draft directory?")
    try:
        data = json.loads(config_path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{config_path}: not readable JSON ({err})") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object")
    return parse_config(data, config_path)


def _weights_path(directory: Path) -> Path:
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (EAGLE-3 drafts ship one {WEIGHTS_NAME})")
    return path


def read_eagle3_header(directory: Path) -> tuple[Eagle3DraftConfig, dict[str, tuple[int, ...]]]:
    """(config, tensor shapes by canonical name) of an EAGLE-3 draft directory, checked both ways against the
    tables from config.json and the safetensors header only: what `specbuild validate` and `export` read, so
    they stay fast on a real draft (the values, and the d2t/t2d checks on them, are `read_eagle3_draft`'s)."""
    from safetensors import safe_open

    directory = Path(directory)
    config = _read_config(directory)
    path = _weights_path(directory)
    try:
        with safe_open(str(path), "pt") as fh:
            shapes = {canonical_name(name): tuple(fh.get_slice(name).get_shape())
                      for name in fh.keys()}  # noqa: SIM118 (not a dict)
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{path}: cannot read safetensors file ({err})") from err
    _refuse_tensors(tensor_problems(config, shapes), path)
    return config, shapes


def read_eagle3_draft(directory: Path) -> tuple[Eagle3DraftConfig, dict[str, torch.Tensor]]:
    """(config, tensors by canonical name) of an EAGLE-3 draft directory, checked both ways against the tables."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config = _read_config(directory)
    weights_path = _weights_path(directory)
    try:
        raw = load_file(str(weights_path))
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{weights_path}: cannot read safetensors file ({err})") from err
    tensors = {canonical_name(name): value for name, value in raw.items()}
    check_tensors(config, tensors, weights_path)
    return config, tensors


def write_eagle3_draft(out_dir: Path, config: Eagle3DraftConfig, tensors: Mapping[str, torch.Tensor]) -> Path:
    """Write config.json and model.safetensors atomically (the previous directory stays until both are written),
    after checking the tensors against the table; tensor names may use `layers.0.` for `midlayer.`."""
    import torch
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    named = {canonical_name(name): tensor for name, tensor in tensors.items()}
    check_tensors(config, named, out_dir / WEIGHTS_NAME)
    dtype = getattr(torch, config.torch_dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"torch_dtype {config.torch_dtype!r} is not a torch dtype name")
    kinds = {"d2t": torch.int64, "t2d": torch.bool}  # index maps keep their own dtypes
    prepared = {name: tensor.detach().cpu().to(kinds.get(name, dtype)).contiguous() for name, tensor in named.items()}
    with atomic_directory(out_dir) as tmp:
        save_file(prepared, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(config_json(config), indent=2) + "\n")
    return out_dir
