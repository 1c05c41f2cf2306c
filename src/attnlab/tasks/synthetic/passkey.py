"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite
Context Length for Transformers", NeurIPS 2023, arXiv 2305.16300, Fig. 3), tokenized: find a
key hidden in filler and repeat it.

Input: filler, KEY, the key's `key_digits` digit tokens, filler, QUERY; output: the key's
digits. Length = the number of input tokens, so the filler holds length − key_digits − 2
tokens. Tokens: digits 0..9, KEY = 10, QUERY = 11, then `filler_tokens` filler tokens
12, 13, … repeated in that order (the paper's five repeated sentences), restarting after the
key as the reference code restarts its filler string.

Depth = the fraction of the filler placed before the key: 0 puts the key first, 1 right
before the query. `depth` fixes it (the prefix is depth × filler, rounded to the nearest
token, ties to even); null draws the prefix uniformly from 0..filler tokens, as the
reference code does in characters. `at_depth` makes one example at a given depth, for
accuracy per (length, depth).

Differences from the paper: no instruction line and no sentences (a model trained from
scratch learns the format); the key appears once ("The pass key is K. Remember it. K is the
pass key." states it twice); the key is `key_digits` uniform digits, leading zeros allowed,
instead of an integer in 1..50000, so every answer has the same length and is scored by
exact match of all its digits.
"""

from __future__ import annotations

import random

from attnlab.config.values import is_number, require_counts
from attnlab.errors import ConfigError
from attnlab.tasks.synthetic.data import OPTIONS, Example, require_length

KEY, QUERY, FILLER = 10, 11, 12


class Passkey:
    def __init__(self, key_digits: int, filler_tokens: int, depth: float | None) -> None:
        require_counts(OPTIONS, key_digits=key_digits, filler_tokens=filler_tokens)
        if depth is not None:
            require_depth(depth)
        self.key_digits, self.filler_tokens, self.depth = key_digits, filler_tokens, depth
        self.symbols = FILLER + filler_tokens
        self.min_length = key_digits + 2

    def example(self, length: int, rng: random.Random) -> Example:
        return self.at_depth(length, self.depth, rng)

    def at_depth(self, length: int, depth: float | None, rng: random.Random) -> Example:
        """An example whose key sits at `depth` (null: a uniform depth)."""
        require_length("passkey", length, self.min_length)
        filler = length - self.key_digits - 2
        if depth is None:
            prefix = rng.randint(0, filler)
        else:
            require_depth(depth)
            prefix = round(depth * filler)
        key = [rng.randrange(10) for _ in range(self.key_digits)]
        tokens = [*self.pattern(prefix), KEY, *key, *self.pattern(filler - prefix), QUERY]
        return tokens, key

    def pattern(self, size: int) -> list[int]:
        return [FILLER + i % self.filler_tokens for i in range(size)]


def require_depth(depth: float) -> None:
    if not (is_number(depth) and 0 <= depth <= 1):
        raise ConfigError(
            f"passkey depth={depth!r} must be a number in [0, 1] (0: key first, 1: key last), "
            "or null for a random depth"
        )
