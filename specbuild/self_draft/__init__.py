"""Self-draft adapters: one decoder layer trained on a frozen target so that its first L layers draft better.

`adapter_format` is the file format (read by `convert` and `specbuild validate`, written by the trainer);
`train` fits an adapter by distillation from the target's own logits (`specbuild draft train`).
"""
