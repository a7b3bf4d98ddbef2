"""specbuild: Hugging Face checkpoints to a speculative-decoding service on Triton Inference Server."""

__version__ = "0.1.0"
