"""Contracts: data that two sides of the pipeline read, kept in one place so that they cannot drift apart.

`triton_backend` is the TensorRT-LLM 1.2 Triton backend's wire contract (every input, output and parameter of
NVIDIA's five model templates): `deploy` generates the repository's configs from it and the tests check the
written configs and the reference models' answers against it.
"""
