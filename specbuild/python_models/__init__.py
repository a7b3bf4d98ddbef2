"""The code behind the Python models a deployed repository ships (preprocessing, postprocessing, the reference
`tensorrt_llm` model and the BLS), run inside Triton's python backend; `specbuild/triton_models/*/1/model.py` are
the thin entry points that Triton loads, everything here is importable and testable without a server."""
