"""The contract between a corpus of (source, target) text pairs and the data layer.

Translation reads sentence pairs; dialogue makes (context, response) pairs from
conversations. Everything downstream (tokenizers, the token cache, batching) sees a Corpus.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

SPLITS = ("train", "valid", "test")
Pair = tuple[int, str, str]  # the pair's index in its split (a line), source text, target text


class Corpus(Protocol):
    """What the data layer needs from a source of text pairs."""

    def identity(self, split: str) -> dict[str, Any]:
        """JSON-able description of the split's content, cheap to compute (cache keys)."""

    def describe(self, split: str) -> str: ...

    def has(self, split: str) -> bool: ...

    def num_rows(self, split: str) -> int: ...

    def pairs(self, split: str, rows: np.ndarray | None = None) -> Iterator[Pair]:
        """The split's pairs in order, or only those at `rows` (sorted indices)."""
