"""norm=differential (Ye et al. 2025, arXiv 2410.05258) beyond the generic tests of
test_norm.py: a whole attention layer against the paper's definition written as a float64
loop (two softmaxes per pair, λ from its vectors, the pair's RMSNorm, the 1 − λ_init), λ_init
per layer, the pairing's equivalence to one map over a value twice as wide, cached decoding
equal to the full pass, and the refusal of an odd number of heads."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, make_parts
from test_combinations import BLOCKS, VOCAB, attention, check_decoder_lm_cache, tiny

from attnlab.attention.layer import Attention
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import DecoderLM, Tagger, attention_mask
from attnlab.norm.differential import lambda_init

SHAPE4 = replace(SHAPE, n_heads=4, head_dim=4, value_dim=4, n_layers=3, causal=True)


def differential(shape=SHAPE4, *overrides: str):
    return build(variant("norm", "differential", *overrides), shape=shape)


def moved(module: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """`module` with every parameter moved off its initial value (the gain off 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=g, dtype=parameter.dtype) * 0.3)
    return module


@pytest.mark.parametrize(
    ("layer", "expected"),
    [(0, 0.2), (1, 0.3555090675909693), (2, 0.4707130183435841), (3, 0.5560582041556405)],
)
def test_lambda_init_is_the_papers_value_for_layer_l_counted_from_one(layer, expected):
    """0.8 − 0.6·exp(−0.3·(l − 1)) for l = layer + 1; toward 0.8 deep in the stack."""
    assert lambda_init(layer) == pytest.approx(expected, rel=1e-12)
    assert lambda_init(40) == pytest.approx(0.8, abs=1e-5)


def test_with_zero_lambda_vectors_lambda_is_lambda_init_and_rows_sum_to_one_minus_it():
    norm = differential()
    with torch.no_grad():
        for layer in norm.layers:
            for name in ("q1", "k1", "q2", "k2"):
                getattr(layer, name).zero_()
    scores = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    for layer in range(3):
        assert norm.lam(layer).item() == pytest.approx(lambda_init(layer), rel=1e-7)
        sums = norm(scores, causal, layer).sum(-1)
        torch.testing.assert_close(sums, torch.full_like(sums, 1 - lambda_init(layer)))


def test_the_lambda_vectors_have_the_qk_head_width_and_start_from_n_0_01():
    torch.manual_seed(0)
    norm = differential(replace(SHAPE4, head_dim=2000, n_layers=1))
    layer = norm.layers[0]
    for name in ("q1", "k1", "q2", "k2"):
        vector = getattr(layer, name)
        assert vector.shape == (2000,) and vector.std().item() == pytest.approx(0.1, rel=0.1)
    assert torch.equal(layer.gain, torch.ones(2 * SHAPE4.value_dim))
    assert differential(SHAPE4, "gain=false").layers[0].gain is None


