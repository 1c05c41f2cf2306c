"""Transformer-XL / XLNet relative attention: the rel-shift gives the same matrix as indexing
R by i − j directly, and the scores are [(q_i + u)·k_j + (q_i + v)·W_R R_{i−j}]/√d_h (§5)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
import torch
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.core import AttentionParts, Compute, attend
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import attention_mask
from attnlab.pe.xl import distances, rel_shift_bidirectional, rel_shift_causal

# (queries, keys before them, keys after them): a full sequence, a block after a memory, one
# decoding step, and a block of queries in the middle (chunked bidirectional attention)
GEOMETRIES = [(7, 0, 0), (4, 3, 0), (1, 6, 0), (3, 2, 4)]


@cache
def xl(causal: bool, clamp_len: int | None = None) -> AttentionParts:
    torch.manual_seed(0)
    node = variant("pe", "xl", f"clamp_len={'null' if clamp_len is None else clamp_len}")
    return make_parts(node, shape=replace(SHAPE, causal=causal)).double()


def random_qkv(q_len: int, k_len: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    h, d, dv = SHAPE.n_heads, SHAPE.head_dim, SHAPE.value_dim
    make = lambda length, width: torch.randn(2, h, length, width, generator=g, dtype=torch.float64)  # noqa: E731
    return make(q_len, d), make(k_len, d), make(k_len, dv)


def positions(q_len: int, memory: int, after: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    k_pos = torch.arange(memory + q_len + after)
    return k_pos[memory : memory + q_len], k_pos


def run(parts, q, k, v, q_pos, k_pos, causal, fast=True):
    x = torch.zeros(q.shape[0], q.shape[2], SHAPE.d_model, dtype=torch.float64)
    mask = attention_mask(q_pos, k_pos, None, causal)
    return attend(parts, 1, x, q, k, v, q_pos, k_pos, mask, Compute(fast=fast))


def sinusoid_r(t: torch.Tensor, dim: int) -> torch.Tensor:
    """R_t = [sin(t ω) | cos(t ω)], ω_k = 10000^(−2k/dim), for any shape of t."""
    omega = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = t.to(torch.float64)[..., None] * omega
    return torch.cat((angles.sin(), angles.cos()), -1)


def direct_scores(parts, q, k, q_pos, k_pos, layer, clamp_len=None):
    """The paper's scores with W_R R_{i−j} materialized for every (i, j)."""
    pe, h, d = parts.pe, SHAPE.n_heads, SHAPE.head_dim
    t = q_pos[:, None] - k_pos[None, :]
    if clamp_len is not None:
        t = t.clamp(-clamp_len, clamp_len)
    r = pe.w_r[layer](sinusoid_r(t, SHAPE.d_model))  # [Lq, Lk, H·d_h]
    r = r.view(*t.shape, h, d).permute(2, 0, 1, 3)  # [H, Lq, Lk, d_h]
    content = (q + pe.u[:, None]) @ k.transpose(-2, -1)
    position = ((q + pe.v[:, None])[..., :, None, :] * r).sum(-1)
    return (content + position) / d**0.5


@settings(max_examples=40, deadline=None)
@given(
    q_len=st.integers(1, 6),
    memory=st.integers(0, 6),
    after=st.integers(0, 4),
    causal=st.booleans(),
)
def test_rel_shift_equals_a_brute_force_gather(q_len, memory, after, causal):
    q_pos, k_pos = positions(q_len, memory, after)
    k_len = k_pos.shape[0]
    t = distances(q_pos, k_len, causal)
    raw = torch.randn(3, q_len, t.shape[0], dtype=torch.float64)
    shifted = rel_shift_causal(raw) if causal else rel_shift_bidirectional(raw)
    assert shifted.shape == (3, q_len, k_len)
    for i in range(q_len):
        for j in range(int(q_pos[i]) + 1 if causal else k_len):
            (column,) = torch.nonzero(t == q_pos[i] - j).flatten().tolist()
            assert torch.equal(shifted[:, i, j], raw[:, i, column]), (i, j)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_len,memory,after", GEOMETRIES)
@pytest.mark.parametrize("clamp_len", [None, 2])
def test_scores_and_outputs_follow_the_formula(causal, q_len, memory, after, clamp_len):
    parts = xl(causal, clamp_len)
    q_pos, k_pos = positions(q_len, memory, after)
    q, k, v = random_qkv(q_len, k_pos.shape[0])
    expected = direct_scores(parts, q, k, q_pos, k_pos, 1, clamp_len)
    scores = q @ k.transpose(-2, -1) / SHAPE.head_dim**0.5
    scores = scores + parts.pe.score_bias(q, k, q_pos, k_pos, 1)
    mask = attention_mask(q_pos, k_pos, None, causal)
    if mask is not None:  # TXL's shifted matrix is defined for j ≤ i only
        expected = expected.masked_fill(~mask, float("-inf"))
        scores = scores.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(scores, expected)
    for fast in (True, False):
        out = run(parts, q, k, v, q_pos, k_pos, causal, fast)
        torch.testing.assert_close(out, torch.softmax(expected, -1) @ v)


def test_the_position_term_is_per_layer_and_the_biases_are_shared():
    pe = make_parts("xl", shape=replace(SHAPE, n_layers=3)).pe
    assert len(pe.w_r) == 3 and not torch.equal(pe.w_r[0].weight, pe.w_r[1].weight)
    assert pe.w_r[0].weight.shape == (SHAPE.n_heads * SHAPE.head_dim, SHAPE.d_model)
    assert pe.w_r[0].bias is None
    assert pe.u.shape == pe.v.shape == (SHAPE.n_heads, SHAPE.head_dim)
    n_params = sum(p.numel() for p in pe.parameters())
    assert n_params == 3 * pe.w_r[0].weight.numel() + 2 * pe.u.numel()


@pytest.mark.parametrize("causal", [False, True])
def test_zero_w_r_and_u_give_vanilla_attention(causal):
    parts = make_parts("xl", shape=replace(SHAPE, causal=causal)).double()
    with torch.no_grad():
        for w_r in parts.pe.w_r:
            w_r.weight.zero_()
        parts.pe.u.zero_()
    vanilla = make_parts("none").double()
    q_pos, k_pos = positions(5, 3)
    q, k, v = random_qkv(5, 8)
    expected = run(vanilla, q, k, v, q_pos, k_pos, causal)
    torch.testing.assert_close(run(parts, q, k, v, q_pos, k_pos, causal), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_identical_tokens_give_identical_outputs(causal):
    """Softmax rows sum to 1 and all v_j are equal, so o_i = v at every position (§13)."""
    q_pos, k_pos = positions(8, 0)
    q, k, v = (t[..., :1, :].expand_as(t) for t in random_qkv(8, 8))
    parts = xl(causal)
    first_key = parts.pe.score_bias(q, k, q_pos, k_pos, 1)[..., 0]  # visible to every query
    assert first_key.std(-1).amin() > 1e-3, "the scores do depend on the query position"
    out = run(parts, q, k, v, q_pos, k_pos, causal)
    torch.testing.assert_close(out, v[..., :1, :].expand_as(out))


def test_cross_attention_is_refused_with_the_fix():
    with pytest.raises(
        ConfigError, match=r"pe=xl supports self-attention only.*model.cross_pe=false"
    ):
        make_parts("xl", shape=replace(SHAPE, cross=True))


def test_a_non_positive_clamp_len_is_refused():
    with pytest.raises(ConfigError, match="clamp_len=0 must be at least 1"):
        make_parts(variant("pe", "xl", "clamp_len=0"))
