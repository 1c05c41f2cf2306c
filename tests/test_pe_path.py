"""pe=path (PaTH attention, Yang et al. 2025): a layer's output against the definition in
float64 with explicit d×d Householder matrices multiplied loop by loop, the product in the
paper's order (not the reverse), β = 0 giving NoPE and β = 2 reflections keeping the scores
bounded, every path the same with its gradients, cached decoding one token at a time equal
to the full pass in both blocks, no channels without a q·k, and the refusal outside causal
self-attention."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE
from test_combinations import attention, tiny, tokens
from test_pe_fox import BLOCKS, COMPUTES, NORMS, check_decoding, check_every_path

from attnlab.attention.core import AttentionParts, Compute
from attnlab.attention.layer import Attention
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.gau import GAU, GatedAttentionUnit
from attnlab.model.transformer import DecoderLM

CAUSAL = replace(SHAPE, causal=True)
LENGTH = 7
D = CAUSAL.head_dim


def path_parts(pe: str = "path") -> AttentionParts:
    return AttentionParts.from_config(
        variant("pe", pe), variant("norm", "softmax"), variant("synthesizer", "dot"), CAUSAL
    )


def path_layer(compute: Compute | None = None) -> tuple[Attention, AttentionParts]:
    torch.manual_seed(0)
    parts = path_parts()
    compute = compute or Compute()
    width = parts.pe.data_width
    layer = Attention(CAUSAL, 1, True, True, init_std=0.3, compute=compute, data_width=width)
    return layer.double(), parts


def causal_mask(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()[None, None]


def householder(channels: torch.Tensor) -> torch.Tensor:
    """H = I − β w wᵀ from one head's d + 1 channels at one token: w = u/‖u‖, β = 2σ(b)."""
    u, b = channels[:-1], channels[-1]
    w = u / u.norm()
    return torch.eye(len(u), dtype=u.dtype) - 2 * torch.sigmoid(b) * torch.outer(w, w)


def product(hs: list[torch.Tensor], i: int, j: int) -> torch.Tensor:
    """P_ij = H_i H_{i−1} ⋯ H_{j+1}, the later ones on the left."""
    p = torch.eye(hs[0].shape[0], dtype=hs[0].dtype)
    for t in range(j + 1, i + 1):
        p = hs[t] @ p
    return p


def naive_path(layer: Attention, x: torch.Tensor) -> torch.Tensor:
    """softmax_j(q_iᵀ P_ij k_j / √d) v_j with explicit matrices, loop by loop."""
    h = CAUSAL.n_heads
    q, k, v = layer.qkv_proj(x).split(layer.widths, -1)
    data = layer.data_proj(x).view(*x.shape[:2], h, D + 1)
    out = torch.zeros_like(v)
    for b in range(x.shape[0]):
        for head in range(h):
            cols = slice(head * D, (head + 1) * D)
            hs = [householder(data[b, t, head]) for t in range(x.shape[1])]
            for i in range(x.shape[1]):
                scores = [
                    q[b, i, cols] @ product(hs, i, j) @ k[b, j, cols] / math.sqrt(D)
                    for j in range(i + 1)
                ]
                weights = torch.softmax(torch.stack(scores), 0)
                out[b, i, cols] = weights @ v[b, : i + 1, cols]
    return layer.out_proj(out)


def set_beta_logits(layer: Attention, value: float) -> None:
    """Every head's β logit bias to `value` (±1e4: β = 0 or 2 exactly in float64)."""
    with torch.no_grad():
        layer.data_proj.bias.view(CAUSAL.n_heads, D + 1)[:, -1] = value


def test_a_layer_is_the_definition_computed_loop_by_loop():
    layer, parts = path_layer()
    x = torch.randn(2, LENGTH, CAUSAL.d_model, dtype=torch.float64)
    pos = torch.arange(LENGTH)
    got = layer(x, parts, pos, pos, causal_mask(LENGTH), is_causal=True)
    torch.testing.assert_close(got, naive_path(layer, x))


