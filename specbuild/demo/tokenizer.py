"""The demo tokenizer: byte-level BPE trained on the built-in corpus, saved as a transformers fast tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

# Fixed ids 0..3: the BPE trainer puts special tokens first, in this order.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
# Written into tokenizer_config.json instead of transformers 5's "TokenizersBackend", which transformers 4.x
# (the TensorRT-LLM containers) cannot resolve; both versions load "PreTrainedTokenizerFast".
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE: every string, any script, encodes without <unk> and decodes back exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    if [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"the BPE trainer did not give {SPECIAL_TOKENS} the ids 0..{len(SPECIAL_TOKENS) - 1}")
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, out: Path, max_length: int) -> None:
    """Save as a transformers fast tokenizer that AutoTokenizer loads offline (transformers 4.x and 5.x)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=SPECIAL_TOKENS[UNK_ID],
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
        model_max_length=max_length,
    )
    fast.save_pretrained(str(out))
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = TOKENIZER_CLASS
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def token_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All documents as one `<s> doc </s> <s> doc </s> ...` id stream, which training samples windows from."""
    import torch

    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids += [BOS_ID, *encoding.ids, EOS_ID]
    return torch.tensor(ids, dtype=torch.long)
