"""The position probe (Su 2022, kexue.fm/archives/9105): n identical tokens -> positions 1..n.

Each input is n copies of the token "0" (optionally wrapped as [CLS] 0 … 0 [SEP]); the
target of the i-th "0" is class i (positions 1..n are classes 0..n−1). A PE that only
touches pre-softmax scores keeps every position identical under softmax, so it cannot
learn this; absolute PEs, markers, and non-row-stochastic normalizers can.

Training lengths are drawn uniformly from [min_len, max_len]. Validation holds one sequence
of every training length, so that checkpoints are chosen on the lengths trained on; test
holds one of every length in [eval_min_len, eval_max_len] (all sequences of one length are
identical). A test range past max_len measures extrapolation: to unseen lengths (positions
≤ max_len of longer sequences) and to unseen positions.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from attnlab.config.values import require_counts
from attnlab.data.loader import ResumableLoader, ResumableSampler
from attnlab.data.task import IGNORE, TaggedBatch, TaskData
from attnlab.errors import ConfigError
from attnlab.memory import check_free

PAD, ZERO, CLS, SEP = 0, 1, 2, 3
EXAMPLE_BYTES = 1024  # a tuple of two tensors, measured as resident memory
POSITION_BYTES = 16  # a token and a target, int64 each


def probe_example(length: int, markers: bool) -> tuple[Tensor, Tensor]:
    """(tokens, targets) of one probe sequence."""
    tokens = torch.full((length,), ZERO)
    targets = torch.arange(length)
    if markers:
        tokens = torch.cat((torch.tensor([CLS]), tokens, torch.tensor([SEP])))
        targets = torch.cat((torch.tensor([IGNORE]), targets, torch.tensor([IGNORE])))
    return tokens, targets


def collate(batch: list[tuple[Tensor, Tensor]]) -> TaggedBatch:
    tokens = torch.nn.utils.rnn.pad_sequence([t for t, _ in batch], True, PAD)
    targets = torch.nn.utils.rnn.pad_sequence([y for _, y in batch], True, IGNORE)
    return {"tokens": tokens, "targets": targets, "padding": tokens == PAD}


class ProbeDataModule(TaskData):
    vocab_size = 4

    def __init__(
        self,
        min_len: int,
        max_len: int,
        eval_min_len: int | None,
        eval_max_len: int | None,
        markers: bool,
        train_size: int,
        batch_size: int,
        seed: int,
        num_workers: int,
    ) -> None:
        super().__init__()
        require_counts("task.data", batch_size=batch_size, train_size=train_size)
        require_counts("task.data", least=0, num_workers=num_workers)
        self.eval_min_len = min_len if eval_min_len is None else eval_min_len
        self.eval_max_len = max_len if eval_max_len is None else eval_max_len
        if not 1 <= min_len <= max_len or not 1 <= self.eval_min_len <= self.eval_max_len:
            raise ConfigError(
                f"probe lengths need 1 <= min_len <= max_len and 1 <= eval_min_len <= eval_max_len; "
                f"got train [{min_len}, {max_len}], eval [{self.eval_min_len}, {self.eval_max_len}]"
            )
        if max(max_len, self.eval_max_len) < 2:
            raise ConfigError(
                f"task.data.max_len={max_len} gives the probe one position, one class: nothing "
                "to tell apart; give max_len (or eval_max_len) of at least 2"
            )
        self.min_len, self.max_len, self.markers = min_len, max_len, markers
        self.train_size, self.batch_size, self.seed = train_size, batch_size, seed
        examples, positions = self.extent()
        check_free(
            examples * EXAMPLE_BYTES + positions * POSITION_BYTES,
            f"task.data.train_size={train_size} and the lengths (max_len={max_len}, "
            f"eval_max_len={self.eval_max_len}) make probe sets of {examples:,} sequences and "
            f"{positions:,} positions, which",
            "lower train_size or the lengths",
        )
        self.num_workers = num_workers

    def extent(self) -> tuple[int, int]:
        """The sequences the three sets hold, and their positions (training's on average)."""
        lengths = (self.max_len - self.min_len + 1, self.eval_max_len - self.eval_min_len + 1)
        evaluated = sum(n * (first + last) // 2 for n, first, last in (
            (lengths[0], self.min_len, self.max_len),
            (lengths[1], self.eval_min_len, self.eval_max_len),
        ))  # fmt: skip
        trained = self.train_size * (self.min_len + self.max_len) // 2
        markers = 2 * self.markers * (self.train_size + sum(lengths))
        return self.train_size + sum(lengths), trained + evaluated + markers

    @property
    def num_classes(self) -> int:
        return max(self.max_len, self.eval_max_len)

    @property
    def max_seq_len(self) -> int:
        return self.num_classes + 2 * self.markers

    def has_split(self, split: str) -> bool:
        return True  # generated: every split exists

    def model_kwargs(self) -> dict[str, int]:
        return {"vocab_size": self.vocab_size, "num_classes": self.num_classes}

    def setup(self, stage: str | None = None) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        lengths = torch.randint(
            self.min_len, self.max_len + 1, (self.train_size,), generator=generator
        )
        self.train_set = [probe_example(int(n), self.markers) for n in lengths]
        self.val_set = self._one_per_length(self.min_len, self.max_len)
        self.test_set = self._one_per_length(self.eval_min_len, self.eval_max_len)

    def _one_per_length(self, shortest: int, longest: int) -> list[tuple[Tensor, Tensor]]:
        return [probe_example(n, self.markers) for n in range(shortest, longest + 1)]

    def _loader(self, data: list, shuffle: bool) -> DataLoader:
        world, rank = self.world()
        sampler = ResumableSampler(
            data, num_replicas=world, rank=rank, shuffle=shuffle, seed=self.seed
        )
        return ResumableLoader(
            data, sampler=sampler, batch_size=self.batch_size, collate_fn=collate,
            num_workers=self.num_workers,
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
