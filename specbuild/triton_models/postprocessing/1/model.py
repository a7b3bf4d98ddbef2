"""postprocessing: token ids -> text, as NVIDIA's postprocessing (NVIDIA/TensorRT-LLM `triton_backend/all_models/
inflight_batcher_llm/postprocessing/1/model.py` @2e2327b9): OUTPUT is a 1-D array of UTF-8 strings, one per
(row, beam) of the request (a client reads `text_output[0].decode("utf-8")`), each beam's tokens cut to
SEQUENCE_LENGTH and decoded with skip_special_tokens. specbuild's optional PRECEDING_IDS / IS_FINAL make a
streamed chunk decode incrementally (specbuild.python_models.detokenize); without them a chunk decodes on its own."""

from __future__ import annotations

from typing import Any

import numpy as np

from specbuild.python_models import triton_io as io
from specbuild.python_models.detokenize import decode_outputs
from specbuild.python_models.preprocess import nvidia_flag


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params, self.tokenizer = io.setup_tokenizer_model(args)
        self.skip_special_tokens = nvidia_flag(params.get("skip_special_tokens"))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(io.inputs(request)))
            except (ValueError, IndexError) as err:
                responses.append(io.error(f"postprocessing: {err}"))
        return responses

    def _one(self, tensors: dict[str, np.ndarray]) -> Any:
        texts = decode_outputs(self.tokenizer, tensors["TOKENS_BATCH"], tensors["SEQUENCE_LENGTH"],
                               tensors.get("PRECEDING_IDS"), tensors.get("IS_FINAL"), self.skip_special_tokens)
        output = np.array([t.encode("utf-8") for t in texts], dtype=object)
        return io.pb_utils.InferenceResponse(output_tensors=[io.output("OUTPUT", output)])
