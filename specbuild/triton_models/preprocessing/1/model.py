"""preprocessing: prompt text -> token ids and the LLM's other request tensors, with NVIDIA's outputs and
behaviour for a text-only repository (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/
preprocessing/1/model.py` @01259b15; the logic is specbuild.python_models.preprocess). It validates no lengths:
REQUEST_OUTPUT_LEN passes through and the LLM model refuses (or shortens) what its engine cannot take."""

from __future__ import annotations

from typing import Any

import numpy as np

from specbuild.python_models import preprocess as pre
from specbuild.python_models import triton_io as io


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params, self.tokenizer = io.setup_tokenizer_model(args)
        self.add_special_tokens = pre.nvidia_flag(params.get("add_special_tokens"))
        self.end_id, self.pad_id = pre.default_ids(self.tokenizer)
        self.vocab_size = int(self.tokenizer.vocab_size)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(io.inputs(request)))
            except ValueError as err:
                responses.append(io.error(str(err)))
        return responses

    def _one(self, tensors: dict[str, np.ndarray]) -> Any:
        pre.refuse_multimodal(tensors)
        queries = tensors["QUERY"]
        batch = queries.shape[0]
        prompts = pre.texts(queries)
        if any(not p for p in prompts):
            raise ValueError("text_input is empty: give a prompt of at least one token")
        ids, lengths = pre.encode_prompts(self.tokenizer, prompts, add_special_tokens=self.add_special_tokens,
                                          pad_id=self.pad_id)
        if int(lengths.min()) == 0:
            raise ValueError("text_input encodes to no tokens")
        end = self._per_row(tensors.get("END_ID"), self.end_id, batch)
        pad = self._per_row(tensors.get("PAD_ID"), self.pad_id, batch)
        decoder = tensors.get("DECODER_QUERY")
        if decoder is not None:
            decoder_ids, decoder_lengths = pre.encode_prompts(
                self.tokenizer, pre.texts(decoder), add_special_tokens=self.add_special_tokens, pad_id=self.pad_id)
        else:  # decoder-only engines ignore them; the C++ backend reads them only for encoder-decoder engines
            decoder_ids, decoder_lengths = pad.copy(), np.ones((batch, 1), dtype=np.int32)
        outputs = {
            "INPUT_ID": ids,
            "REQUEST_INPUT_LEN": lengths,
            "DECODER_INPUT_ID": decoder_ids,
            "REQUEST_DECODER_INPUT_LEN": decoder_lengths,
            "BAD_WORDS_IDS": pre.word_list(self.tokenizer, tensors.get("BAD_WORDS_DICT"), batch),
            "STOP_WORDS_IDS": pre.word_list(self.tokenizer, tensors.get("STOP_WORDS_DICT"), batch),
            "REQUEST_OUTPUT_LEN": tensors["REQUEST_OUTPUT_LEN"],
            "EMBEDDING_BIAS": pre.embedding_bias(self.tokenizer, tensors.get("EMBEDDING_BIAS_WORDS"),
                                                 tensors.get("EMBEDDING_BIAS_WEIGHTS"), batch),
            "OUT_END_ID": end,
            "OUT_PAD_ID": pad,
        }
        extra = tensors.get("PROMPT_TABLE_EXTRA_ID")
        if extra is not None:
            outputs["OUT_PROMPT_TABLE_EXTRA_IDS"] = pre.prompt_table_extra_ids(ids, extra, self.vocab_size)
        return io.pb_utils.InferenceResponse(output_tensors=[io.output(k, v) for k, v in outputs.items()])

    @staticmethod
    def _per_row(array: np.ndarray | None, default: int, batch: int) -> np.ndarray:
        """END_ID / PAD_ID [B, 1]: the request's values (a single row broadcasts), else the tokenizer's."""
        if array is None or array.size == 0:
            return np.full((batch, 1), default, dtype=np.int32)
        rows = array.reshape(array.shape[0], -1)[:, :1].astype(np.int32)
        return rows if rows.shape[0] == batch else np.repeat(rows[:1], batch, axis=0)
