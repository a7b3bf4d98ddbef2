"""deploy stage: writes and checks a Triton model repository in the TensorRT-LLM backend's layout.

`repository.deploy_repository` writes it (configs generated from `specbuild.contracts.triton_backend`), `check`
checks a written one; the Python models it ships run `specbuild.python_models`, and `specbuild.serve` starts it.
"""
