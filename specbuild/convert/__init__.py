"""The convert stage: Hugging Face checkpoints -> TensorRT-LLM checkpoints (config.json + rank{N}.safetensors)."""
