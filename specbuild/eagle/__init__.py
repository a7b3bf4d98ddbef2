"""EAGLE-3 (Li et al. 2025, arXiv 2503.01840): the draft checkpoint format that TensorRT-LLM's PyTorch backend,
vLLM and SGLang load (`format`, torch only for the tensors). The draft's inference module lives in the reference
runtime (`specbuild.runtime.eagle3`), its decoding loop in `specbuild.runtime.eagle3_decoding`.
"""
