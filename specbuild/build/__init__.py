"""build stage (see shared/DESIGN.md): plans per engine, checks, and engines or reference bundles.

`build_pipeline(spec, ...)` is the entry point; `engine_info` is the contract with `deploy`.
"""

from specbuild.build.stage import EngineResult, build_pipeline

__all__ = ["EngineResult", "build_pipeline"]
