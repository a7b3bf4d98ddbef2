"""The reference llmapi model's request and response rules without a server (specbuild.python_models.llmapi_model),
against the contract table (specbuild.contracts.llm_api, from NVIDIA's llmapi model.py / helpers.py): defaults,
refusals with NVIDIA's texts, the prompt-led text, streamed responses holding the text so far, stop requests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from specbuild.contracts import llm_api
from specbuild.python_models.llmapi_model import Answer, Job, LlmApiModel, Progress, parse_request


class _Tokenizer:
    """Word-level stand-in: token i is the word `w{i}`; eos 0."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [int(w[1:]) for w in text.split()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"w{i}" for i in ids if not (skip_special_tokens and i in (0, 1)))


class _Runner:
    """Emits `script` (lists of tokens, one per step) for every job, synchronously."""

    def __init__(self, script: list[list[int]]) -> None:
        self.script, self.jobs = script, []

    def check(self, job: Job) -> None:
        if len(job.prompt) + job.max_tokens > 64:
            raise ValueError("prompt + max_new_tokens is more than the engine's max_seq_len 64")

    def start(self, job: Job) -> None:
        self.jobs.append(job)
        tokens: list[int] = []
        for i, step in enumerate(self.script):
            tokens += step
            last = i == len(self.script) - 1
            job.on_progress(Progress(list(tokens), last, "length" if last else None))

    def stop(self) -> None:
        pass


def _ask(model: LlmApiModel, request_id: str = "", **inputs: Any) -> list[Answer]:
    answers: list[Answer] = []
    model.receive({k: np.asarray(v) for k, v in inputs.items()}, answers.append, request_id=request_id)
    return answers


def _text(answer: Answer) -> str:
    assert answer.outputs is not None
    return answer.outputs["text_output"][0].decode()


PROMPT = np.array([b"w5 w6"], dtype=object)


def test_defaults_are_helpers_py_and_sampling_params() -> None:
    """Nothing sent: best_of 1, exclude_input_from_output False, return_perf_metrics False (helpers.py), max_tokens
    32 (SamplingParams), greedy; no reason outputs."""
    parsed = parse_request({"text_input": PROMPT})
    assert parsed.sampling == {"best_of": 1, "exclude_input_from_output": False, "return_perf_metrics": False,
                               "stop": None}
    assert parsed.param("max_tokens") == llm_api.SAMPLING_PARAMS_DEFAULTS["max_tokens"] == 32
    assert not parsed.streaming and not any(parsed.output_config.values())
    runner = _Runner([[7], [8]])
    [answer] = _ask(LlmApiModel(_Tokenizer(), runner, decoupled=True), text_input=PROMPT)
    assert runner.jobs[0].max_tokens == 32 and runner.jobs[0].greedy
    assert answer.final and set(answer.outputs) == {"text_output"}
    assert _text(answer) == "w5 w6 w7 w8"  # the prompt leads (createResult, exclude_input_from_output false)


def test_every_sampling_input_is_read() -> None:
    """Each sampling_param_* input of the table reaches its SamplingParams keyword."""
    inputs = {"text_input": PROMPT}
    for entry in llm_api.SAMPLING_PARAM_INPUTS:
        inputs[entry.name] = np.array([3])
    parsed = parse_request(inputs)
    assert {entry.key: parsed.sampling[entry.key] for entry in llm_api.SAMPLING_PARAM_INPUTS} == {
        entry.key: 3 for entry in llm_api.SAMPLING_PARAM_INPUTS}


