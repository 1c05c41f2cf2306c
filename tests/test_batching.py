"""Token batching (data/batching.py): the budget, bucketing, the sampler across epochs and
ranks, and the batch contract of collate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from attnlab.data.batching import (
    TokenBatchSampler,
    bucketed_order,
    collate,
    padding_fraction,
    token_batches,
)
from attnlab.data.cache import EncodedPair
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def random_lengths(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(2, 60, count)
    return src, np.clip(src + rng.integers(-5, 15, count), 3, None)


def batch_cost(batch: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> int:
    return len(batch) * int(src[batch].max() + tgt[batch].max())


def test_token_batches_stay_within_budget_and_cover_each_pair_once():
    src, tgt = random_lengths(3000)
    rng = np.random.default_rng(1)
    for order in (bucketed_order(src, tgt, 500, rng), rng.permutation(3000)):
        batches = token_batches(order, src, tgt, max_tokens=300)
        assert max(batch_cost(b, src, tgt) for b in batches) <= 300
        assert sorted(np.concatenate(batches).tolist()) == list(range(3000))


def test_a_pair_over_the_budget_gets_a_batch_of_its_own():
    src, tgt = np.array([5, 400, 6, 7]), np.array([5, 400, 6, 7])
    batches = token_batches(np.arange(4), src, tgt, max_tokens=100)
    assert [b.tolist() for b in batches] == [[0], [1], [2, 3]]


def test_length_bucketing_pads_less_than_random_batching():
    src, tgt = random_lengths(5000)
    rng = np.random.default_rng(2)
    bucketed = token_batches(bucketed_order(src, tgt, 1000, rng), src, tgt, 1000)
    shuffled = token_batches(rng.permutation(5000), src, tgt, 1000)
    assert padding_fraction(bucketed, src, tgt) < 0.5 * padding_fraction(shuffled, src, tgt)


def test_the_sampler_visits_each_batch_once_per_epoch_in_a_new_order():
    src, tgt = random_lengths(1000)
    batches = token_batches(bucketed_order(src, tgt, 200, np.random.default_rng(0)), src, tgt, 400)
    sampler = TokenBatchSampler(batches, shuffle=True, seed=3)
    assert isinstance(sampler, DistributedSampler), "so that Lightning does not replace it"
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
        assert len(epochs[-1]) == len(sampler) == len(batches)
        assert sorted(i for batch in epochs[-1] for i in batch) == list(range(1000))
    assert epochs[0] != epochs[1]
    fixed = TokenBatchSampler(batches, shuffle=False)
    assert list(fixed) == [b.tolist() for b in batches]


@pytest.mark.parametrize("world", [2, 3, 7])
def test_ranks_get_equal_numbers_of_batches_and_each_pair_exactly_once(world):
    src, tgt = random_lengths(500)
    batches = token_batches(bucketed_order(src, tgt, 100, np.random.default_rng(0)), src, tgt, 500)
    shares = [list(TokenBatchSampler(batches, True, 0, world, rank)) for rank in range(world)]
    assert len({len(share) for share in shares}) == 1
    assert sorted(i for share in shares for batch in share for i in batch) == list(range(500))


def test_collate_follows_the_batch_contract():
    examples = [
        EncodedPair(np.array([7, 8, 9], np.uint16), np.array([10], np.uint16), "zehn", 4),
        EncodedPair(np.array([5], np.uint16), np.array([11, 12, 13, 14], np.uint16), "elf", 0),
    ]
    batch = collate(examples)
    assert batch["src"].tolist() == [[7, 8, 9, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]]
    assert batch["tgt"].tolist() == [
        [BOS_ID, 10, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
        [BOS_ID, 11, 12, 13, 14, EOS_ID],
    ]
    assert batch["src"].dtype == batch["tgt"].dtype == batch["index"].dtype == torch.long
    assert batch["ref"] == ["zehn", "elf"] and batch["index"].tolist() == [4, 0]
