"""ALiBi against its definition: the slope tables of design notes §10, the bias −m_h·|i − j|,
extrapolation without parameters, and why fairseq's +m_h·j shortcut is not used."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.core import Compute, attend
from attnlab.model.transformer import attention_mask
from attnlab.pe.alibi import alibi_slopes

CAUSAL = replace(SHAPE, causal=True)

SLOPE_EXPONENTS = {  # design notes §10: slopes as powers of two, in head order
    8: [-1, -2, -3, -4, -5, -6, -7, -8],
    6: [-2, -4, -6, -8, -1, -3],
    12: [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5],
    16: [-0.5 * h for h in range(1, 17)],
}


@pytest.mark.parametrize("n_heads", sorted(SLOPE_EXPONENTS))
def test_slopes_match_the_official_tables(n_heads):
    expected = [2.0**e for e in SLOPE_EXPONENTS[n_heads]]
    assert alibi_slopes(n_heads) == expected
    parts = make_parts("alibi", shape=replace(SHAPE, n_heads=n_heads, d_model=8 * n_heads))
    assert parts.pe.slopes.tolist() == pytest.approx(expected, rel=1e-7)


@given(st.integers(1, 200))
def test_every_head_count_gets_distinct_slopes_in_0_1(n_heads):
    slopes = alibi_slopes(n_heads)
    assert len(slopes) == n_heads == len(set(slopes))
    assert all(0 < m < 1 for m in slopes)


@pytest.fixture(scope="module")
def causal_alibi():
    return make_parts("alibi", shape=CAUSAL).double()


def reference_bias(slopes: list[float], q_pos: list[int], k_pos: list[int]) -> torch.Tensor:
    """[1, H, Lq, Lk] = −m_h·|i − j|, entry by entry."""
    rows = [[[-m * abs(i - j) for j in k_pos] for i in q_pos] for m in slopes]
    return torch.tensor(rows, dtype=torch.float64)[None]


@settings(max_examples=30, deadline=None)
@given(offset=st.integers(0, 300), n_queries=st.integers(1, 6), n_cached=st.integers(0, 6))
def test_the_bias_is_minus_slope_times_distance_for_any_positions(
    causal_alibi, offset, n_queries, n_cached
):
    pe = causal_alibi.pe
    k_pos = list(range(offset, offset + n_cached + n_queries))
    q_pos = k_pos[n_cached:]  # cached decoding: the queries are the last keys
    bias = pe.score_bias(None, None, torch.tensor(q_pos), torch.tensor(k_pos), layer=1)
    expected = reference_bias(alibi_slopes(SHAPE.n_heads), q_pos, k_pos)
    torch.testing.assert_close(bias, expected, rtol=0, atol=0)
    past = torch.tensor(k_pos)[None, :] <= torch.tensor(q_pos)[:, None]
    i_minus_j = torch.tensor(q_pos)[:, None] - torch.tensor(k_pos)[None, :]
    paper = -pe.slopes[:, None, None] * i_minus_j  # the paper's causal −m_h·(i − j)
    assert torch.equal(bias[0][:, past], paper[:, past])


def qkv(length: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """x (unused by dot-product attention), q, k, v in float64."""
    g = torch.Generator().manual_seed(seed)
    shape = (2, SHAPE.n_heads, length, SHAPE.head_dim)
    x = torch.zeros(2, length, SHAPE.d_model, dtype=torch.float64)
    return x, *(torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3))


def scores_with(bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / SHAPE.head_dim**0.5 + bias


@pytest.mark.parametrize("norm", ["softmax", "relu2"])
@pytest.mark.parametrize("fast", [True, False])
def test_attention_output_is_the_textbook_formula(norm, fast):
    parts = make_parts("alibi", norm, shape=CAUSAL).double()
    x, q, k, v = qkv(9)
    pos = torch.arange(9)
    mask = attention_mask(pos, pos, None, causal=True)
    out = attend(parts, 0, x, q, k, v, pos, pos, mask, Compute(fast=fast))
    bias = reference_bias(alibi_slopes(SHAPE.n_heads), pos.tolist(), pos.tolist())
    torch.testing.assert_close(out, parts.norm(scores_with(bias, q, k), mask, 0) @ v)


def test_longer_sequences_than_seen_need_no_new_parameters(causal_alibi):
    parts = causal_alibi
    assert parts.pe.max_len is None
    assert list(parts.parameters()) == [] and parts.state_dict() == {}
    x, q, k, v = qkv(1024)
    pos = torch.arange(1024)
    long = attend(parts, 0, x, q, k, v, pos, pos, attention_mask(pos, pos, None, causal=True))
    short_pos = pos[:16]
    short_mask = attention_mask(short_pos, short_pos, None, causal=True)
    short = attend(
        parts, 0, x[:, :16], *(t[:, :, :16] for t in (q, k, v)), short_pos, short_pos, short_mask
    )
    # causal: the first 16 positions of the long sequence see exactly what the short one saw
    torch.testing.assert_close(long[:, :, :16], short)
    assert torch.isfinite(long).all()
    far = parts.pe.score_bias(None, None, torch.tensor([1000]), torch.tensor([0]), 0)
    assert torch.equal(far.flatten(), -1000 * parts.pe.slopes)


@pytest.mark.parametrize("norm,trick_is_exact", [("softmax", True), ("relu2", False)])
def test_the_fairseq_shortcut_holds_only_for_shift_invariant_normalizers(norm, trick_is_exact):
    """fairseq adds +m_h·j; it differs from −m_h·(i − j) by m_h·i, constant along a row."""
    parts = make_parts("alibi", norm, shape=CAUSAL).double()
    _, q, k, _ = qkv(10, seed=1)
    pos = torch.arange(10)
    mask = attention_mask(pos, pos, None, causal=True)
    true_bias = parts.pe.score_bias(q, k, pos, pos, 0)
    shortcut = (parts.pe.slopes[:, None, None] * pos.double())[None].expand_as(true_bias)
    weights = parts.norm(scores_with(true_bias, q, k), mask, 0)
    shortcut_weights = parts.norm(scores_with(shortcut, q, k), mask, 0)
    assert torch.allclose(weights, shortcut_weights) == trick_is_exact
