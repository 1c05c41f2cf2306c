"""Decimal addition (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers", NeurIPS 2023, arXiv 2305.19466, Table 1 and App. D.1):
input `a + b` as digit tokens, output the digits of a + b.

Length = the number of digits of each operand; both operands have `length` digits, with a
nonzero leading digit unless length is 1 (then 0..9), so a and b are uniform over the
length-digit numbers. Tokens: digits 0..9 stand for themselves, PLUS = 10. The input is
`length` + 1 + `length` tokens; the output is the sum without leading zeros, `length` or
`length` + 1 digits (for length ≥ 2 about 60% of the sums carry into a new digit), so the
model must decide where the answer ends. Nothing is zero-padded: padding would tell the
model the answer's length.

`reverse_digits` writes the operands and the answer least-significant digit first (as
Delétang et al. 2023's binary addition, arXiv 2207.02098): each answer digit then depends on
the operand digits at the same offset plus a carry from the previous one, and is emitted
after them. Most-significant first (default) is Kazemnejad's order.

Kazemnejad space the digits in a prompt ("Compute: 5 3 7 + 1 9 1 ?") and also draw operands
of different lengths (a-by-b buckets); here both operands have the length of the bucket.
"""

from __future__ import annotations

import random

from attnlab.tasks.synthetic.data import Example, require_flags, require_length

PLUS = 10


class Addition:
    symbols = 11
    min_length = 1

    def __init__(self, reverse_digits: bool) -> None:
        require_flags(reverse_digits=reverse_digits)
        self.reverse_digits = reverse_digits

    def example(self, length: int, rng: random.Random) -> Example:
        require_length("addition", length, self.min_length)
        a, b = operand(length, rng), operand(length, rng)
        total = add(a, b)
        if self.reverse_digits:
            a, b, total = a[::-1], b[::-1], total[::-1]
        return [*a, PLUS, *b], total


def operand(length: int, rng: random.Random) -> list[int]:
    """A uniform `length`-digit number, most-significant digit first."""
    lead = rng.randrange(1 if length > 1 else 0, 10)
    return [lead] + [rng.randrange(10) for _ in range(length - 1)]


def add(a: list[int], b: list[int]) -> list[int]:
    """The digits of a + b (equal-length digit lists, most-significant first), by column
    addition: no int conversion, so operands past Python's 4300-digit str limit work."""
    digits, carry = [], 0
    for x, y in zip(reversed(a), reversed(b), strict=True):
        carry, digit = divmod(x + y + carry, 10)
        digits.append(digit)
    if carry:
        digits.append(carry)
    return digits[::-1]
