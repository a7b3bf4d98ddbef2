"""A Dynamo worker that serves specbuild's reference serving engine: tokens in, tokens out.

Registers with the Dynamo runtime as ai-dynamo/dynamo examples/custom_backend/hello_world/hello_world.py
(@757d8dc5) and the wheel's `dynamo/_core.pyi` (ai-dynamo-runtime 1.6.1) describe: `DistributedRuntime(loop,
"file", "tcp", event_plane="zmq")`, `register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions,
...)` on `NS.COMPONENT.generate`, then `endpoint.serve_endpoint(generate)`; the registration's
`ModelRuntimeConfig.context_length` is the deployment's max_seq_len, which /v1/models advertises. The frontend
tokenizes, applies the tokenizer's chat template for /v1/chat/completions, and detokenizes; a request carries
`token_ids`, `stop_conditions` and `sampling_options`, and the worker yields `{"token_ids": [...]}` chunks, the last
with a `finish_reason`. The engine is the one the deployment's LLM-API settings ask for
(`specbuild.python_models.llmapi_model.load_runner`: the same settings `trtllm-serve` and Triton's llmapi model get),
so the worker's speculation (draft-target, EAGLE-3, n-gram) and in-flight batching are the reference runtime's. The
engine runs in a child process (`EngineProcess`, requests and updates over a pipe): in the worker's own process
Dynamo's Python bridge and the engine thread shared one GIL, which halved the engine's tokens/s.

The deployment's limits are enforced here, with `InvalidArgument` (which the frontend answers as a 400 carrying
the message; tried here): a prompt over `--max-input-len` (build.max_input_len), prompt + max_tokens over the
engine's max_seq_len. A request the frontend migrates from a dead worker arrives as prompt + the tokens streamed so
far, with max_tokens less by as many; the frontend migrates one only while that prompt fits max_input_len
(`--migration-max-seq-len`, specbuild.dynamo.launch).

Every served request is appended to `--requests-log` (one JSON line: prompt length and hash, tokens, acceptance), so
a caller can count which worker served what. SIGINT and SIGTERM shut the runtime down, which removes this worker's
discovery entries; without it the process hangs and the entries stay (ai-dynamo 1.6.1, tried here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml

GREEDY_TEMPERATURE = 0.0


def acceptance_usage(prompt_tokens: int, completion_tokens: int, accepted: int, drafted: int) -> dict[str, Any]:
    """The final chunk's `completion_usage`: OpenAI's usage with the speculation's acceptance in
    `completion_tokens_details` (accepted_prediction_tokens: draft tokens the target kept; rejected_prediction_tokens:
    the drafted ones it did not), the only usage fields Dynamo's frontend carries through for a worker."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": max(drafted - accepted, 0)}}


def _finish_reason(reason: str | None) -> str:
    return {"length": "length", "end_id": "eos", "stop_word": "stop", "cancelled": "cancelled",
            "error": "error"}.get(reason or "", "stop")


