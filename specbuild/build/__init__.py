"""build stage: plans per engine, checks, and TensorRT-LLM engines or reference bundles.

`build_pipeline(spec, ...)` is the entry point; what it promises `deploy` is `specbuild.contracts.engine_info`.
"""

from specbuild.build.stage import EngineResult, build_pipeline

__all__ = ["EngineResult", "build_pipeline"]
