"""The contract of the synthetic length-generalization tasks (train on short inputs, test on
longer ones), and the checks they share.

A task is a `Generator`: asked for a length and given a seeded `random.Random`, it returns
one (input, output) pair of token lists. Task tokens are 0..symbols−1; the datamodule adds
its specials (PAD, SEP, EOS) after them and lays an example out for a decoder as
`input SEP output EOS`, with the loss and exact match on `output EOS`. What "length" means
is the task's own measure (list length, digits per operand, tokens), stated in its module.

Examples come from Python's `random.Random` (a Mersenne Twister in the standard library), not
torch: for a given seed it draws the same examples on every platform and device, so a fixed
test set is the same everywhere. tests/test_tasks_synthetic.py pins one example per task so
that a change of the stream (an edit here, a Python release) cannot pass unnoticed.
"""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable

from attnlab.config import ConfigError, is_count

OPTIONS = "task"  # where a generator's options sit in the config, for error messages

Example = tuple[list[int], list[int]]  # (input, output)


@runtime_checkable
class Generator(Protocol):
    """A synthetic task: examples of a given length from a seeded random source."""

    symbols: int  # task tokens are 0..symbols−1
    min_length: int  # the shortest length `example` accepts

    def example(self, length: int, rng: random.Random) -> Example:
        """(input, output) token lists of one example whose length is `length` (the task's
        own measure of length, documented in its module)."""
        ...


def require_length(task: str, length: Any, least: int) -> None:
    """ConfigError unless `length` is an integer of at least `least`."""
    if not is_count(length, least):
        raise ConfigError(
            f"{task} examples need an integer length of at least {least}, got {length!r}"
        )


def require_flags(**values: Any) -> None:
    """ConfigError for the first option that is not true or false."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{OPTIONS}.{name}={value!r} must be true or false")


def random_symbols(length: int, alphabet: int, rng: random.Random) -> list[int]:
    """`length` symbols drawn independently and uniformly from 0..alphabet−1."""
    return [rng.randrange(alphabet) for _ in range(length)]
