"""Copy (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization
in Transformers", NeurIPS 2023, arXiv 2305.19466, Table 1 and App. D.1): the output repeats
the input.

Length = the number of input symbols; the output has the same length. Symbols 0..alphabet−1
are drawn independently and uniformly. With `identical`, one symbol (drawn per example) fills
the whole list, Kazemnejad's identical-token variant: once the first output token is known
only counting to `length` is left, so it tests counting without lookup.

Kazemnejad wrap words in a prompt ("Copy the following words: …"); here the symbols are bare
tokens. The alphabet decides what copying needs: with many symbols few repeat, and a model
can copy by content (find the token it just wrote in the input, emit its successor); with
few, repeats make that ambiguous and the model must track positions.
"""

from __future__ import annotations

import random

from attnlab.config.values import require_counts
from attnlab.tasks.synthetic.data import (
    OPTIONS,
    Example,
    random_symbols,
    require_flags,
    require_length,
)


class Copy:
    min_length = 1

    def __init__(self, alphabet: int, identical: bool) -> None:
        require_counts(OPTIONS, alphabet=alphabet)
        require_flags(identical=identical)
        self.symbols, self.identical = alphabet, identical

    def example(self, length: int, rng: random.Random) -> Example:
        require_length("copy", length, self.min_length)
        if self.identical:
            tokens = [rng.randrange(self.symbols)] * length
        else:
            tokens = random_symbols(length, self.symbols, rng)
        return tokens, list(tokens)
