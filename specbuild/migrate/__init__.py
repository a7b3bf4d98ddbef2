"""`specbuild migrate`: an engine-flow spec rewritten for a later, PyTorch-only TensorRT-LLM line (`rewrite`), and
the reference runtime's tokens per target forward of the old and the new method (`measure`), so a user sees what
the move costs or gains before a GPU is involved."""
