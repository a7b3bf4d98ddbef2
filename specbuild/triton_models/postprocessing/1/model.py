"""postprocessing: token ids -> text; streamed chunks decode incrementally (PRECEDING_IDS, IS_FINAL)."""

from __future__ import annotations

from typing import Any

import numpy as np

from specbuild.deploy import triton_io as io
from specbuild.deploy.detokenize import decode_chunk


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params, self.tokenizer = io.setup_tokenizer_model(args)
        self.skip_special_tokens = io.flag(params, "skip_special_tokens", default=True)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._one(request) for request in requests]

    def _one(self, request: Any) -> Any:
        tokens = io.get(request, "TOKENS_BATCH")  # [B, beams, T]
        lengths = io.get(request, "SEQUENCE_LENGTH")  # [B, beams]
        preceding = io.get(request, "PRECEDING_IDS")  # [B, W], -1 padded
        final = io.get(request, "IS_FINAL")
        texts = []
        for b in range(tokens.shape[0]):
            row = tokens[b].reshape(-1, tokens.shape[-1]) if tokens.ndim > 1 else tokens[None]
            length = int(np.asarray(lengths[b]).reshape(-1)[0])
            context = [] if preceding is None else [int(t) for t in preceding[b].reshape(-1) if t >= 0]
            is_final = bool(io.row_scalar(final, b, True))
            texts.append(decode_chunk(self.tokenizer, row[0, :length].tolist(), context, is_final,
                                      self.skip_special_tokens).encode("utf-8"))
        return io.pb_utils.InferenceResponse(output_tensors=[
            io.output("OUTPUT", np.array([[t] for t in texts], dtype=object)),
        ])
