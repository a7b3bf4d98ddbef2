"""bench/triton_floor.py on a real tritonserver: recorded calls replayed from a python model to models that keep
their config.pbtxt and answer at once, each call answered with the outputs the real model gave."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.bench_scripts import bench_module

LLM_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 4
model_transaction_policy {{ decoupled: {decoupled} }}
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
input [ {{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }},
        {{ name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] }},
        {{ name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] optional: true }} ]
output [ {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
         {{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


@pytest.fixture(scope="module")
def floor() -> ModuleType:
    return bench_module("triton_floor")


def llm_call(floor: ModuleType, model: str, length: int) -> object:
    inputs = {"input_ids": np.arange(length, dtype=np.int32)[None],
              "request_output_len": np.array([[4]], dtype=np.int32), "streaming": np.zeros((1, 1), dtype=bool)}
    answer = {"output_ids": np.arange(4, dtype=np.int32).reshape(1, 1, 4),
              "sequence_length": np.array([[4]], dtype=np.int32)}
    return floor.Call(model, inputs, ["output_ids", "sequence_length"], answer)


@pytest.mark.tritonserver
def test_the_recorded_calls_are_replayed_to_each_model_and_timed(floor: ModuleType, tmp_path: Path) -> None:
    deployed = tmp_path / "deployed"
    for name, decoupled in (("draft", "false"), ("target", "true")):
        (deployed / name).mkdir(parents=True)
        (deployed / name / "config.pbtxt").write_text(LLM_CONFIG.format(name=name, decoupled=decoupled))
    calls = [llm_call(floor, model, length) for length in (10, 14, 18) for model in ("draft", "target")]
    ms = floor.measure_floor(deployed, calls, {"draft": False, "target": True}, tmp_path / "work", passes=2)
    assert sorted(ms) == ["draft", "target"] and all(0 < v < 1000 for v in ms.values())
    copy = tmp_path / "work" / "floor_repository"
    assert (copy / "target" / "config.pbtxt").read_text() == (deployed / "target" / "config.pbtxt").read_text()


@pytest.mark.tritonserver
def test_a_call_whose_answer_lacks_an_output_is_refused_as_unfaithful(floor: ModuleType, tmp_path: Path) -> None:
    deployed = tmp_path / "deployed"
    (deployed / "draft").mkdir(parents=True)
    (deployed / "draft" / "config.pbtxt").write_text(LLM_CONFIG.format(name="draft", decoupled="false"))
    call = llm_call(floor, "draft", 8)
    wrong = floor.Call("draft", call.inputs, ["output_ids"], call.answer)  # asks for less than the answer holds
    with pytest.raises(RuntimeError, match="not answered with the recorded outputs"):
        floor.measure_floor(deployed, [wrong], {"draft": False}, tmp_path / "work", passes=1)


def test_object_tensors_are_refused_rather_than_pickled(floor: ModuleType, tmp_path: Path) -> None:
    call = floor.Call("draft", {"text": np.array([b"x"], dtype=object)}, [], {})
    with pytest.raises(ValueError, match="object tensor"):
        floor.floor_repository(tmp_path, [call], {"draft": False}, tmp_path / "work")