@pytest.mark.parametrize(("inputs", "message"), [
    ({"sampling_param_top_p": np.array([1.5])}, "require 0 <= top_p <= 1, got top_p=1.5"),
    ({"sampling_param_temperature": np.array([-1.0])}, "require temperature >= 0, got temperature=-1.0"),
    ({"sampling_param_best_of": np.array([2])}, "Greedy decoding in the LLM API does not allow multiple returns"),
    ({"sampling_param_max_tokens": np.array([1, 2])}, "Expected a scalar tensor for tensor sampling_param_max_tokens"),
    ({"text_input": np.array([[b"a"]], dtype=object)}, llm_api.LLMAPI_ERRORS["not_1d"]),
    ({"sampling_param_max_tokens": np.array([100])}, "max_seq_len 64"),
])
def test_refusals_are_one_final_error_with_na(inputs: dict[str, Any], message: str) -> None:
    """model.py's except clause: one final response, text_output "N/A", error "Error generating request: ..."."""
    answers = _ask(LlmApiModel(_Tokenizer(), _Runner([[7]]), decoupled=True), **{"text_input": PROMPT, **inputs})
    [answer] = answers
    assert answer.final and answer.error is not None and answer.error.startswith("Error generating request: ")
    assert message in answer.error
    assert answer.outputs is not None and answer.outputs["text_output"].tolist() == [b"N/A"]


def test_streaming_needs_decoupled_and_sends_the_text_so_far() -> None:
    """Not decoupled: NVIDIA's refusal. Decoupled: a response per step, each the whole completion so far (the
    prompt never), the last final; the asked-for reasons come as strings."""
    refused = _ask(LlmApiModel(_Tokenizer(), _Runner([[7]]), decoupled=False), text_input=PROMPT,
                   streaming=np.array([True]))
    assert refused[0].error == "Error generating request: Streaming is only supported in decoupled mode."
    answers = _ask(LlmApiModel(_Tokenizer(), _Runner([[7], [8, 9], [10]]), decoupled=True), text_input=PROMPT,
                   streaming=np.array([True]), return_finish_reason=np.array([True]),
                   return_stop_reason=np.array([True]))
    assert [_text(a) for a in answers] == ["w7", "w7 w8 w9", "w7 w8 w9 w10"]
    assert [a.final for a in answers] == [False, False, True]
    assert answers[-1].outputs["finish_reason"].tolist() == ["length"]
    assert answers[-1].outputs["stop_reason"].tolist() == ["None"]


def test_perf_metrics_are_strings_as_model_py_sends_them() -> None:
    """sampling_param_return_perf_metrics: every PERF_METRIC_OUTPUTS entry, each an object array of str()."""
    [answer] = _ask(LlmApiModel(_Tokenizer(), _Runner([[7]]), decoupled=True), text_input=PROMPT,
                    sampling_param_return_perf_metrics=np.array([True]))
    assert set(llm_api.PERF_METRIC_OUTPUTS) <= set(answer.outputs)
    for name in llm_api.PERF_METRIC_OUTPUTS:
        assert answer.outputs[name].dtype == np.object_ and isinstance(answer.outputs[name][0], str), name


def test_stop_request() -> None:
    """A stop request without an id is refused with NVIDIA's text; with one it is answered CANCELLED."""
    model = LlmApiModel(_Tokenizer(), _Runner([[7]]), decoupled=True)
    [answer] = _ask(model, stop=np.array([True]))
    assert answer.error == llm_api.LLMAPI_ERRORS["stop_without_id"]
    [answer] = _ask(model, "r1", stop=np.array([True]))
    assert answer.cancelled and answer.error == llm_api.LLMAPI_ERRORS["cancelled"] and answer.final


def test_stop_string_is_cut_and_named() -> None:
    """sampling_param_stop: the matched string ends the text (include_stop_str_in_output false) and is the
    stop_reason; finish_reason stop."""

    class StopRunner(_Runner):
        def start(self, job: Job) -> None:
            job.on_progress(Progress([7, 8, 9], True, "stop_word"))

    [answer] = _ask(LlmApiModel(_Tokenizer(), StopRunner([]), decoupled=True), text_input=PROMPT,
                    sampling_param_stop=np.array([b"w8 w9"], dtype=object),
                    sampling_param_exclude_input_from_output=np.array([True]),
                    return_finish_reason=np.array([True]), return_stop_reason=np.array([True]))
    assert _text(answer) == "w7"
    assert answer.outputs["finish_reason"].tolist() == ["stop"]
    assert answer.outputs["stop_reason"].tolist() == ["w8 w9"]
