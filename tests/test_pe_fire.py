"""FIRE against its definition: the bias entry by entry in float64 with the module's own
parameters (causal, and the bidirectional extension), the ranges of the MLP input below and
above the threshold L, cached decoding rows, and gradients reaching c, L and the MLP."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.core import Compute, attend
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import attention_mask

CAUSAL = replace(SHAPE, causal=True)
EPS = 1e-6


def fire(causal: bool = True, *overrides: str, seed: int = 0):
    torch.manual_seed(seed)
    shape = replace(SHAPE, causal=causal)
    return make_parts(variant("pe", "fire", *overrides), shape=shape).double().pe


def perturbed(pe, c: float, l_mult: float):
    """The module with c and L_mult moved off their init (negative values test the |·|)."""
    with torch.no_grad():
        pe.c.fill_(c)
        pe.L_mult.fill_(l_mult)
    return pe


def reference_input(i: int, j: int, c: float, threshold: float, reach: int) -> float:
    """sgn(i − j)·ψ(|i − j|)/(ψ(max(L, reach)) + ε), ψ(x) = log(|c|·x + 1)."""
    psi = lambda x: math.log(abs(c) * x + 1)  # noqa: E731
    return math.copysign(psi(abs(i - j)), i - j) / (psi(max(threshold, reach)) + EPS)


def reference_mlp(pe, u: float) -> list[float]:
    """f_θ(u) for each head, from the module's weights: W2·relu(W1·u + b1) + b2."""
    first, second = pe.mlp[0], pe.mlp[2]
    hidden = [max(w * u + b, 0.0) for w, b in zip(first.weight[:, 0].tolist(), first.bias.tolist(), strict=True)]  # fmt: skip
    return [
        sum(w * h for w, h in zip(row, hidden, strict=True)) + b
        for row, b in zip(second.weight.tolist(), second.bias.tolist(), strict=True)
    ]


def reference_bias(pe, q_pos: list[int], k_pos: list[int], causal: bool) -> torch.Tensor:
    """[1, H, Lq, Lk], entry by entry."""
    c, threshold = pe.c.item(), abs(pe.L_mult.item() * pe.init_L)
    rows = []
    for i in q_pos:
        reach = i if causal else max(i, max(k_pos))
        rows.append([reference_mlp(pe, reference_input(i, j, c, threshold, reach)) for j in k_pos])
    return torch.tensor(rows, dtype=torch.float64).permute(2, 0, 1)[None]


@pytest.fixture(scope="module")
def built() -> dict:
    return {causal: fire(causal, "init_L=8") for causal in (False, True)}