def test_the_product_is_in_the_papers_order():
    """Over three tokens, s_20 = q_2ᵀ H_2 H_1 k_0, not q_2ᵀ H_1 H_2 k_0; s_10 = q_1ᵀ H_1 k_0;
    P_ii = I (the term is zero on the diagonal)."""
    pe = path_parts().pe
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, 3, D, generator=g, dtype=torch.float64) for _ in range(2))
    data = torch.randn(1, 1, 3, D + 1, generator=g, dtype=torch.float64)
    pos = torch.arange(3)
    scores = pe.data_term(q, k, data, pos, pos, 1)[0, 0] * math.sqrt(D) + q[0, 0] @ k[0, 0].T
    h1, h2 = householder(data[0, 0, 1]), householder(data[0, 0, 2])
    q2, k0 = q[0, 0, 2], k[0, 0, 0]
    torch.testing.assert_close(scores[2, 0], q2 @ h2 @ h1 @ k0)
    assert not torch.isclose(scores[2, 0], q2 @ h1 @ h2 @ k0)
    torch.testing.assert_close(scores[1, 0], q[0, 0, 1] @ h1 @ k0)
    torch.testing.assert_close(scores.diagonal(), (q[0, 0] * k[0, 0]).sum(-1))


def test_with_beta_zero_it_is_nope():
    layer, parts = path_layer()
    set_beta_logits(layer, -1e4)
    x = torch.randn(2, LENGTH, CAUSAL.d_model, dtype=torch.float64)
    pos = torch.arange(LENGTH)
    got = layer(x, parts, pos, pos, causal_mask(LENGTH), is_causal=True)
    nope = layer(x, path_parts("none"), pos, pos, causal_mask(LENGTH), is_causal=True)
    torch.testing.assert_close(got, nope)


def test_with_reflections_the_scores_stay_bounded():
    """β = 2: every H_t is a reflection, P_ij orthogonal, |q_iᵀ P_ij k_j| ≤ ‖q_i‖‖k_j‖, and
    with q = k the scores peak at s_ii = ‖q_i‖² — though they are not q·k."""
    layer, parts = path_layer()
    set_beta_logits(layer, 1e4)
    x = torch.randn(2, LENGTH, CAUSAL.d_model, dtype=torch.float64)
    pos = torch.arange(LENGTH)
    data = layer.project(x, parts, pos, pos).data
    q = torch.randn(2, CAUSAL.n_heads, LENGTH, D, dtype=torch.float64) * 3
    plain = q @ q.transpose(-2, -1)
    scores = parts.pe.data_term(q, q, data, pos, pos, 1) * math.sqrt(D) + plain
    norms = q.norm(dim=-1)
    causal = causal_mask(LENGTH)
    bound = (norms[..., :, None] * norms[..., None, :]) * (1 + 1e-12)
    assert (scores.abs() <= bound)[causal.expand_as(scores)].all()
    torch.testing.assert_close(scores.diagonal(dim1=-2, dim2=-1), norms**2)
    assert not torch.allclose(scores.tril(-1), plain.tril(-1))


@COMPUTES
def test_every_path_computes_the_same(compute):
    check_every_path(path_layer, compute)


@BLOCKS
@NORMS
def test_decoding_one_token_at_a_time_is_the_full_pass(block, norm):
    check_decoding("path", block, norm)


def test_gau_channels_follow_its_qk_width():
    gau = tiny(block=GAU(qk_dim=6, expansion=2), n_heads=1)
    model = DecoderLM(gau, attention("path", "softmax", "dot"), 11)
    units = [m for m in model.modules() if isinstance(m, GatedAttentionUnit)]
    assert units and all(unit.data.out_features == 6 + 1 for unit in units)


def test_the_projection_learns():
    torch.manual_seed(0)
    model = DecoderLM(tiny(init_std=0.3), attention("path", "softmax", "dot"), 11)
    model(tokens()).logsumexp(-1).mean().backward()
    projections = [m.data_proj for m in model.modules() if isinstance(m, Attention)]
    assert len(projections) == 2
    assert all(p.weight.grad.abs().sum() > 0 and p.bias.grad.abs().sum() > 0 for p in projections)


def test_without_a_dot_product_it_asks_for_no_channels():
    parts = AttentionParts.from_config(
        variant("pe", "path"), variant("norm", "softmax"), variant("synthesizer", "random"), CAUSAL
    )
    assert parts.pe.data_width == 0 and not parts.pe.acts_in_attention


@pytest.mark.parametrize(
    "shape", [SHAPE, replace(CAUSAL, cross=True)], ids=["bidirectional", "cross-attention"]
)
def test_outside_causal_self_attention_it_is_one_sentence(shape):
    with pytest.raises(ConfigError, match="causal self-attention only"):
        build(variant("pe", "path"), shape=shape)


@pytest.mark.parametrize("synthesizer", ["dense_vanilla", "random_vanilla"])
def test_a_mixture_that_weighs_the_dot_product_is_one_sentence(synthesizer):
    with pytest.raises(ConfigError, match=r"PaTH replaces q_i·k_j .* weighs q·k in a mixture"):
        DecoderLM(tiny(), attention("path", "softmax", synthesizer), 11)
