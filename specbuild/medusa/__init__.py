"""Medusa: the token tree the runtime verifies (`tree`) and heads trained on a frozen base (`train`).

Only the tree is imported here; `specbuild.medusa.train` pulls in transformers and is imported on demand.
"""

from specbuild.medusa.tree import MedusaTree, accept_greedy, accept_typical, load_choices, preset_names

__all__ = ["MedusaTree", "accept_greedy", "accept_typical", "load_choices", "preset_names"]