def _sampling(request: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling options as specbuild's SamplingParams fields (temperature 0 or none: greedy)."""
    options = request.get("sampling_options") or {}
    temperature = options.get("temperature")
    if temperature is None or float(temperature) <= GREEDY_TEMPERATURE:
        return {}
    fields: dict[str, Any] = {"temperature": float(temperature)}
    if options.get("top_k"):
        fields["top_k"] = int(options["top_k"])
    if options.get("top_p") is not None:
        fields["top_p"] = float(options["top_p"])
    if options.get("seed") is not None:
        fields["seed"] = int(options["seed"])
    return fields


@dataclass
class Update:
    """What the engine process reports for one request (the fields of specbuild.runtime.serving.Update used here)."""

    tokens: list[int]
    finished: bool
    reason: str | None
    accepted_draft_tokens: int
    draft_tokens: int
    error: str | None


REFUSED = "refused: "
NO_CHAT_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "dynamo" / "no-chat-template.jinja"
"""The chat template a tokenizer without one is registered with (Dynamo 1.6.1 registers no model at all for chat
without a template, so /v1/chat/completions answered 404 with an empty body; a template that fails to render
comes back as a bare "Invalid request"). It renders to a marker only; a prompt ending in the marker's tokens is
refused with NO_CHAT_MESSAGE, which the client reads."""
NO_CHAT_MESSAGE = ("this deployment's tokenizer ({}) has no chat template (no chat_template in its "
                   "tokenizer_config.json, no chat_template.jinja), so /v1/chat/completions cannot build a prompt: "
                   "ask /v1/completions, or give the target model's tokenizer a chat template and deploy again")


def has_chat_template(tokenizer: Path) -> bool:
    """Whether the frontend finds a chat template with the tokenizer: tokenizer_config.json's chat_template, or a
    chat_template.jinja / chat_template.json beside it."""
    if any((tokenizer / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        return bool(json.loads((tokenizer / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def limit_problem(prompt: int, max_tokens: int | None, max_input_len: int, max_seq_len: int) -> str | None:
    """Which of the deployment's limits a request breaks, in words a client can act on (None: none)."""
    if prompt > max_input_len:
        return (f"the prompt is {prompt} tokens, more than this deployment's max_input_len {max_input_len} "
                "(build.max_input_len)")
    if prompt + (max_tokens or 1) > max_seq_len:
        room = max(max_seq_len - prompt, 0)
        return (f"the prompt's {prompt} tokens + max_tokens {max_tokens or 1} is more than this deployment's "
                f"max_seq_len {max_seq_len} (build.max_input_len + build.max_output_len): ask for at most {room} "
                "tokens")
    return None


def load_engine(settings_file: Path, reference_file: Path) -> Any:
    """The serving engine the LLM-API settings (the deployment's engine file) ask for, started."""
    from specbuild.python_models.llmapi_model import load_runner

    settings = yaml.safe_load(settings_file.read_text(encoding="utf-8"))
    reference = json.loads(reference_file.read_text(encoding="utf-8"))
    return load_runner(settings, reference, log_info=lambda line: print(line, flush=True)).engine


def _engine_main(conn: Connection, settings_file: str, reference_file: str, threads: int) -> None:
    """The engine process: requests in over `conn`, every update out; exits when the worker closes its end."""
    from specbuild.python_models.model_threads import set_threads

    set_threads({"torch_threads": str(threads)})  # the bounded threads Triton's python models get
    from specbuild.runtime.sampling import SamplingParams
    from specbuild.runtime.serving import EngineRequest

    engine = load_engine(Path(settings_file), Path(reference_file))
    lock = threading.Lock()
    handles: dict[int, Any] = {}

    def send(message: tuple[Any, ...]) -> None:
        with lock:
            conn.send(message)

    send(("ready", engine.max_seq_len))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message[0] == "stop":
            break
        if message[0] == "cancel":
            handle = handles.get(message[1])
            if handle is not None:
                handle.cancel()
            continue
        _, rid, prompt, max_tokens, sampling, end_id, min_tokens = message

        def on_update(update: Any, rid: int = rid) -> None:
            send((rid, list(update.tokens), update.finished, update.reason, update.accepted_draft_tokens,
                  update.draft_tokens, update.error))
            if update.finished:
                handles.pop(rid, None)

        try:
            handles[rid] = engine.submit(EngineRequest(prompt=prompt, max_new_tokens=max_tokens,
                                                       params=SamplingParams(**sampling), end_id=end_id,
                                                       min_tokens=min_tokens, on_update=on_update))
        except ValueError as error:  # the engine's limits, in its words
            send((rid, [], True, "error", 0, 0, f"{REFUSED}{error}"))
    engine.stop()


class EngineProcess:
    """specbuild's serving engine in a process of its own. In the Dynamo worker's process the runtime's Python
    bridge holds the GIL about half the time under load (py-spy, 8 concurrent streams), which halved the engine's
    tokens/s; Triton's python backend likewise runs a model apart from the server (its stub process)."""

    def __init__(self, settings_file: Path, reference_file: Path, threads: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # not fork: the parent has runtime threads
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_engine_main, name="specbuild-engine", daemon=True,
                                       args=(child, str(settings_file), str(reference_file), threads))
        self.process.start()
        child.close()
        ready = self._conn.recv()
        self.max_seq_len = int(ready[1])
        self._lock = threading.Lock()
        self._next = 0
        self._sinks: dict[int, Any] = {}
        self.on_exit: Any = None
        threading.Thread(target=self._read, name="specbuild-engine-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                rid, *fields = self._conn.recv()
            except (EOFError, OSError):
                break
            sink = self._sinks.get(rid)
            update = Update(*fields)
            if update.finished:
                self._sinks.pop(rid, None)
            if sink is not None:
                sink(update)
        for sink in list(self._sinks.values()):  # the engine process is gone: every open request fails
            sink(Update([], True, "error", 0, 0, "the engine process exited"))
        if self.on_exit is not None:
            self.on_exit()

    def submit(self, prompt: list[int], max_tokens: int, sampling: dict[str, Any], end_id: int | None,
               min_tokens: int, sink: Any) -> int:
        with self._lock:
            rid = self._next
            self._next += 1
            self._sinks[rid] = sink
            self._conn.send(("submit", rid, prompt, max_tokens, sampling, end_id, min_tokens))
        return rid

    def cancel(self, rid: int) -> None:
        with self._lock:
            self._conn.send(("cancel", rid))

    def stop(self) -> None:
        with contextlib.suppress(OSError), self._lock:
            self._conn.send(("stop",))
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


class Worker:
    """One engine process behind one Dynamo endpoint."""

    def __init__(self, engine: EngineProcess, requests_log: Path | None, index: int, max_input_len: int,
                 no_chat: tuple[list[int], str] | None = None) -> None:
        self.engine, self.requests_log, self.index, self.max_input_len = engine, requests_log, index, max_input_len
        self.no_chat = no_chat
        """A tokenizer without a chat template: the marker's tokens and the refusal (NO_CHAT_TEMPLATE)."""
        self._log_lock = threading.Lock()

    def _log(self, prompt: list[int], tokens: list[int], accepted: int, drafted: int, seconds: float) -> None:
        if self.requests_log is None:
            return
        digest = hashlib.sha256(json.dumps(prompt[:64]).encode()).hexdigest()[:16]
        line = json.dumps({"worker": self.index, "pid": os.getpid(), "prompt_tokens": len(prompt),
                           "prefix64": digest, "tokens": len(tokens), "accepted": accepted, "drafted": drafted,
                           "worker_ms": round(seconds * 1e3, 2)})
        with self._log_lock, self.requests_log.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    async def generate(self, request: dict[str, Any], context: Any = None) -> Any:
        """Dynamo's handler: one engine request, streamed back as token chunks."""
        from dynamo.llm.exceptions import InvalidArgument

        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Update] = asyncio.Queue()
        prompt = [int(t) for t in request["token_ids"]]
        stop = request.get("stop_conditions") or {}
        problem = limit_problem(len(prompt), stop.get("max_tokens"), self.max_input_len, self.engine.max_seq_len)
        if self.no_chat is not None and prompt[-len(self.no_chat[0]):] == self.no_chat[0]:
            problem = self.no_chat[1]
        if problem:
            raise InvalidArgument(problem)
        max_tokens = int(stop.get("max_tokens") or self.engine.max_seq_len - len(prompt))
        eos = None if stop.get("ignore_eos") else (request.get("eos_token_ids") or [None])[0]
        rid = self.engine.submit(prompt, max_tokens, _sampling(request), eos, int(stop.get("min_tokens") or 0),
                                 lambda update: loop.call_soon_threadsafe(queue.put_nowait, update))
        tokens: list[int] = []
        finished = False
        try:
            while True:
                update = await queue.get()
                if context is not None and getattr(context, "is_stopped", lambda: False)():
                    self.engine.cancel(rid)
                tokens += update.tokens
                if not update.finished:
                    if update.tokens:
                        yield {"token_ids": list(update.tokens)}
                    continue
                finished = True
                if update.error:
                    if update.error.startswith(REFUSED):
                        raise InvalidArgument(update.error.removeprefix(REFUSED))
                    raise RuntimeError(f"specbuild reference worker: {update.error}")
                self._log(prompt, tokens, update.accepted_draft_tokens, update.draft_tokens,
                          time.perf_counter() - started)
                yield {"token_ids": list(update.tokens), "finish_reason": _finish_reason(update.reason),
                       "completion_usage": acceptance_usage(len(prompt), len(tokens), update.accepted_draft_tokens,
                                                            update.draft_tokens)}
                return
        finally:
            if not finished:
                self.engine.cancel(rid)


async def serve(args: argparse.Namespace) -> None:
    from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    engine = EngineProcess(Path(args.settings), Path(args.reference), args.threads)
    tokenizer = Path(args.tokenizer)
    no_chat = None
    if not has_chat_template(tokenizer):
        from specbuild.tokenizer import load_tokenizer

        marker = NO_CHAT_TEMPLATE.read_text(encoding="utf-8").strip()
        no_chat = (list(load_tokenizer(tokenizer).encode(marker, add_special_tokens=False)),
                   NO_CHAT_MESSAGE.format(tokenizer))
    worker = Worker(engine, Path(args.requests_log) if args.requests_log else None, args.index, args.max_input_len,
                    no_chat)
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")

    def shutdown(*_: object) -> None:
        runtime.shutdown()

    engine.on_exit = lambda: loop.call_soon_threadsafe(shutdown)  # no engine: leave Dynamo, not serve errors

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown)
    endpoint = runtime.endpoint(f"{args.namespace}.{args.component}.generate")
    window = ModelRuntimeConfig()
    window.context_length = engine.max_seq_len  # the deployment's, not the checkpoint's max_position_embeddings
    await register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, args.tokenizer,
                         args.model_name, worker_type=WorkerType.Aggregated, kv_cache_block_size=args.block_size,
                         runtime_config=window, custom_template_path=None if no_chat is None else str(NO_CHAT_TEMPLATE))
    print(f"specbuild dynamo worker {args.index} ready (pid {os.getpid()})", flush=True)
    try:
        await endpoint.serve_endpoint(worker.generate)
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specbuild.dynamo.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--settings", required=True, help="the LLM-API settings file (YAML) deploy wrote")
    parser.add_argument("--reference", required=True, help="reference.json: the converted checkpoints")
    parser.add_argument("--tokenizer", required=True, help="the model directory the frontend tokenizes with")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--component", default="backend")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--max-input-len", type=int, required=True, help="the longest prompt served (tokens)")
    parser.add_argument("--requests-log", default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    try:  # the event loop Dynamo's own examples run on (hello_world.py: uvloop.install())
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
