"""Shaw et al. relative position representations: the efficient gather/scatter form equals the
materialized formula e_ij = q_i·(k_j + a^K_ij)/√d_h, o_i = Σ_j α_ij (v_j + a^V_ij) (§4)."""

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

LENGTH = 9


@cache
def shaw(max_rel: int = 20, value_term: bool = True) -> AttentionParts:
    """Shaw from its YAML (K = 20 and the value term by default); Shaw ignores shape.causal."""
    torch.manual_seed(0)
    overrides = [f"max_relative_position={max_rel}", f"value_term={value_term}"]
    return make_parts(variant("pe", "shaw", *overrides)).double()


def random_qkv(length: int = LENGTH, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(2, SHAPE.n_heads, length, d, generator=g, dtype=torch.float64)
        for d in (SHAPE.head_dim, SHAPE.head_dim, SHAPE.value_dim)
    )


def run(parts, q, k, v, q_pos, k_pos, causal=False, layer=1, fast=True):
    x = torch.zeros(q.shape[0], q.shape[2], SHAPE.d_model, dtype=torch.float64)
    mask = attention_mask(q_pos, k_pos, None, causal)
    return attend(parts, layer, x, q, k, v, q_pos, k_pos, mask, Compute(fast=fast))


def naive(q, k, v, w_k, w_v, q_pos, k_pos, max_rel, mask):
    """The paper's formula with the [Lq, Lk, d] embeddings a^K, a^V materialized."""
    index = (k_pos[None, :] - q_pos[:, None]).clamp(-max_rel, max_rel) + max_rel
    a_k = w_k[index]
    scores = (q[..., :, None, :] * (k[..., None, :, :] + a_k)).sum(-1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, -1)
    values = v[..., None, :, :] + (0 if w_v is None else w_v[index])
    return scores, (weights[..., None] * values).sum(-2)


@pytest.mark.parametrize("max_rel", [2, 20])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cached", [False, True], ids=["full", "one-query"])
@pytest.mark.parametrize("value_term", [True, False])
def test_efficient_form_equals_the_materialized_formula(max_rel, causal, cached, value_term):
    parts = shaw(max_rel, value_term)
    pe, layer = parts.pe, 1
    q, k, v = random_qkv()
    k_pos = torch.arange(LENGTH)
    q_pos = k_pos[-1:] if cached else k_pos
    q = q[..., -q_pos.shape[0] :, :]
    mask = attention_mask(q_pos, k_pos, None, causal)
    w_v = pe.w_v[layer] if value_term else None
    scores, expected = naive(q, k, v, pe.w_k[layer], w_v, q_pos, k_pos, max_rel, mask)
    ours = q @ k.transpose(-2, -1) / SHAPE.head_dim**0.5 + pe.score_bias(q, k, q_pos, k_pos, layer)
    if mask is not None:
        ours = ours.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(ours, scores)
    for fast in (True, False):
        torch.testing.assert_close(run(parts, q, k, v, q_pos, k_pos, causal, layer, fast), expected)


def test_distances_beyond_k_share_the_edge_embeddings():
    max_rel = 2
    pe = shaw(max_rel).pe
    q, k, _ = random_qkv()
    pos = torch.arange(LENGTH)
    bias = pe.score_bias(q, k, pos, pos, 0)
    edges = q @ pe.w_k[0][[0, -1]].t() / SHAPE.head_dim**0.5  # [B, H, L, 2]: j − i = −K, +K
    rel = pos[None, :] - pos[:, None]
    for i, j in zip(*torch.nonzero(rel.abs() >= max_rel).unbind(1), strict=True):
        torch.testing.assert_close(bias[..., i, j], edges[..., i, int(rel[i, j] > 0)])
    weights = torch.softmax(torch.randn(2, SHAPE.n_heads, LENGTH, LENGTH, dtype=torch.float64), -1)
    value_term = pe.value_term(weights, pos, pos, 0)
    far_past = (weights * (rel <= -max_rel)).sum(-1, keepdim=True)
    far_future = (weights * (rel >= max_rel)).sum(-1, keepdim=True)
    inner = weights * (rel.abs() < max_rel)
    rows = (rel.clamp(-max_rel, max_rel) + max_rel).expand_as(inner)
    expected = far_past * pe.w_v[0][0] + far_future * pe.w_v[0][-1]
    expected = expected + (inner[..., None] * pe.w_v[0][rows]).sum(-2)
    torch.testing.assert_close(value_term, expected)


@pytest.mark.parametrize("value_term", [True, False])
def test_zero_tables_with_k_at_least_l_minus_1_give_vanilla_attention(value_term):
    parts = make_parts(
        variant("pe", "shaw", f"max_relative_position={LENGTH - 1}", f"value_term={value_term}")
    ).double()
    with torch.no_grad():
        for table in parts.pe.parameters():
            table.zero_()
    vanilla = make_parts("none").double()
    q, k, v = random_qkv()
    pos = torch.arange(LENGTH)
    for causal in (False, True):
        expected = run(vanilla, q, k, v, pos, pos, causal)
        torch.testing.assert_close(run(parts, q, k, v, pos, pos, causal), expected)


@settings(max_examples=10, deadline=None)
@given(shift=st.integers(1, 10_000), value_term=st.booleans())
def test_shifting_all_positions_changes_nothing(shift, value_term):
    parts = shaw(2, value_term)
    q, k, v = random_qkv()
    pos = torch.arange(LENGTH)
    expected = run(parts, q, k, v, pos, pos, causal=True)
    torch.testing.assert_close(run(parts, q, k, v, pos + shift, pos + shift, True), expected)


def test_the_value_term_solves_the_probe_and_key_only_shaw_does_not():
    """Identical tokens: o_i = v + Σ_j α_ij a^V_ij varies with i; without a^V, o_i = v."""
    q, k, v = (t[..., :1, :].expand_as(t) for t in random_qkv())
    pos = torch.arange(LENGTH)
    for causal in (False, True):
        with_values = run(shaw(), q, k, v, pos, pos, causal)
        key_only = run(shaw(value_term=False), q, k, v, pos, pos, causal)
        spread = lambda out: (out - out[..., :1, :]).abs().amax().item()  # noqa: E731
        assert spread(with_values) > 1e-3
        assert spread(key_only) < 1e-12


def test_only_the_value_term_leaves_the_fused_path():
    assert not shaw().fast()
    assert shaw(value_term=False).fast()
    pos = torch.arange(2)
    assert shaw(value_term=False).pe.value_term(torch.ones(1, 1, 2, 2), pos, pos, 0) is None


def test_tables_are_per_layer_and_shared_across_heads():
    pe = make_parts("shaw", shape=replace(SHAPE, n_layers=3)).pe
    assert pe.max_relative_position == 20
    assert [t.shape for t in pe.w_k] == [torch.Size([41, SHAPE.head_dim])] * 3
    assert [t.shape for t in pe.w_v] == [torch.Size([41, SHAPE.value_dim])] * 3
    assert not torch.equal(pe.w_k[0], pe.w_k[1])
    bound = (6 / (41 + SHAPE.head_dim)) ** 0.5  # Glorot uniform (T2T uniform_unit_scaling)
    assert all(t.abs().max() <= bound for t in pe.w_k)


def test_a_non_positive_k_is_refused():
    with pytest.raises(ConfigError, match="max_relative_position=0 must be at least 1"):
        make_parts(variant("pe", "shaw", "max_relative_position=0"))