@settings(max_examples=25, deadline=None)
@given(
    causal=st.booleans(),
    c=st.floats(-2.0, 2.0).filter(lambda c: abs(c) > 1e-3),
    l_mult=st.floats(-3.0, 3.0),
    offset=st.integers(0, 40),
    n_queries=st.integers(1, 5),
    n_cached=st.integers(0, 5),
)
def test_the_bias_is_the_mlp_of_the_interpolated_distance(
    built, causal, c, l_mult, offset, n_queries, n_cached
):
    pe = perturbed(built[causal], c, l_mult)
    k_pos = list(range(offset, offset + n_cached + n_queries))
    q_pos = k_pos[n_cached:]  # cached decoding: the queries are the last keys
    bias = pe.score_bias(None, None, torch.tensor(q_pos), torch.tensor(k_pos), layer=1)
    torch.testing.assert_close(bias, reference_bias(pe, q_pos, k_pos, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_cached_decoding_rows_are_the_full_rows(causal):
    pe = perturbed(fire(causal, "init_L=6"), 0.3, 1.2)
    pos = torch.arange(20)
    full = pe.score_bias(None, None, pos, pos, 0)
    for n_cached in (0, 5, 13, 19):
        torch.testing.assert_close(
            pe.score_bias(None, None, pos[n_cached:], pos, 0), full[..., n_cached:, :]
        )


def test_the_causal_input_spans_0_to_1_from_the_threshold_on_and_less_below():
    pe = perturbed(fire(True, "init_L=16"), 0.2, -1.0)  # L = 16
    pos = torch.arange(60)
    u = pe.mlp_inputs(pos, pos).detach()
    psi = lambda x: math.log(0.2 * x + 1)  # noqa: E731
    for i in range(1, 60):
        visible = u[i, : i + 1]  # keys j ≤ i
        assert visible.min() == 0 == visible[i], "the query's own key is at 0"
        top = visible.max().item()
        assert top == pytest.approx(psi(i) / (psi(max(16, i)) + EPS), rel=1e-12)
        if i >= 16:
            assert 1 - 1e-5 < top <= 1, "the first key is at 1: the whole range is used"
        else:
            assert top < psi(i) / psi(16) + 1e-12 < 1, "short contexts are not stretched"
        assert (visible[:-1] > visible[1:]).all(), "farther keys, larger inputs"


def test_the_bidirectional_input_keeps_the_side_and_stays_within_minus_1_and_1():
    pe = perturbed(fire(False, "init_L=4"), 0.5, 1.0)
    pos = torch.arange(30)
    u = pe.mlp_inputs(pos, pos).detach()
    assert u.abs().max() <= 1 and u.abs().max() > 1 - 1e-5
    torch.testing.assert_close(u, -u.T)  # j before i: positive; after: negative
    before = torch.ones(30, 30, dtype=torch.bool).tril(-1)  # j < i
    assert (u.diagonal() == 0).all() and (u[before] > 0).all()


def test_gradients_reach_c_the_threshold_and_the_mlp():
    pe = perturbed(fire(True, "init_L=10"), 0.3, 1.0)
    pos = torch.arange(25)  # rows below and above L = 10
    pe.score_bias(None, None, pos, pos, 0).square().sum().backward()
    for name, parameter in pe.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    assert [name for name, _ in pe.named_parameters()] == [
        "c", "L_mult", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"
    ]  # fmt: skip


def test_one_module_serves_every_layer_with_no_length_limit():
    pe = fire(True)
    assert pe.max_len is None
    pos = torch.arange(12)
    biases = [pe.score_bias(None, None, pos, pos, layer) for layer in range(SHAPE.n_layers)]
    assert torch.equal(biases[0], biases[1])
    far = torch.arange(50_000)
    assert torch.isfinite(pe.score_bias(None, None, far[-3:], far, 0)).all()


def test_seeded_init_is_deterministic_with_the_defaults_of_the_paper():
    first, second = fire(True, seed=5), fire(True, seed=5)
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.mlp[0].weight, fire(True, seed=6).mlp[0].weight)
    assert (first.c.item(), first.L_mult.item(), first.init_L) == pytest.approx((0.1, 1, 512))
    assert first.mlp[0].out_features == 32 and first.mlp[2].out_features == SHAPE.n_heads


def test_bf16_autocast_leaves_the_bias_in_float32():
    torch.manual_seed(0)
    pe = make_parts("fire", shape=CAUSAL).pe
    pos = torch.arange(700)
    exact = pe.score_bias(None, None, pos, pos, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = pe.score_bias(None, None, pos, pos, 0)
    assert autocast.dtype == torch.float32 and torch.equal(autocast, exact)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_output_is_the_textbook_formula(causal):
    torch.manual_seed(0)
    parts = make_parts(variant("pe", "fire", "init_L=4"), shape=replace(SHAPE, causal=causal))
    parts = parts.double()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.zeros(2, 9, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(9)
    mask = attention_mask(pos, pos, None, causal)
    out = attend(parts, 0, x, q, k, v, pos, pos, mask, Compute(fast=True))
    scores = q @ k.transpose(-2, -1) / 8**0.5 + reference_bias(
        parts.pe, pos.tolist(), pos.tolist(), causal
    )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize(
    "override,message",
    [("mlp_width=0", "at least 1"), ("init_c=0", "must be positive"), ("init_L=-5", "positive")],
)
def test_bad_options_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        make_parts(variant("pe", "fire", override), shape=CAUSAL)
