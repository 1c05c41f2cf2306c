"""The contract of the synthetic length-generalization tasks (train on short inputs, test on
longer ones), and the checks they share.

A task is a `Generator`: asked for a length and given a seeded `random.Random`, it returns
one (input, output) pair of token lists. Task tokens are 0..symbols−1; the datamodule adds
its specials (PAD, SEP, EOS, and BOS with `bos`) after them and lays an example out for a
decoder as `input SEP output EOS`, with the loss and exact match on `output EOS`. With `bos`,
a beginning-of-sequence token opens the decoder's sequence (the encoder's input in
encoder_decoder): the anchor at position 0 that Kazemnejad et al. 2023 (arXiv 2305.19466,
Theorem 1) build NoPE's absolute positions on. What "length" means is the task's own measure
(list length, digits per operand, tokens), stated in its module.

An example may also mark output tokens as given: prompts inside the output (MQAR's queries in
Zoology's layout), fed to the model as they are, in training and in decoding alike, and
neither predicted nor scored. The end of such an output is given too: its prompts fix its
length, so there is nothing to predict there.

Examples come from Python's `random.Random` (a Mersenne Twister in the standard library), not
torch: for a given seed it draws the same examples on every platform and device, so a fixed
test set is the same everywhere. tests/test_tasks_synthetic.py pins one example per task so
that a change of the stream (an edit here, a Python release) cannot pass unnoticed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from attnlab.config.build import build
from attnlab.config.values import is_count, require_counts
from attnlab.data.batching import TokenBatchSampler
from attnlab.data.loader import ResumableLoader, ResumableSampler
from attnlab.data.task import IGNORE, SyntheticBatch, TaskData
from attnlab.errors import ConfigError
from attnlab.memory import check_free

OPTIONS = "task.data.generator"  # where a generator's options sit, for error messages
ARCHS = ("decoder", "encoder_decoder")
BYTES_PER_SYMBOL = 8  # a list's pointer to a small int (Python caches those): at least


class Example(NamedTuple):
    input: list[int]
    output: list[int]
    given: list[bool] | None = None  # per output token; None: every one is predicted


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


# the data of every synthetic task: generated sets, buckets of lengths, batches


class Item(NamedTuple):
    input: list[int]
    output: list[int]
    length: int
    bucket: int  # index into the split's buckets
    given: list[bool] | None = None  # as Example.given


@dataclass(frozen=True)
class Specials:
    """The ids after a task's `symbols` tokens: padding, the separator (also the decoder's
    first token in encoder_decoder), the end of the output and, where asked, the beginning of
    the sequence."""

    pad: int
    sep: int
    eos: int
    bos: int | None = None  # runs recorded before the option have none

    @classmethod
    def after(cls, symbols: int, bos: bool) -> Specials:
        return cls(symbols, symbols + 1, symbols + 2, symbols + 3 if bos else None)

    @property
    def count(self) -> int:
        return 3 if self.bos is None else 4

    @property
    def lead(self) -> list[int]:
        """What opens a sequence before its input: BOS, or nothing."""
        return [] if self.bos is None else [self.bos]


def buckets(first: int, width: int, longest: int) -> list[range]:
    """Lengths first..longest cut into buckets ending at width, 2·width, … and `longest`."""
    ends = [*range(width, longest, width), longest]
    starts = [first, *(end + 1 for end in ends[:-1])]
    return [range(start, end + 1) for start, end in zip(starts, ends, strict=True) if start <= end]


def drawn(generator: Generator, lengths: range, count: int, seed: str, bucket: int) -> list[Item]:
    """`count` examples whose lengths are uniform over `lengths`, from one seeded stream."""
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        length = rng.choice(lengths)
        example = Example(*generator.example(length, rng))
        items.append(Item(example.input, example.output, length, bucket, example.given))
    return items


class TrainExamples(Dataset):
    """The training set: example i has a length uniform over `lengths`, and it and its length
    come from a stream seeded by (seed, i) alone, so it is made when asked for, the same on
    every rank, worker and resumption."""

    def __init__(self, generator: Generator, lengths: range, size: int, seed: int) -> None:
        self.generator, self.lengths, self.size, self.seed = generator, lengths, size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Item:
        return drawn(self.generator, self.lengths, 1, f"train:{self.seed}:{index}", 0)[0]


def answer_rows(item: Item, eos: int) -> tuple[list[int], list[int]]:
    """The item's `output EOS` as scored (IGNORE at given tokens) and as forced (the given
    tokens, IGNORE at the others)."""
    whole = [*item.output, eos]
    if item.given is None:
        return whole, [IGNORE] * len(whole)
    given = [*item.given, True]  # a prompted output's end is given with its prompts
    scored = [IGNORE if g else token for token, g in zip(whole, given, strict=True)]
    forced = [token if g else IGNORE for token, g in zip(whole, given, strict=True)]
    return scored, forced


def collate(items: list[Item], specials: Specials, arch: str) -> SyntheticBatch:
    """A batch for `arch` (DecoderAnswerBatch or EncoderDecoderAnswerBatch). A decoder's
    rows are right-padded: a causal stack never reads the padding of a row from its real
    tokens."""
    rows = len(items)
    answers = torch.full((rows, max(len(i.output) for i in items) + 1), IGNORE)
    forced = torch.full_like(answers, IGNORE)
    for row, item in enumerate(items):
        scored, given = answer_rows(item, specials.eos)
        answers[row, : len(scored)], forced[row, : len(given)] = map(torch.tensor, (scored, given))
    batch = {
        "answers": answers,
        "forced": forced,
        "lengths": torch.tensor([item.length for item in items]),
        "buckets": torch.tensor([item.bucket for item in items]),
    }
    lead = specials.lead
    if arch == "decoder":
        sequences = [[*lead, *i.input, specials.sep, *i.output, specials.eos] for i in items]
        tokens = torch.full((rows, max(map(len, sequences))), specials.pad)
        targets = torch.full((rows, tokens.shape[1] - 1), IGNORE)
        for row, (item, sequence) in enumerate(zip(items, sequences, strict=True)):
            tokens[row, : len(sequence)] = torch.tensor(sequence)
            answer = len(lead) + len(item.input)  # predicted from SEP on
            targets[row, answer : len(sequence) - 1] = answers[row, : len(item.output) + 1]
        prompt = torch.tensor([len(lead) + len(item.input) + 1 for item in items])
        return {**batch, "tokens": tokens, "targets": targets, "prompt": prompt}
    src = torch.full((rows, len(lead) + max(len(i.input) for i in items)), specials.pad)
    tgt = torch.full_like(answers, specials.pad)
    tgt[:, 0] = specials.sep
    for row, item in enumerate(items):
        src[row, : len(lead) + len(item.input)] = torch.tensor([*lead, *item.input])
        tgt[row, 1 : len(item.output) + 1] = torch.tensor(item.output)
    return {**batch, "src": src, "tgt": tgt}


class Batches(Dataset):
    """A fixed evaluation set served a whole batch at a time (items are lists of positions,
    as TokenBatchSampler deals them)."""

    def __init__(self, items: list[Item], specials: Specials, arch: str) -> None:
        self.items, self.specials, self.arch = items, specials, arch

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, positions: list[int]) -> SyntheticBatch:
        return collate([self.items[p] for p in positions], self.specials, self.arch)


def eval_batches(items: list[Item], size: int) -> list[np.ndarray]:
    """Batches of at most `size` positions holding one input length each, so that a decoder's
    prompts end together and greedy decoding steps them as one."""
    order = sorted(range(len(items)), key=lambda p: (len(items[p].input), p))
    groups = itertools.groupby(order, key=lambda p: len(items[p].input))
    return [
        np.array(group[start : start + size])
        for _, found in groups
        for group in [list(found)]
        for start in range(0, len(group), size)
    ]


class SyntheticData(TaskData):
    """A generated task (`generator`, built from its config node): training examples of lengths
    train_min_len..train_max_len, validation at those lengths, and a test in buckets of
    `bucket` lengths up to test_max_len. Validation and test sets come from `test_seed`
    alone, so every configuration and training seed is scored on the same examples. `bos`
    opens every sequence with a beginning-of-sequence token (module docstring)."""

    def __init__(
        self,
        generator: dict | None,
        arch: str,
        train_min_len: int,
        train_max_len: int,
        test_max_len: int | None,
        bucket: int | None,
        train_size: int,
        val_size: int,
        test_size: int,
        batch_size: int,
        eval_batch_size: int,
        test_seed: int,
        seed: int,
        num_workers: int,
        bos: bool,
    ) -> None:
        super().__init__()
        if generator is None:
            raise ConfigError(
                "task.data.generator is not set: choose a task that has one, e.g. task=copy "
                "(copy, reverse, sort, addition, parity, mqar, passkey)"
            )
        self.generator: Generator = build(generator)
        if arch not in ARCHS:
            raise ConfigError(f"task.arch={arch!r} is not one of: {', '.join(ARCHS)}")
        require_counts("task.data", train_size=train_size, val_size=val_size, test_size=test_size)
        require_counts("task.data", batch_size=batch_size, eval_batch_size=eval_batch_size)
        require_counts("task.data", least=0, test_seed=test_seed, num_workers=num_workers)
        shortest = self.generator.min_length
        if not is_count(train_min_len, shortest):
            raise ConfigError(
                f"task.data.train_min_len={train_min_len!r} must be an integer of at least "
                f"{shortest}, the shortest example {type(self.generator).__name__} can make"
            )
        require_counts("task.data", least=train_min_len, train_max_len=train_max_len)
        longest = 4 * train_max_len if test_max_len is None else test_max_len
        width = train_max_len if bucket is None else bucket
        require_counts("task.data", least=train_max_len, test_max_len=longest)
        require_counts("task.data", bucket=width)
        self.arch, self.specials = arch, Specials.after(self.generator.symbols, bos)
        self.train_lengths = range(train_min_len, train_max_len + 1)
        self.test_buckets = buckets(train_min_len, width, longest)
        self.sizes = {"train": train_size, "valid": val_size, "test": test_size}
        check_free(
            self.most_eval_symbols() * BYTES_PER_SYMBOL,
            f"task.data.train_max_len={train_max_len}, test_max_len={longest}, "
            f"val_size={val_size} and test_size={test_size} make evaluation sets of up to "
            f"{self.most_eval_symbols():,} symbols, which",
            "lower the lengths or the sizes",
        )
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.test_seed, self.seed, self.num_workers = test_seed, seed, num_workers

    def most_eval_symbols(self) -> int:
        """The symbols the validation and test sets hold at most: each example's input and
        output at its bucket's longest length (an output is at most about its input)."""
        valid = self.sizes["valid"] * (self.train_lengths.stop - 1)
        test = self.sizes["test"] * sum(lengths.stop - 1 for lengths in self.test_buckets)
        return 2 * (valid + test)

    @functools.cached_property
    def eval_sets(self) -> dict[str, list[Item]]:
        """The validation and test examples (made once, on first use)."""
        seed, sizes = self.test_seed, self.sizes
        valid = drawn(self.generator, self.train_lengths, sizes["valid"], f"valid:{seed}", 0)
        test = []
        for index, lengths in enumerate(self.test_buckets):
            end = lengths.stop - 1
            test += drawn(self.generator, lengths, sizes["test"], f"test:{seed}:{end}", index)
        return {"valid": valid, "test": test}

    def bucket_ends(self, split: str) -> list[int]:
        """The longest length of each bucket `split` is scored in: its metrics' names."""
        scored = [self.train_lengths] if split == "valid" else self.test_buckets
        return [lengths.stop - 1 for lengths in scored]

    def has_split(self, split: str) -> bool:
        return True  # generated: every split exists

    def model_kwargs(self) -> dict[str, Any]:
        return {
            "vocab_size": self.generator.symbols + self.specials.count,
            "specials": dataclasses.asdict(self.specials),
            "arch": self.arch,
        }

    @property
    def max_seq_len(self) -> int:
        items = [item for found in self.eval_sets.values() for item in found]
        lead = len(self.specials.lead)
        if self.arch == "decoder":  # [BOS] input SEP output: the EOS is never read
            return max(lead + len(i.input) + 1 + len(i.output) for i in items)
        return max(max(lead + len(i.input), len(i.output) + 1) for i in items)

    def train_dataloader(self) -> DataLoader:
        dataset = TrainExamples(self.generator, self.train_lengths, self.sizes["train"], self.seed)
        world, rank = self.world()
        sampler = ResumableSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=self.seed
        )
        return ResumableLoader(
            dataset, sampler=sampler, batch_size=self.batch_size, num_workers=self.num_workers,
            collate_fn=functools.partial(collate, specials=self.specials, arch=self.arch),
        )  # fmt: skip

    def _eval_loader(self, split: str) -> DataLoader:
        items = self.eval_sets[split]
        dataset = Batches(items, self.specials, self.arch)
        world, rank = self.world()
        batches = eval_batches(items, self.eval_batch_size)
        sampler = TokenBatchSampler(batches, False, self.seed, world, rank)
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("valid")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