def papers_layer(attn: Attention, parts, x, mask, layer: int, eps: float) -> torch.Tensor:
    """The paper's differential attention as a loop in float64, from the layer's own q, k and
    v: each pair p (heads 2p, 2p + 1) takes softmax(q₁k₁ᵀ/√d) − λ softmax(q₂k₂ᵀ/√d) over the
    visible keys, applies it to the 2d-wide value [v_2p, v_2p+1], normalizes the result by its
    RMS over the 2d features times the gain, multiplies by 1 − λ_init; the pairs' outputs,
    concatenated, go through the output projection."""
    pos = torch.arange(x.shape[1])
    q, k, v, _ = attn.project(x, parts, pos, pos)
    vectors = parts.norm.layers[layer]
    lam = (
        math.exp(float((vectors.q1 @ vectors.k1).detach()))
        - math.exp(float((vectors.q2 @ vectors.k2).detach()))
        + 0.8
        - 0.6 * math.exp(-0.3 * ((layer + 1) - 1))
    )
    init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    batch, heads, length, d = q.shape
    mask = mask.expand(batch, 1, length, length)
    out = torch.zeros(batch, length, heads * v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for p in range(heads // 2):
            one, two = 2 * p, 2 * p + 1
            value = torch.cat([v[b, one], v[b, two]], -1)  # [L, 2d]
            for i in range(length):
                keys = [j for j in range(length) if mask[b, 0, i, j]]
                s1 = torch.stack([q[b, one, i] @ k[b, one, j] for j in keys]) / math.sqrt(d)
                s2 = torch.stack([q[b, two, i] @ k[b, two, j] for j in keys]) / math.sqrt(d)
                a = s1.exp() / s1.exp().sum() - lam * s2.exp() / s2.exp().sum()
                o = sum(a[n] * value[j] for n, j in enumerate(keys))
                o = o / torch.sqrt(o.square().mean() + eps) * vectors.gain * (1 - init)
                out[b, i, 2 * p * v.shape[-1] : 2 * (p + 1) * v.shape[-1]] = o
    return attn.out_proj(out), lam


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_layers_weights_and_output_are_the_papers_definition(causal):
    torch.manual_seed(0)
    shape = replace(SHAPE4, causal=causal)
    parts = moved(make_parts("none", "differential", "dot", shape=shape)).double()
    layer = 2
    attn = Attention(shape, layer, True, True, init_std=0.3).double()
    x = torch.randn(2, 6, shape.d_model, dtype=torch.float64)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, -2:] = True
    pos = torch.arange(6)
    mask = attention_mask(pos, pos, padding, causal)
    expected, lam = papers_layer(attn, parts, x, mask, layer, eps=1e-5)
    torch.testing.assert_close(attn(x, parts, pos, pos, mask), expected)

    weights = attn.weights(x, parts, pos, pos, mask)
    torch.testing.assert_close(weights[:, 0::2], weights[:, 1::2], rtol=0, atol=0)
    assert (weights[~mask.expand_as(weights)] == 0).all(), "masked keys get no weight"
    sums = weights.sum(-1)
    torch.testing.assert_close(sums, torch.full_like(sums, 1 - lam))


def test_a_pairs_outputs_concatenated_are_its_one_map_times_the_double_width_value():
    torch.manual_seed(0)
    norm = moved(differential()).double()
    scores = torch.randn(2, 4, 5, 7, dtype=torch.float64)
    v = torch.randn(2, 4, 7, 3, dtype=torch.float64)
    weights = norm(scores, None, 1)
    heads = weights @ v
    for p in range(2):
        pair = torch.cat([heads[:, 2 * p], heads[:, 2 * p + 1]], -1)
        wide = torch.cat([v[:, 2 * p], v[:, 2 * p + 1]], -1)  # [B, Lk, 2·d_v]
        torch.testing.assert_close(pair, weights[:, 2 * p] @ wide)
        torch.testing.assert_close(weights[:, 2 * p + 1], weights[:, 2 * p])


def test_each_heads_own_row_shift_changes_nothing_and_a_row_with_no_key_gives_zeros():
    """A key bias b shifts head h's row i by q_hi·b, a different constant in each head:
    each softmax absorbs its own. A query with no visible key: zero weights, zero output,
    finite gradients."""
    norm = moved(differential()).double()
    scores = torch.randn(2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    shifts = torch.randn(2, 4, 5, 1, dtype=torch.float64) * 10
    torch.testing.assert_close(norm(scores + shifts, None, 0), norm(scores, None, 0))
    mask = torch.ones(2, 1, 5, 6, dtype=torch.bool)
    mask[0, :, 3] = False
    weights = norm(scores, mask, 0)
    out = norm.output(weights @ torch.randn(2, 4, 6, 4, dtype=torch.float64), 0)
    assert weights[0, :, 3].eq(0).all() and out[0, :, 3].eq(0).all()
    out.square().sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in norm.layers[0].parameters())


@pytest.mark.parametrize("pe", ["none", "rope", "alibi"])
def test_decoding_one_token_at_a_time_is_the_full_pass(pe):
    torch.manual_seed(0)
    model = DecoderLM(tiny(init_std=0.3, n_heads=4), attention(pe, "differential", "dot"), 11)
    moved(model.stack.parts.norm)
    check_decoder_lm_cache(model)


def test_an_odd_number_of_heads_is_refused_in_one_sentence():
    with pytest.raises(ConfigError) as refusal:
        differential(replace(SHAPE4, n_heads=3))
    message = str(refusal.value)
    assert "needs an even number of heads, not 3: set model.n_heads to an even" in message
    assert message.count(". ") == 0 and "\n" not in message, "one sentence"
    with pytest.raises(ConfigError, match="block=gau has one head: use block=standard"):
        cfg = tiny(block=BLOCKS["gau"], n_heads=1)
        Tagger(cfg, attention("none", "differential", "dot"), VOCAB, 5, causal=True)
