"""Triton's own cost of the BLS's calls on this machine: the recorded calls of one request, replayed from a python
model to models that answer at once.

The round-cost benchmark splits a served call into the model's in-process time and a remainder it calls the Triton
round trip. That remainder holds Triton's own cost (the python backend's IPC both ways, the core's scheduling, the
tensors through shared memory) and whatever the reference `tensorrt_llm` model costs only when served (its stub
reading the request, the engine thread's wake-up, building the response). This measures the first part alone: a
repository where each called model keeps its deployed config.pbtxt (the same inputs, outputs, batching and
transaction policy) but its model.py answers every request at once from a worker thread with the answer the real
model gave (as the reference model, and the C++ backend, answer from their engine's thread), and a `caller` python
model that sends the very call tensors the BLS sent, in the BLS's order, with the same `exec` the BLS uses, timing
each call. What is left of the served call beyond this floor is the served model's own cost.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CALLER = "caller"

ECHO_MODEL = '''"""Answers each request at once, from a worker thread, with the next recorded answer (written by
bench/triton_floor.py)."""

import json
import queue
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        here = Path(__file__).resolve().parent
        with np.load(here / "answers.npz", allow_pickle=False) as data:
            count = json.loads((here / "answers.json").read_text())["count"]
            self.answers = [{key.split("/", 1)[1]: data[key] for key in data.files if key.startswith(f"{i}/")}
                            for i in range(count)]
        self.next = 0
        self.jobs = queue.Queue()
        threading.Thread(target=self._answer, daemon=True).start()

    def execute(self, requests):
        for request in requests:
            wanted = request.requested_output_names()
            self.jobs.put((request.get_response_sender(), wanted))
        return None

    def _answer(self):
        while True:
            sender, wanted = self.jobs.get()
            answer = self.answers[self.next % len(self.answers)]
            self.next += 1
            tensors = [pb_utils.Tensor(name, value) for name, value in answer.items() if name in wanted]
            sender.send(pb_utils.InferenceResponse(output_tensors=tensors),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

CALLER_MODEL = '''"""Replays the recorded calls, timing each as the BLS makes it (written by bench/triton_floor.py)."""

import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        here = Path(__file__).resolve().parent
        self.plan = json.loads((here / "calls.json").read_text())
        with np.load(here / "calls.npz", allow_pickle=False) as data:
            self.inputs = [{key.split("/", 1)[1]: data[key] for key in data.files if key.startswith(f"{i}/")}
                           for i in range(len(self.plan))]

    def execute(self, requests):
        out = []
        for request in requests:
            passes = int(pb_utils.get_input_tensor_by_name(request, "passes").as_numpy().reshape(-1)[0])
            times, received = [], []
            for _ in range(passes):
                for call, inputs in zip(self.plan, self.inputs):
                    start = time.perf_counter()
                    tensors = [pb_utils.Tensor(name, value) for name, value in inputs.items()]
                    llm = pb_utils.InferenceRequest(model_name=call["model"], inputs=tensors,
                                                    requested_output_names=call["outputs"])
                    responses = llm.exec(decoupled=True) if call["decoupled"] else [llm.exec()]
                    answer = {}
                    for response in responses:
                        if response.has_error():
                            raise pb_utils.TritonModelException(response.error().message())
                        answer.update({tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()})
                    times.append(time.perf_counter() - start)
                    received.append(len(answer))
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("seconds", np.array(times, dtype=np.float64)),
                pb_utils.Tensor("received", np.array(received, dtype=np.int32))]))
        return out
'''

CALLER_CONFIG = f'''name: "{CALLER}"
backend: "python"
max_batch_size: 0
input [ {{ name: "passes" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "seconds" data_type: TYPE_FP64 dims: [ -1 ] }},
         {{ name: "received" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''


@dataclass(frozen=True)
class Call:
    """One call the BLS made: the model, its input tensors, the outputs it asked for, and the model's answer."""

    model: str
    inputs: Mapping[str, np.ndarray]
    outputs: Sequence[str]
    answer: Mapping[str, np.ndarray]


def _save(path: Path, rows: Sequence[Mapping[str, np.ndarray]]) -> None:
    np.savez(path, **{f"{i}/{name}": np.asarray(value) for i, row in enumerate(rows) for name, value in row.items()})


def floor_repository(repository: Path, calls: Sequence[Call], decoupled: Mapping[str, bool], work: Path) -> Path:
    """A fresh repository under `work`: each called model's deployed config.pbtxt with the echo model, and the
    caller holding the calls (checked first: nothing is written for calls that cannot be stored)."""
    for call in calls:
        for name, value in {**call.inputs, **call.answer}.items():
            if np.asarray(value).dtype == object:
                raise ValueError(f"{call.model} {name}: an object tensor cannot be stored without pickle")
    out = work / "floor_repository"
    if out.exists():
        shutil.rmtree(out)
    for model in sorted({call.model for call in calls}):
        version = out / model / "1"
        version.mkdir(parents=True)
        shutil.copy2(repository / model / "config.pbtxt", out / model / "config.pbtxt")
        (version / "model.py").write_text(ECHO_MODEL, encoding="utf-8")
        answers = [call.answer for call in calls if call.model == model]
        _save(version / "answers.npz", answers)
        (version / "answers.json").write_text(json.dumps({"count": len(answers)}), encoding="utf-8")
    caller = out / CALLER / "1"
    caller.mkdir(parents=True)
    (out / CALLER / "config.pbtxt").write_text(CALLER_CONFIG, encoding="utf-8")
    (caller / "model.py").write_text(CALLER_MODEL, encoding="utf-8")
    _save(caller / "calls.npz", [call.inputs for call in calls])
    plan = [{"model": c.model, "outputs": list(c.outputs), "decoupled": decoupled[c.model]} for c in calls]
    (caller / "calls.json").write_text(json.dumps(plan), encoding="utf-8")
    return out


def measure_floor(repository: Path, calls: Sequence[Call], decoupled: Mapping[str, bool], work: Path,
                  passes: int = 10) -> dict[str, float]:
    """Per called model, the mean ms of its calls in the fastest of `passes` replays (after one not counted; the
    served calls it is set beside are each request's fastest pass too), each call's answer coming at once:
    Triton's own cost of those calls on this machine."""
    import tritonclient.grpc as grpcclient

    from specbuild.serve.server import TritonServer

    if not calls:
        raise ValueError("no call to replay")
    floor = floor_repository(repository, calls, decoupled, work)
    with TritonServer(floor, log_file=work / "tritonserver-floor.log") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            def replay(n: int) -> np.ndarray:
                count = grpcclient.InferInput("passes", [1], "INT32")
                count.set_data_from_numpy(np.array([n], dtype=np.int32))
                result = client.infer(CALLER, [count])
                expected = [len(call.answer) for call in calls] * n
                if result.as_numpy("received").tolist() != expected:  # a replay must be answered as the model did
                    raise RuntimeError(f"the replayed calls were not answered with the recorded outputs (see "
                                       f"{server.log_file})")
                return result.as_numpy("seconds")

            replay(1)
            seconds = replay(passes)
        finally:
            client.close()
    by_pass = seconds.reshape(passes, len(calls))
    models = [call.model for call in calls]
    return {model: 1e3 * min(statistics.fmean(t for m, t in zip(models, row, strict=True) if m == model)
                             for row in by_pass)
            for model in dict.fromkeys(models)}
