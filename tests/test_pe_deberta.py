"""DeBERTa against its definition: the log buckets of design notes §7, the code's p2c index
δ(i,j), the disentangled score formula entry by entry, and the content-only limit."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.core import Compute, attend
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import attention_mask
from attnlab.pe.deberta import log_bucket

LOG_BUCKETS = {  # design notes §7, position_buckets 256, max_relative_positions 512
    **{r: r for r in (0, 1, 64, 127, 128, -1, -128)},
    129: 129,
    130: 130,
    150: 143,
    200: 169,
    255: 192,
    256: 192,
    300: 207,
    400: 233,
    511: 255,
    -511: -255,
    -150: -143,
}


def reference_bucket(rel: int, buckets: int, max_position: int) -> int:
    mid = buckets // 2
    if abs(rel) <= mid:
        return rel
    log_pos = math.ceil(math.log(abs(rel) / mid) / math.log((max_position - 1) / mid) * (mid - 1))
    return int(math.copysign(mid + log_pos, rel))


@pytest.fixture(scope="module")
def default_pe():
    return make_parts("deberta").pe


def test_log_buckets_match_the_table(default_pe):
    rel = torch.tensor(list(LOG_BUCKETS))
    assert log_bucket(rel, 256, 512).tolist() == list(LOG_BUCKETS.values())
    # δ = bucket + k, k = 256; every distance from 511 on shares the last row
    for r, bucket in LOG_BUCKETS.items():
        assert (
            default_pe.relative_index(torch.tensor([r]), torch.tensor([0])).item() == bucket + 256
        )
    far = default_pe.relative_index(torch.tensor([511, 600, 5000]), torch.tensor([0]))
    assert far.flatten().tolist() == [511, 511, 511]


@given(
    rel=st.integers(-3000, 3000),
    sizes=st.sampled_from(
        [(b, m) for b in (4, 8, 64, 256) for m in (16, 128, 512) if b // 2 + 1 < m]
    ),
)
def test_log_buckets_are_the_official_formula_odd_and_monotone(rel, sizes):
    buckets, max_position = sizes
    got = log_bucket(torch.tensor([rel - 1, rel, -rel]), buckets, max_position).tolist()
    assert got[1] == reference_bucket(rel, buckets, max_position)
    assert got[2] == -got[1]
    assert got[0] <= got[1]


def perturbed(*overrides: str, seed: int = 0):
    """DeBERTa parts in float64 with every parameter (LayerNorm and biases too) random."""
    torch.manual_seed(seed)
    parts = make_parts(variant("pe", "deberta", *overrides)).double()
    with torch.no_grad():
        for param in parts.pe.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    return parts


@pytest.fixture(scope="module")
def small_buckets():
    """k = 8 buckets, log-spaced up to 16: short sequences reach every regime of δ."""
    return perturbed("position_buckets=8", "max_relative_positions=16")


def qkv(n_queries: int, n_keys: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h, d = SHAPE.n_heads, SHAPE.head_dim
    make = lambda length: torch.randn(2, h, length, d, generator=g, dtype=torch.float64)  # noqa: E731
    x = torch.zeros(2, n_queries, SHAPE.d_model, dtype=torch.float64)
    return x, make(n_queries), make(n_keys), make(n_keys)


def position_rows(pe, proj: torch.nn.Linear) -> torch.Tensor:
    """K^r or Q^r [H, 2k, d_h] from the definition: LayerNorm(P) W + b, split into heads."""
    p = pe.rel_embeddings
    centered = p - p.mean(-1, keepdim=True)
    normed = centered / (centered.square().mean(-1, keepdim=True) + 1e-7) ** 0.5
    rows = (normed * pe.norm.weight + pe.norm.bias) @ proj.weight.T + proj.bias
    return rows.view(len(p), SHAPE.n_heads, -1).transpose(0, 1)


def reference_scores(pe, q, k, q_pos, k_pos, layer, delta) -> torch.Tensor:
    """[q_i·k_j + q_i·K^r_δ(i,j) + k_j·Q^r_δ(i,j)] / √(3 d_h), entry by entry."""
    key_rows = position_rows(pe, pe.pos_key_proj[layer])
    query_rows = position_rows(pe, pe.pos_query_proj[layer])
    scores = torch.empty(*q.shape[:3], k.shape[2], dtype=torch.float64)
    for i, qi in enumerate(q_pos.tolist()):
        for j, kj in enumerate(k_pos.tolist()):
            r = delta(qi, kj)
            scores[..., i, j] = (
                (q[..., i, :] * k[..., j, :]).sum(-1)
                + (q[..., i, :] * key_rows[:, r]).sum(-1)
                + (k[..., j, :] * query_rows[:, r]).sum(-1)
            )
    return scores / (3 * SHAPE.head_dim) ** 0.5


@settings(max_examples=8, deadline=None)
@given(
    offset=st.integers(0, 40),
    n_cached=st.integers(0, 12),
    n_queries=st.integers(1, 12),
    layer=st.integers(0, SHAPE.n_layers - 1),
)
def test_scores_are_the_disentangled_formula_with_log_buckets(
    small_buckets, offset, n_cached, n_queries, layer
):
    parts = small_buckets
    pe = parts.pe
    k_pos = torch.arange(offset, offset + n_cached + n_queries)
    q_pos = k_pos[n_cached:]
    x, q, k, v = qkv(len(q_pos), len(k_pos))

    def delta(i: int, j: int) -> int:
        return min(max(reference_bucket(i - j, 8, 16) + 8, 0), 15)

    expected = reference_scores(pe, q, k, q_pos, k_pos, layer, delta)
    scale = pe.scale(SHAPE.head_dim)
    scores = scale * q @ k.transpose(-2, -1) + pe.score_bias(q, k, q_pos, k_pos, layer)
    torch.testing.assert_close(scores, expected)
    mask = attention_mask(q_pos, k_pos, None, causal=True)
    out = attend(parts, layer, x, q, k, v, q_pos, k_pos, mask)
    weights = torch.softmax(
        expected.masked_fill(~mask, float("-inf")) if mask is not None else expected, -1
    )
    torch.testing.assert_close(out, weights @ v)


def test_p2c_uses_delta_i_j_as_the_official_code_not_delta_j_i_as_the_paper():
    parts = perturbed("position_buckets=0", "max_relative_positions=16", "pos_att_type=[p2c]")
    pe = parts.pe
    _, _, k, _ = qkv(6, 6)
    pos = torch.arange(6)
    query_rows = position_rows(pe, pe.pos_query_proj[1])
    bias = pe.score_bias(None, k, pos, pos, layer=1)
    code = torch.einsum("bhjd,hijd->bhij", k, query_rows[:, pos[:, None] - pos[None, :] + 16])
    paper = torch.einsum("bhjd,hijd->bhij", k, query_rows[:, pos[None, :] - pos[:, None] + 16])
    scale = (2 * SHAPE.head_dim) ** -0.5  # one position term: 1/√(2 d_h)
    torch.testing.assert_close(bias, scale * code)
    assert not torch.allclose(bias, scale * paper)


def test_c2p_only_reads_the_query_and_indexes_by_i_minus_j():
    parts = perturbed("position_buckets=0", "max_relative_positions=16", "pos_att_type=[c2p]")
    pe = parts.pe
    assert pe.needs_query and not pe.needs_key
    _, q, _, _ = qkv(5, 7)
    q_pos, k_pos = torch.arange(2, 7), torch.arange(7)
    key_rows = position_rows(pe, pe.pos_key_proj[0])
    rows = key_rows[:, q_pos[:, None] - k_pos[None, :] + 16]  # [H, Lq, Lk, d_h]
    expected = torch.einsum("bhid,hijd->bhij", q, rows) * (2 * SHAPE.head_dim) ** -0.5
    torch.testing.assert_close(pe.score_bias(q, None, q_pos, k_pos, layer=0), expected)


def test_zero_table_and_biases_give_content_only_attention_scaled_by_3_d_h():
    parts = make_parts("deberta").double()
    with torch.no_grad():
        parts.pe.rel_embeddings.zero_()
        for proj in (*parts.pe.pos_key_proj, *parts.pe.pos_query_proj):
            proj.bias.zero_()
    x, q, k, v = qkv(9, 9)
    pos = torch.arange(9)
    for fast in (True, False):
        out = attend(parts, 0, x, q, k, v, pos, pos, None, Compute(fast=fast))
        scores = q @ k.transpose(-2, -1) / (3 * SHAPE.head_dim) ** 0.5
        torch.testing.assert_close(out, torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize("n_cached", [0, 6])
def test_fast_path_equals_plain_path_with_padding_and_cached_keys(n_cached):
    parts = perturbed()
    k_pos = torch.arange(n_cached + 5)
    q_pos = k_pos[n_cached:]
    x, q, k, v = qkv(len(q_pos), len(k_pos))
    padding = torch.zeros(2, len(k_pos), dtype=torch.bool)
    padding[1, :2] = True
    mask = attention_mask(q_pos, k_pos, padding, causal=True)
    results = []
    for fast in (True, False):
        out = attend(parts, 1, x, q, k, v, q_pos, k_pos, mask, Compute(fast=fast))
        params = [parts.pe.rel_embeddings, *parts.pe.pos_query_proj[1].parameters()]
        results.append((out, torch.autograd.grad(out.square().sum(), params)))
    (fast_out, fast_grads), (plain_out, plain_grads) = results
    torch.testing.assert_close(fast_out, plain_out)
    for fast_grad, plain_grad in zip(fast_grads, plain_grads, strict=True):
        torch.testing.assert_close(fast_grad, plain_grad)


def test_the_table_is_shared_and_the_projections_are_per_layer(default_pe):
    assert default_pe.rel_embeddings.shape == (2 * 256, SHAPE.d_model)
    assert len(default_pe.pos_key_proj) == len(default_pe.pos_query_proj) == SHAPE.n_layers
    assert default_pe.scale(SHAPE.head_dim) == pytest.approx((3 * SHAPE.head_dim) ** -0.5)


@pytest.mark.parametrize(
    "option,message",
    [
        ("position_buckets=1100", "position_buckets=1100 must be 0"),
        ("max_relative_positions=0", "max_relative_positions=0 must be at least 1"),
        ("pos_att_type=[c2p,p2p]", "pos_att_type=.* must be a non-empty list"),
        ("pos_att_type=[]", "pos_att_type=.* must be a non-empty list"),
    ],
)
def test_bad_options_say_what_to_change(option, message):
    with pytest.raises(ConfigError, match=message):
        build(variant("pe", "deberta", option), shape=SHAPE)


def test_the_official_pipe_syntax_selects_terms():
    pe = build(variant("pe", "deberta", "pos_att_type='p2c|c2p'"), shape=SHAPE)
    assert set(pe.terms) == {"c2p", "p2c"} and pe.needs_query and pe.needs_key
