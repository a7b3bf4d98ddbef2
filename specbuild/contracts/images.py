"""The NGC images of the engine flow: the TensorRT-LLM release container `build` runs in, and the Triton image that
serves the engines it builds (a TensorRT engine runs only under the TensorRT-LLM release that built it).

Triton release -> TensorRT-LLM release: NVIDIA's compatibility matrix (triton-inference-server/server
docs/introduction/compatibility.md @0f963c9a8c6913aa4cd9b57ee04f9c2b76ee8d2a, "Container Name: trtllm-python-py3"):
26.03 carries TensorRT-LLM 1.2.0, 26.04 to 26.07 carry 1.2.1.
"""

from __future__ import annotations

ENGINE_TRTLLM_RELEASE = "1.2.0"
"""The TensorRT-LLM release whose `trtllm-build` the engine plans are written for (the last line with engines)."""
TRTLLM_BUILD_CONTAINER = f"nvcr.io/nvidia/tensorrt-llm/release:{ENGINE_TRTLLM_RELEASE}"
"""NGC release container with that TensorRT-LLM (build engines in it)."""
TRITON_TRTLLM_IMAGES: dict[str, str] = {
    "1.2.0": "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3",
    "1.2.1": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
}
"""TensorRT-LLM release -> the newest Triton trtllm-python-py3 image carrying it (see the module docstring)."""
TRITON_ENGINE_IMAGE = TRITON_TRTLLM_IMAGES[ENGINE_TRTLLM_RELEASE]
"""The tritonserver image for the engines `build` makes."""
