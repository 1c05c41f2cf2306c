"""KERPLE against its definition: both kernels entry by entry for any positions (cached
decoding rows included), the bounds on r1 and r2 and their gradients, power with r2 = 1 as
ALiBi, the reference's init ranges, and no length limit."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.core import Compute, attend, flex_path
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import attention_mask

CAUSAL = replace(SHAPE, causal=True)
VARIANTS = ["log", "power"]


def kerple(kind: str, shape=CAUSAL, seed: int = 0):
    torch.manual_seed(seed)
    return make_parts(variant("pe", "kerple", f"variant={kind}"), shape=shape).double().pe


def set_parameters(pe, r1: list[float], r2: list[float]) -> None:
    with torch.no_grad():
        pe.r1.copy_(torch.tensor(r1, dtype=torch.float64))
        pe.r2.copy_(torch.tensor(r2, dtype=torch.float64))


def reference_bias(
    kind: str, r1: list[float], r2: list[float], q_pos: list[int], k_pos: list[int]
) -> torch.Tensor:
    """[1, H, Lq, Lk], entry by entry: −r1·log(1 + r2·|i − j|) or −r1·|i − j|^r2."""

    def kernel(a: float, b: float, d: int) -> float:
        return -a * math.log(1 + b * d) if kind == "log" else -a * d**b

    rows = [
        [[kernel(a, b, abs(i - j)) for j in k_pos] for i in q_pos]
        for a, b in zip(r1, r2, strict=True)
    ]
    return torch.tensor(rows, dtype=torch.float64)[None]


IN_RANGE = st.lists(st.floats(0.01, 2.0), min_size=SHAPE.n_heads, max_size=SHAPE.n_heads)


@pytest.fixture(scope="module")
def built() -> dict:
    return {(kind, causal): kerple(kind, replace(SHAPE, causal=causal))
            for kind in VARIANTS for causal in (False, True)}  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(VARIANTS),
    causal=st.booleans(),
    r1=IN_RANGE,
    r2=IN_RANGE,
    offset=st.integers(0, 300),
    n_queries=st.integers(1, 6),
    n_cached=st.integers(0, 6),
)
def test_the_bias_is_the_kernel_for_any_positions(
    built, kind, causal, r1, r2, offset, n_queries, n_cached
):
    pe = built[kind, causal]
    set_parameters(pe, r1, r2)
    k_pos = list(range(offset, offset + n_cached + n_queries))
    q_pos = k_pos[n_cached:]  # cached decoding: the queries are the last keys
    bias = pe.score_bias(None, None, torch.tensor(q_pos), torch.tensor(k_pos), layer=1)
    torch.testing.assert_close(bias, reference_bias(kind, r1, r2, q_pos, k_pos))


@pytest.mark.parametrize("kind", VARIANTS)
def test_cached_decoding_rows_are_the_full_rows(kind):
    pe = kerple(kind)
    pos = torch.arange(30)
    full = pe.score_bias(None, None, pos, pos, 0)
    for n_cached in (0, 17, 29):
        step = pe.score_bias(None, None, pos[n_cached:], pos, 0)
        assert torch.equal(step, full[..., n_cached:, :])


@pytest.mark.parametrize(
    "kind,r1,r2,bounded_r1,bounded_r2",
    [
        ("log", [-1.0, 0.005], [-3.0, 7.0], [0.01, 0.01], [0.01, 7.0]),  # log's r2 has no top
        ("power", [-1.0, 0.005], [-3.0, 7.0], [0.01, 0.01], [0.01, 2.0]),
    ],
)
def test_parameters_out_of_bounds_give_the_kernel_of_the_bounds(
    kind, r1, r2, bounded_r1, bounded_r2
):
    pe = kerple(kind)
    set_parameters(pe, r1, r2)
    assert [t.tolist() for t in pe.bounded()] == [bounded_r1, bounded_r2]
    pos = list(range(12))
    bias = pe.score_bias(None, None, torch.tensor(pos), torch.tensor(pos), 0)
    torch.testing.assert_close(bias, reference_bias(kind, bounded_r1, bounded_r2, pos, pos))
    assert [p.tolist() for p in (pe.r1, pe.r2)] == [r1, r2], "a forward pass writes nothing"


def test_gradients_are_the_kernels_inside_the_bounds_and_never_push_further_out():
    pe = kerple("power")
    pos = torch.arange(9)

    def gradients(sign: float) -> list[list[float]]:
        """d(sign·Σ bias)/d(r1, r2). Lowering Σ bias (sign 1) asks for larger r1 and r2: a
        descent step moves them up; sign −1 moves them down."""
        pe.zero_grad()
        (sign * pe.score_bias(None, None, pos, pos, 0).sum()).backward()
        return [pe.r1.grad.tolist(), pe.r2.grad.tolist()]

    set_parameters(pe, [0.5, 1.5], [0.7, 1.2])
    r1, r2 = (p.detach().clone().requires_grad_() for p in (pe.r1, pe.r2))
    distance = (pos[:, None] - pos[None, :]).abs().double()
    plain = (-r1[:, None, None] * distance.pow(r2[:, None, None])).sum()
    expected = [g.tolist() for g in torch.autograd.grad(plain, (r1, r2))]
    assert gradients(1.0) == [pytest.approx(g) for g in expected]

    set_parameters(pe, [0.001, 0.5], [0.001, 3.0])  # r1[0], r2[0] below, r2[1] above the bounds
    up, down = gradients(1.0), gradients(-1.0)
    assert down[0][0] == down[1][0] == 0, "below the bound, a push further down is dropped"
    assert up[0][0] < 0 and up[1][0] < 0, "below the bound, a push up passes"
    assert up[1][1] == 0 and down[1][1] > 0, "above r2's bound, only a push down passes"
    assert up[0][1] < 0 < down[0][1], "a parameter inside its bounds gets every push"


def test_power_with_exponent_one_is_alibi_with_slopes_r1():
    pe = kerple("power")
    slopes = [0.5, 0.0625]  # ALiBi's for 2 heads are 2^−4 and 2^−8, below r1's bound 0.01
    set_parameters(pe, slopes, [1.0, 1.0])
    alibi = make_parts("alibi", shape=CAUSAL).double().pe
    alibi.slopes.copy_(torch.tensor(slopes))
    q_pos, k_pos = torch.arange(5, 40), torch.arange(40)
    expected = alibi.score_bias(None, None, q_pos, k_pos, 0)
    assert torch.equal(pe.score_bias(None, None, q_pos, k_pos, 0), expected)


@pytest.mark.parametrize("kind,r1_top,r2_top", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_seeded_init_is_deterministic_and_in_the_reference_ranges(kind, r1_top, r2_top):
    shape = replace(CAUSAL, n_heads=256, d_model=512)
    first, second = kerple(kind, shape, seed=3), kerple(kind, shape, seed=3)
    assert torch.equal(first.r1, second.r1) and torch.equal(first.r2, second.r2)
    assert not torch.equal(first.r1, kerple(kind, shape, seed=4).r1)
    for values, top in ((first.r1, r1_top), (first.r2, r2_top)):
        assert 0 <= values.min() < 0.05 * top and 0.95 * top < values.max() < top


def test_one_pair_of_head_vectors_serves_every_layer():
    pe = kerple("log", replace(CAUSAL, n_layers=4))
    assert [(name, p.shape) for name, p in pe.named_parameters()] == [
        ("r1", torch.Size([SHAPE.n_heads])),
        ("r2", torch.Size([SHAPE.n_heads])),
    ]
    pos = torch.arange(8)
    biases = [pe.score_bias(None, None, pos, pos, layer) for layer in range(4)]
    assert all(torch.equal(b, biases[0]) for b in biases[1:])


@pytest.mark.parametrize("kind", VARIANTS)
def test_no_length_limit_and_finite_far_away(kind):
    torch.manual_seed(0)
    pe = make_parts(variant("pe", "kerple", f"variant={kind}"), shape=CAUSAL).pe  # float32
    assert pe.max_len is None
    k_pos = torch.arange(200_000)
    bias = pe.score_bias(None, None, k_pos[-1:], k_pos, 0)[0, :, 0]
    assert torch.isfinite(bias).all()
    assert (bias.diff(dim=-1) >= 0).all(), "the penalty shrinks as keys near the query"
    assert (bias[:, 0] < bias[:, -2]).all()


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_output_and_gradients_are_the_textbook_formula(kind, causal):
    torch.manual_seed(0)
    shape = replace(SHAPE, causal=causal)
    parts = make_parts(variant("pe", "kerple", f"variant={kind}"), shape=shape).double()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.zeros(2, 9, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(9)
    mask = attention_mask(pos, pos, None, causal)
    out = attend(parts, 0, x, q, k, v, pos, pos, mask, Compute(fast=True))
    grads = torch.autograd.grad(out.square().sum(), [parts.pe.r1, parts.pe.r2])

    r1, r2 = (p.detach().clone().requires_grad_() for p in (parts.pe.r1, parts.pe.r2))
    distance = (pos[:, None] - pos[None, :]).abs().double()
    h = (slice(None), None, None)
    bias = -r1[h] * torch.log1p(r2[h] * distance) if kind == "log" else -r1[h] * distance ** r2[h]
    scores = q @ k.transpose(-2, -1) / 8**0.5 + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(out, expected)
    for got, want in zip(
        grads, torch.autograd.grad(expected.square().sum(), (r1, r2)), strict=True
    ):
        torch.testing.assert_close(got, want)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("kind,causal", [("log", True), ("power", False)])
def test_flex_attention_computes_what_the_plain_path_computes(kind, causal):
    torch.manual_seed(0)
    parts = make_parts(variant("pe", "kerple", f"variant={kind}"), shape=SHAPE).double()
    assert parts.flex()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.zeros(2, 9, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(9)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, -3:] = True
    mask = attention_mask(pos, pos, padding, causal)
    with torch.no_grad():  # FlexAttention has no backward pass on the CPU
        flex = flex_path(parts, 0, q, k, v, pos, pos, mask, compiled=False)
        plain = attend(parts, 0, x, q, k, v, pos, pos, mask, Compute(fast=False))
    torch.testing.assert_close(flex, plain)


def test_an_unknown_variant_is_refused():
    with pytest.raises(ConfigError, match="is not one of: log, power"):
        make_parts(variant("pe", "kerple", "variant=exp"), shape=CAUSAL)
