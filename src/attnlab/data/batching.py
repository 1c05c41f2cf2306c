"""Token-budget batches: length filters, length-bucketed order, batches of at most
`max_tokens` padded tokens, their DDP-aware sampler, and the batch (`collate`: a
PairBatch, declared in attnlab.data.task). Dropped empty pairs leave gaps in its `index`.

Distributed data parallel: the batch sampler is a DistributedSampler, so Lightning keeps it
whatever `trainer.use_distributed_sampler` says and calls its `set_epoch`. It deals batches
round-robin to the trainer's world size, after halving the largest batches until the count
divides evenly: every rank runs the same number of steps, and every pair is seen exactly
once, never repeated as padding.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.data.cache import EncodedPair, SplitData
from attnlab.data.loader import ResumableSampler
from attnlab.data.task import PairBatch
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.errors import ConfigError


def length_filter(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_len: int,
    max_ratio: float | None,
    cut_sources: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Masks of pairs with a sequence over max_len (only targets count when long sources are
    cut instead), and of the others whose token counts (without specials) differ by more
    than a factor max_ratio (None: no such filter)."""
    too_long = tgt_lengths > max_len
    if not cut_sources:
        too_long |= src_lengths > max_len
    if max_ratio is None:
        return too_long, np.zeros_like(too_long)
    src_ids, tgt_ids = src_lengths - 1, tgt_lengths - 2
    ratio = np.maximum(src_ids, tgt_ids) / np.maximum(np.minimum(src_ids, tgt_ids), 1)
    return too_long, ~too_long & (ratio > max_ratio)


def length_order(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """Positions sorted by source then target length (stable: deterministic)."""
    return np.lexsort((tgt_lengths, src_lengths))


def bucketed_order(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, chunk: int, rng: np.random.Generator
) -> np.ndarray:
    """A random permutation, sorted by length within consecutive chunks of `chunk` positions:
    batches cut from it hold similar lengths (little padding) yet random pairs."""
    order = rng.permutation(len(src_lengths))
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        order[start : start + chunk] = part[length_order(src_lengths[part], tgt_lengths[part])]
    return order


def token_batches(
    order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int
) -> list[np.ndarray]:
    """Consecutive runs of `order` holding at most max_tokens padded tokens, B * (S + T); a
    pair longer than max_tokens by itself gets a batch of its own."""
    batches: list[np.ndarray] = []
    current: list[int] = []
    longest_src = longest_tgt = 0
    for i, s, t in zip(
        order.tolist(), src_lengths[order].tolist(), tgt_lengths[order].tolist(), strict=True
    ):
        new_src, new_tgt = max(longest_src, s), max(longest_tgt, t)
        if current and (len(current) + 1) * (new_src + new_tgt) > max_tokens:
            batches.append(np.asarray(current))
            current, new_src, new_tgt = [], s, t
        current.append(i)
        longest_src, longest_tgt = new_src, new_tgt
    if current:
        batches.append(np.asarray(current))
    return batches


def padding_fraction(
    batches: list[np.ndarray], src_lengths: np.ndarray, tgt_lengths: np.ndarray
) -> float:
    """The share of padding among the tokens of the padded batches."""
    real = padded = 0
    for batch in batches:
        src, tgt = src_lengths[batch], tgt_lengths[batch]
        real += int(src.sum() + tgt.sum())
        padded += len(batch) * int(src.max() + tgt.max())
    return 1 - real / padded if padded else 0.0


def split_evenly(batches: list[np.ndarray], parts: int) -> list[np.ndarray]:
    """The batches, with the largest halved until their number is a multiple of `parts`."""
    batches = list(batches)
    while len(batches) % parts:
        largest = max(range(len(batches)), key=lambda b: len(batches[b]))
        if len(batches[largest]) < 2:
            raise ConfigError(
                f"{len(batches)} batches of one pair each cannot be shared evenly by {parts} "
                "ranks: raise task.data.max_tokens or use fewer devices"
            )
        half = len(batches[largest]) // 2
        batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
    return batches


class TokenBatchSampler(ResumableSampler):
    """Deals fixed batches (arrays of dataset positions) to one rank, in a new order every epoch
    when shuffling. Being a DistributedSampler keeps Lightning from wrapping it; the dealing is
    DistributedSampler's own (a seed + epoch permutation, then every num_replicas-th batch
    from `rank`), with no padding since split_evenly makes the count divide."""

    def __init__(
        self,
        batches: list[np.ndarray],
        shuffle: bool,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        self.batches = split_evenly(batches, num_replicas)
        super().__init__(
            self.batches,  # type: ignore[arg-type]  (only its length is used)
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
        )

    def __iter__(self) -> Iterator[list[int]]:
        return (self.batches[i].tolist() for i in super().__iter__())


class PairDataset(Dataset):
    """The pairs at `rows` of a split. An item is a whole batch: a list of positions (what
    TokenBatchSampler yields) -> their examples, so DataLoader runs with batch_size=None.
    With `cut`, sequences longer than `cut` tokens (specials included) are cut to it: their
    start kept, or for sources with `keep_end`, their end (a dialogue's latest turns)."""

    def __init__(
        self, data: SplitData, rows: np.ndarray, cut: int | None = None, keep_end: bool = False
    ) -> None:
        self.data, self.rows, self.cut, self.keep_end = data, rows, cut, keep_end

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, positions: list[int]) -> list[EncodedPair]:
        examples = [self.data.example(int(self.rows[p])) for p in positions]
        if self.cut is None:
            return examples
        src_ids, tgt_ids = self.cut - 1, self.cut - 2  # room for EOS; for BOS and EOS
        return [
            e._replace(
                src=e.src[-src_ids:] if self.keep_end else e.src[:src_ids], tgt=e.tgt[:tgt_ids]
            )
            for e in examples
        ]

    def src_lengths(self) -> np.ndarray:
        return np.minimum(self.data.src_lengths()[self.rows], self.cut or np.iinfo(np.int64).max)

    def tgt_lengths(self) -> np.ndarray:
        return np.minimum(self.data.tgt_lengths()[self.rows], self.cut or np.iinfo(np.int64).max)


def collate(examples: list[EncodedPair]) -> PairBatch:
    """The pairs' batch: ids with their specials, PAD_ID-padded."""
    src = torch.full((len(examples), max(len(e.src) for e in examples) + 1), PAD_ID)
    tgt = torch.full((len(examples), max(len(e.tgt) for e in examples) + 2), PAD_ID)
    for row, example in enumerate(examples):
        n, m = len(example.src), len(example.tgt)
        src[row, :n] = torch.from_numpy(example.src.astype(np.int64))
        src[row, n] = EOS_ID
        tgt[row, 0] = BOS_ID
        tgt[row, 1 : m + 1] = torch.from_numpy(example.tgt.astype(np.int64))
        tgt[row, m + 1] = EOS_ID
    return {
        "src": src,
        "tgt": tgt,
        "ref": [e.ref for e in examples],
        "index": torch.tensor([e.index for e in examples]),
    }
