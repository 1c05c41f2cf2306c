"""Reverse (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers", NeurIPS 2023, arXiv 2305.19466, Table 1 and App. D.1;
Delétang et al. 2023, "Neural Networks and the Chomsky Hierarchy", ICLR 2023, arXiv
2207.02098, reverse string): the output is the input in reverse order.

Length = the number of input symbols; the output has the same length. Symbols 0..alphabet−1
are drawn independently and uniformly, as in attnlab.tasks.synthetic.copy. In `input SEP output` the
i-th output token (i = 0..length−1) copies the input token 2i+2 positions back, so longer
inputs ask for distances never seen in training.
"""

from __future__ import annotations

import random

from attnlab.config.values import require_counts
from attnlab.tasks.synthetic.data import OPTIONS, Example, random_symbols, require_length


class Reverse:
    min_length = 1

    def __init__(self, alphabet: int) -> None:
        require_counts(OPTIONS, alphabet=alphabet)
        self.symbols = alphabet

    def example(self, length: int, rng: random.Random) -> Example:
        require_length("reverse", length, self.min_length)
        tokens = random_symbols(length, self.symbols, rng)
        return tokens, tokens[::-1]
