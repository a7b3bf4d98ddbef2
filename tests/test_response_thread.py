"""The reference models' response thread (`specbuild.python_models.response_thread`): the engine's thread hands a
response over and steps on, as NVIDIA's C++ backend does with its WaitForResponse thread
(TensorRT-LLM `triton_backend/inflight_batcher_llm/src/model_instance_state.cc` @0c8de69a); the served paths
through it are exercised by every tritonserver test of the reference repositories."""

from __future__ import annotations

import threading

from specbuild.python_models.response_thread import ResponseThread


def test_a_send_that_waits_does_not_hold_up_the_caller_and_order_is_kept() -> None:
    """While tritonserver has not taken one response yet, the engine's thread goes on making the next ones; they
    leave in the order they were made, on one thread other than the caller's."""
    taken = threading.Event()
    sent: list[tuple[int, str]] = []
    errors: list[str] = []
    responses = ResponseThread("test-responses", errors.append)

    def deliver(index: int) -> None:
        if index == 0:
            assert taken.wait(10), "the first send was never let through"
        sent.append((index, threading.current_thread().name))

    for index in range(5):
        responses.put(lambda index=index: deliver(index))  # returns while the first send still waits
    assert sent == []
    taken.set()
    responses.close()
    assert [index for index, _ in sent] == [0, 1, 2, 3, 4]
    assert {name for _, name in sent} == {"test-responses"}
    assert errors == []


def test_a_failed_send_is_reported_and_the_next_ones_still_go() -> None:
    """One client's broken stream (its send raises) is logged; the other requests' responses still leave."""
    sent: list[int] = []
    errors: list[str] = []
    responses = ResponseThread("test-responses", errors.append)

    def broken() -> None:
        raise ConnectionError("stream closed by the client")

    responses.put(lambda: sent.append(1))
    responses.put(broken)
    responses.put(lambda: sent.append(2))
    responses.close()
    assert sent == [1, 2]
    assert errors == ["response not sent: ConnectionError: stream closed by the client"]
