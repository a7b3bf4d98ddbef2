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


class _FailingTokenizer(_Tokenizer):
    """Cannot decode token 8: making any response that holds it raises."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if 8 in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return super().decode(ids, skip_special_tokens)


@pytest.mark.parametrize("streaming", [True, False])
def test_a_response_that_cannot_be_made_ends_the_request_with_one_final_error(streaming: bool) -> None:
    """model.py's except clause wraps its whole generation loop: a failure while making a response is the request's
    one final error ("Error generating request: ...", text_output "N/A"), never a stream left open without its
    final response. The engine is told to stop generating for it, and its later progress sends nothing."""
    runner = _Runner([[7], [8], [9], [10]])
    answers = _ask(LlmApiModel(_FailingTokenizer(), runner, decoupled=True), text_input=PROMPT,
                   streaming=np.array([streaming]))
    [job] = runner.jobs
    *before, last = answers
    assert [_text(a) for a in before] == (["w7"] if streaming else [])
    assert not any(a.final for a in before)
    assert last.final and last.error is not None and last.error.startswith("Error generating request: ")
    assert "invalid start byte" in last.error
    assert last.outputs is not None and last.outputs["text_output"].tolist() == [b"N/A"]
    assert job.cancelled()


# -- EAGLE-3 (speculative_config decoding_type Eagle) over the reference runtime ------------------------------------
def _eagle3_model(demo_models: dict[str, Any], demo_extra: Any, tmp_path: Any) -> tuple[LlmApiModel, Any, Any]:
    """The llmapi model as model.py builds it for an Eagle speculative_config (load_runner), on the demo target and
    the demo extra eagle3-draft; also the target and the tokenizer, for the expectation."""
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.python_models.llmapi_model import load_runner
    from specbuild.runtime.model import CausalLM
    from specbuild.tokenizer import load_tokenizer

    convert_checkpoint(ConvertRequest("target", demo_models["target"], tmp_path / "target", "float32"))
    settings = {"max_batch_size": 4, "max_seq_len": 128,
                "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 4}}
    reference = {"checkpoints": {"target": str(tmp_path / "target")}, "eagle3_draft": str(demo_extra("eagle3-draft"))}
    tokenizer = load_tokenizer(demo_models["target"])
    model = LlmApiModel(tokenizer, load_runner(settings, reference), decoupled=True)
    return model, CausalLM.from_checkpoint(tmp_path / "target"), tokenizer


def _wait_final(answers: list[Answer], timeout_s: float = 120.0) -> list[Answer]:
    import time

    deadline = time.monotonic() + timeout_s
    while not (answers and answers[-1].final):
        assert time.monotonic() < deadline, answers
        time.sleep(0.01)
    return answers


def test_eagle3_runner_answers_concurrent_requests_with_the_greedy_text(demo_models: dict[str, Any], demo_extra: Any,
                                                                        tmp_path: Any) -> None:
    """Several requests at once, streamed or not: each the target's own plain greedy completion (derived here),
    drafts reported in the perf metrics; a request whose client went away ends cancelled, and the next one is
    still served."""
    import torch

    from specbuild.runtime.generation import generate
    from specbuild.runtime.sequence import StopCriteria

    model, target, tokenizer = _eagle3_model(demo_models, demo_extra, tmp_path)
    prompts = ["The for statement", "Class definitions", "The import statement"]
    with torch.inference_mode():
        expected = {p: tokenizer.decode(generate(target, [tokenizer.encode(p)], stop=StopCriteria(
            16, tokenizer.eos_token_id)).output_ids[0], skip_special_tokens=True) for p in prompts}
    streams: dict[str, list[Answer]] = {p: [] for p in prompts}
    for index, prompt in enumerate(prompts):
        model.receive({"text_input": np.array([prompt.encode()], dtype=object),
                       "sampling_param_max_tokens": np.array([16]), "streaming": np.array([index % 2 == 0]),
                       "sampling_param_exclude_input_from_output": np.array([True]),
                       "sampling_param_return_perf_metrics": np.array([True])}, streams[prompt].append)
    for prompt in prompts:
        answers = _wait_final(streams[prompt])
        assert not any(a.error for a in answers), answers
        assert _text(answers[-1]) == expected[prompt], prompt
        drafted = int(answers[-1].outputs["total_draft_tokens"][0])
        assert drafted >= int(answers[-1].outputs["total_accepted_draft_tokens"][0]) >= 0 and drafted > 0

    gone: list[Answer] = []
    model.receive({"text_input": np.array([prompts[0].encode()], dtype=object)}, gone.append,
                  client_cancelled=lambda: True)
    assert _wait_final(gone)[-1].cancelled
    again: list[Answer] = []
    model.receive({"text_input": np.array([prompts[1].encode()], dtype=object),
                   "sampling_param_max_tokens": np.array([16]),
                   "sampling_param_exclude_input_from_output": np.array([True])}, again.append)
    assert _text(_wait_final(again)[-1]) == expected[prompts[1]]
    model.runner.stop()
