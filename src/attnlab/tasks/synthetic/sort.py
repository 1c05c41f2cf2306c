"""Sort over a fixed alphabet (Delétang et al. 2023, "Neural Networks and the Chomsky
Hierarchy", ICLR 2023, arXiv 2207.02098, bucket sort; Kazemnejad et al. 2023, NeurIPS 2023,
arXiv 2305.19466, Table 1): the output is the input in increasing order.

Length = the number of input symbols; the output has the same length. Symbols 0..alphabet−1
are drawn independently and uniformly, so duplicates are frequent. A fixed alphabet of single
tokens (Delétang's default is 5 symbols) makes the task about positions and counts, not
about comparing numbers; Kazemnejad's single-token variant uses 50.
"""

from __future__ import annotations

import random

from attnlab.config.values import is_count
from attnlab.errors import ConfigError
from attnlab.tasks.synthetic.data import OPTIONS, Example, random_symbols, require_length


class Sort:
    min_length = 1

    def __init__(self, alphabet: int) -> None:
        if not is_count(alphabet, 2):
            raise ConfigError(
                f"{OPTIONS}.alphabet={alphabet!r} must be an integer of at least 2: "
                "a list of one symbol is already sorted"
            )
        self.symbols = alphabet

    def example(self, length: int, rng: random.Random) -> Example:
        require_length("sort", length, self.min_length)
        tokens = random_symbols(length, self.symbols, rng)
        return tokens, sorted(tokens)
