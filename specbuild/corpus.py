"""The built-in text: Python's own reference documentation, which ships with every Python (`pydoc_data.topics`).

No text can be downloaded where specbuild runs its tests, yet the demo models need training text, quantization
needs calibration text and `tune` needs prompts. This corpus serves all three, split once by one rule: topics
sorted by name, every `HELDOUT_EVERY`-th held out. The demo models, their tokenizer and the Medusa heads are trained
(and drafts calibrated) on the training part only, so evaluations and tuning on the held-out part stay unseen.
"""

from __future__ import annotations

HELDOUT_EVERY = 10
"""Every 10th pydoc topic (sorted by name) is held out of all training."""


def all_topics() -> list[str]:
    """Every topic's text, sorted by topic name (a stable order: the demo recipe hashes it)."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def split_topics(heldout_every: int = HELDOUT_EVERY) -> tuple[list[str], list[str]]:
    """(training topics, held-out topics)."""
    texts = all_topics()
    held = set(range(0, len(texts), heldout_every))
    return [t for i, t in enumerate(texts) if i not in held], [t for i, t in enumerate(texts) if i in held]


def training_texts(heldout_every: int = HELDOUT_EVERY) -> list[str]:
    """The topics the demo tokenizer and models are trained on (also the `builtin` calibration text)."""
    return split_topics(heldout_every)[0]


def heldout_texts(heldout_every: int = HELDOUT_EVERY) -> list[str]:
    """The topics no demo model or tokenizer was trained on, for evaluations and tuning prompts."""
    return split_topics(heldout_every)[1]
