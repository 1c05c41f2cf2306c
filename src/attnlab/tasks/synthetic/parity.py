"""Parity (Anil et al. 2022, "Exploring Length Generalization in Large Language Models",
NeurIPS 2022, arXiv 2207.04901; in Kazemnejad et al. 2023, NeurIPS 2023, arXiv 2305.19466,
Table 1): input `length` bits, output one token, the number of 1s mod 2.

Length = the number of input bits, drawn independently and uniformly. Tokens 0 and 1 are the
bits; the answer uses the same tokens (0: even, 1: odd); Kazemnejad ask "Is the number of
1's even?" and answer Yes/No. Classes are exactly balanced in expectation at every length:
the last bit is independent of the others and flips the parity half of the time, so P(odd) =
1/2. A constant guess therefore scores about 50% in every length bucket; report accuracy
against that chance level (a finite bucket of N examples strays by about 0.5/√N).
"""

from __future__ import annotations

import random

from attnlab.tasks.synthetic.data import Example, random_symbols, require_length


class Parity:
    symbols = 2
    min_length = 1

    def example(self, length: int, rng: random.Random) -> Example:
        require_length("parity", length, self.min_length)
        bits = random_symbols(length, 2, rng)
        return bits, [sum(bits) % 2]
