"""T5 relative attention bias: the bucket tables of the design notes (§6), one table shared by
every layer, and the fused SDPA path computing softmax(q·k/√d_h + b[bucket(j − i)]) v."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, make_parts

from attnlab.attention.core import Compute, attend
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import attention_mask
from attnlab.pe.t5 import relative_position_bucket

CAUSAL = replace(SHAPE, causal=True)

# Design notes §6, bidirectional, 32 buckets, max_distance 128: (first |d|, last |d|, bucket
# for past keys d = j − i < 0); future keys d > 0 take bucket + 16.
BIDIRECTIONAL_TABLE = [
    *((n, n, n) for n in range(1, 8)),
    (8, 11, 8),
    (12, 15, 9),
    (16, 22, 10),
    (23, 31, 11),
    (32, 45, 12),
    (46, 63, 13),
    (64, 90, 14),
    (91, 400, 15),
]
# Causal, 32 buckets, max 128, n = i − j ≥ 0: (first n, last n, bucket).
CAUSAL_TABLE = [
    *((n, n, n) for n in range(16)),
    (16, 18, 16),
    (19, 20, 17),
    (21, 23, 18),
    (24, 26, 19),
    (27, 30, 20),
    (31, 34, 21),
    (35, 39, 22),
    (40, 45, 23),
    (46, 51, 24),
    (52, 58, 25),
    (59, 66, 26),
    (67, 76, 27),
    (77, 86, 28),
    (87, 98, 29),
    (99, 112, 30),
    (113, 400, 31),
]


def expected_buckets(table: list[tuple[int, int, int]]) -> dict[int, int]:
    return {n: bucket for first, last, bucket in table for n in range(first, last + 1)}


def bias_buckets(pe, rel: torch.Tensor) -> torch.Tensor:
    """The bucket the module uses for each distance, read back from a table of bucket ids."""
    with torch.no_grad():
        pe.table.copy_(torch.arange(pe.num_buckets)[:, None].expand_as(pe.table))
    q_pos = torch.zeros(1, dtype=torch.long)
    return pe.score_bias(None, None, q_pos, rel, 0)[0, :, 0].long()


def test_bidirectional_buckets_match_the_table_of_the_design_notes():
    pe = make_parts("t5").pe
    rel = torch.arange(-400, 401)
    buckets = bias_buckets(pe, rel)
    assert torch.equal(buckets[1], buckets[0]), "every head uses the same buckets"
    got = dict(zip(rel.tolist(), buckets[0].tolist(), strict=True))
    assert got[0] == 0
    for n, bucket in expected_buckets(BIDIRECTIONAL_TABLE).items():
        assert (got[-n], got[n]) == (bucket, bucket + 16), f"d = ±{n}"


def test_causal_buckets_match_the_table_of_the_design_notes():
    pe = make_parts("t5", shape=CAUSAL).pe
    rel = torch.arange(-400, 401)
    got = dict(zip(rel.tolist(), bias_buckets(pe, rel)[0].tolist(), strict=True))
    for n, bucket in expected_buckets(CAUSAL_TABLE).items():
        assert got[-n] == bucket, f"n = i − j = {n}"
    assert all(got[d] == 0 for d in range(1, 401)), "future keys share bucket 0"


def test_spot_checks_and_bucket_16_never_used_bidirectionally():
    bucket = lambda d, bi: relative_position_bucket(torch.tensor(d), bi, 32, 128).item()  # noqa: E731
    assert (bucket(-128, True), bucket(128, True), bucket(-500, True)) == (15, 31, 15)
    assert bucket(-128, False) == 31
    used = relative_position_bucket(torch.arange(-5000, 5001), True, 32, 128).unique()
    assert used.tolist() == [b for b in range(32) if b != 16]


def test_every_layer_gets_the_same_bias_from_one_table():
    pe = make_parts("t5", shape=replace(SHAPE, n_layers=4)).pe
    assert [p.shape for p in pe.parameters()] == [torch.Size([32, SHAPE.n_heads])]
    q_pos, k_pos = torch.arange(3, 9), torch.arange(11)
    biases = [pe.score_bias(None, None, q_pos, k_pos, layer) for layer in range(4)]
    assert biases[0].shape == (1, SHAPE.n_heads, 6, 11)
    assert all(torch.equal(b, biases[0]) for b in biases[1:])


def test_cached_decoding_sees_the_last_row_of_the_full_bias():
    pe = make_parts("t5", shape=CAUSAL).pe
    pos = torch.arange(40)
    full = pe.score_bias(None, None, pos, pos, 0)
    step = pe.score_bias(None, None, pos[-1:], pos, 0)
    assert torch.equal(step, full[..., -1:, :])


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_path_is_the_definition_and_gradients_reach_the_table(causal):
    torch.manual_seed(0)
    shape = replace(SHAPE, causal=causal)
    parts = make_parts("t5", shape=shape).double()
    assert parts.fast()
    b, h, length, d = 2, shape.n_heads, 20, shape.head_dim
    q, k, v = (torch.randn(b, h, length, d, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(length)
    mask = attention_mask(pos, pos, None, causal)
    x = torch.zeros(b, length, shape.d_model, dtype=torch.float64)
    out = attend(parts, 1, x, q, k, v, pos, pos, mask, Compute(fast=True))
    (grad,) = torch.autograd.grad(out.square().sum(), parts.pe.table)

    table = parts.pe.table.detach().clone().requires_grad_()
    buckets = relative_position_bucket(pos[None, :] - pos[:, None], not causal, 32, 128)
    scores = q @ k.transpose(-2, -1) / d**0.5 + table[buckets].permute(2, 0, 1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, -1) @ v
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), table)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert grad.abs().sum() > 0


def test_table_init_has_std_d_model_to_the_minus_half():
    torch.manual_seed(0)
    pe = make_parts("t5", shape=replace(SHAPE, d_model=400, n_heads=64)).pe
    assert pe.table.std().item() == pytest.approx(400**-0.5, rel=0.1)


@pytest.mark.parametrize(
    "overrides,causal,message",
    [
        (["num_buckets=31"], False, "must be even"),
        (["num_buckets=2"], False, "too small"),
        (["num_buckets=1"], True, "too small"),
        (["max_distance=8"], False, "must exceed 8"),
    ],
)
def test_bad_options_are_refused(overrides, causal, message):
    with pytest.raises(ConfigError, match=message):
        make_parts(variant("pe", "t5", *overrides), shape=replace(SHAPE, causal=causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (64, 1000)])
def test_far_is_where_every_longer_distance_shares_the_last_bucket(
    causal, num_buckets, max_distance
):
    shape = replace(SHAPE, causal=causal)
    overrides = (f"num_buckets={num_buckets}", f"max_distance={max_distance}")
    pe = make_parts(variant("pe", "t5", *overrides), shape=shape).pe
    distances = torch.arange(4 * max_distance)
    past, future = pe.bucket(-distances), pe.bucket(distances)
    far = pe.far
    assert (past[far:] == past[-1]).all() and past[far - 1] != past[-1]
    if not causal:
        assert (future[far:] == future[-1]).all() and future[far - 1] != future[-1]
