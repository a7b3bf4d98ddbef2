"""preprocessing: prompt text -> token ids, word lists -> TensorRT-LLM's [2, N] format; rejects prompts the
engines cannot take before any LLM time is spent."""

from __future__ import annotations

from typing import Any

import numpy as np

from specbuild.deploy import triton_io as io


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params, self.tokenizer = io.setup_tokenizer_model(args)
        self.add_special_tokens = io.flag(params, "add_special_tokens", default=True)
        self.end_id, self.pad_id = int(params["end_id"]), int(params["pad_id"])
        self.max_input_len, self.max_output_len = int(params["max_input_len"]), int(params["max_output_len"])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except ValueError as err:
                responses.append(io.error(str(err)))
        return responses

    def _one(self, request: Any) -> Any:
        queries = io.get(request, "QUERY")
        out_len = io.get(request, "REQUEST_OUTPUT_LEN")
        batch = queries.shape[0]
        ids = [self._encode(io.text(queries[b].reshape(-1)[0])) for b in range(batch)]
        lengths = []
        for b in range(batch):
            n = int(io.row_scalar(out_len, b, 0))
            if not 1 <= n <= self.max_output_len:
                raise ValueError(f"max_tokens must be between 1 and {self.max_output_len} (got {n})")
            lengths.append(n)
        end_ids, pad_ids = io.get(request, "END_ID"), io.get(request, "PAD_ID")
        end = [int(io.row_scalar(end_ids, b, self.end_id)) for b in range(batch)]
        pad = [int(io.row_scalar(pad_ids, b, self.pad_id)) for b in range(batch)]
        return io.pb_utils.InferenceResponse(output_tensors=[
            io.output("INPUT_ID", io.padded(ids, pad[0])),
            io.output("REQUEST_INPUT_LEN", np.array([[len(row)] for row in ids], dtype=np.int32)),
            io.output("REQUEST_OUTPUT_LEN", np.array([[n] for n in lengths], dtype=np.int32)),
            io.output("BAD_WORDS_IDS", self._word_lists(io.get(request, "BAD_WORDS_DICT"), batch)),
            io.output("STOP_WORDS_IDS", self._word_lists(io.get(request, "STOP_WORDS_DICT"), batch)),
            io.output("OUT_END_ID", np.array([[e] for e in end], dtype=np.int32)),
            io.output("OUT_PAD_ID", np.array([[p] for p in pad], dtype=np.int32)),
        ])

    def _encode(self, prompt: str) -> list[int]:
        if not prompt:
            raise ValueError("text_input is empty: give a prompt of at least one token")
        ids = self.tokenizer.encode(prompt, add_special_tokens=self.add_special_tokens)
        if not ids:
            raise ValueError("text_input encodes to no tokens")
        if len(ids) > self.max_input_len:
            raise ValueError(f"the prompt is {len(ids)} tokens; the engines take at most {self.max_input_len}")
        return ids

    def _word_lists(self, words: np.ndarray | None, batch: int) -> np.ndarray:
        """[batch, 2, N]: each row's phrases encoded without special tokens, flat, with end offsets."""
        rows = []
        for b in range(batch):
            phrases = [] if words is None else [io.text(w) for w in words[b if words.shape[0] > b else 0].reshape(-1)]
            flat: list[int] = []
            offsets: list[int] = []
            for phrase in phrases:
                if phrase:
                    flat += self.tokenizer.encode(phrase, add_special_tokens=False)
                    offsets.append(len(flat))
            rows.append((flat, offsets))
        width = max(1, *(len(flat) for flat, _ in rows))
        out = np.zeros((batch, 2, width), dtype=np.int32)
        out[:, 1, :] = -1
        for b, (flat, offsets) in enumerate(rows):
            out[b, 0, : len(flat)] = flat
            out[b, 1, : len(offsets)] = offsets
        return out
