"""build stage: plans per engine, checks, and TensorRT-LLM engines or reference bundles.

`build_pipeline(spec, ...)` is the entry point; what it promises `deploy` is `specbuild.contracts.engine_info`
(engine.json) and `specbuild.contracts.engine_limits` (what the spec asks of each engine).
"""

from specbuild.build.stage import EngineResult, build_pipeline

__all__ = ["EngineResult", "build_pipeline"]
