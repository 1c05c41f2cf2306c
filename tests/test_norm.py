"""Normalizers against their definitions.

Direct float64 formulas, row sums and norms, stability at extreme scores and fully masked
rows, float32 arithmetic under low-precision scores, and the permutation and bias facts
checked through the attention core.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.core import Compute, attend
from attnlab.config.build import build
from attnlab.config.options import causal_only, options, variant
from attnlab.errors import ConfigError

NORMS = options("norm")


SCORES_SHAPE = replace(SHAPE, n_heads=4)  # the heads of scores_and_mask (even: differential)


def normalizer(name: str, *overrides: str):
    """The normalizer, its parameters drawn alike at each call (differential's λ vectors)."""
    torch.manual_seed(0)
    shape = replace(SCORES_SHAPE, causal=bool(causal_only(name, "norm")))
    return build(variant("norm", name, *overrides), shape=shape)


def stick_breaking(s: torch.Tensor) -> torch.Tensor:
    """Each visible key but the last (the query's own), nearest first, takes σ(s) of the
    stick left; written as a loop."""
    out, left = torch.zeros_like(s), 1.0
    for j in reversed(range(len(s) - 1)):
        out[j] = torch.sigmoid(s[j]) * left
        left = left * (1 - torch.sigmoid(s[j]))
    return out


def selected_away(scores: torch.Tensor, visible: torch.Tensor, i: int) -> torch.Tensor:
    """Selective attention's F for query i of one batch row ([H, Lq, Lk] scores, [Lq, Lk]
    mask), as a loop: Σ over earlier queries k of ReLU(s⁰_kj) over k's visible keys j but
    its last (its own) and the first key."""
    total = torch.zeros(scores.shape[-1], dtype=scores.dtype)
    for k in range(i):
        for j in visible[k].nonzero().flatten().tolist()[:-1]:
            total[j] += max(scores[0, k, j].item(), 0.0) if j else 0.0
    return total


def scores_and_mask(seed: int = 0, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, 4, 5, 7, generator=g, dtype=torch.float64) * scale
    mask = torch.rand(2, 1, 5, 7, generator=g) > 0.3
    mask[..., 0] = True
    return scores, mask


def differential(heads: torch.Tensor, h: int, lam: float) -> torch.Tensor:
    """Heads 2p and 2p + 1 both get softmax(s_2p) − λ softmax(s_2p+1)."""
    first, second = heads[h - h % 2], heads[h - h % 2 + 1]
    return first.exp() / first.exp().sum() - lam * second.exp() / second.exp().sum()


def reference(name: str, heads: torch.Tensor, h: int, norm) -> torch.Tensor:
    """Each normalizer's formula on the visible scores of one query in each head [H, n],
    for head h, written out directly (`norm` for learned parameters at their init)."""
    s = heads[h]
    n = s.shape[-1]
    return {
        "softmax": lambda: s.exp() / s.exp().sum(),
        "l2": lambda: s.exp() / s.exp().square().sum().sqrt(),
        "relu2": lambda: F.relu(s) ** 2 / n,
        "l2_act": lambda: F.silu(s) / (F.silu(s).square().sum() + 1e-6).sqrt(),
        "exp": lambda: s.exp(),
        "sigmoid": lambda: torch.sigmoid(s - math.log(n)),
        "sink": lambda: s.exp() / (1 + s.exp().sum()),  # b = 0 at initialization
        "off_by_one": lambda: s.exp() / (1 + s.exp().sum()),
        "softpick": lambda: F.relu(s.exp() - 1) / ((s.exp() - 1).abs().sum() + 1e-8),
        "ssmax": lambda: torch.softmax(math.log(n) * s, -1),  # s = 1 at initialization
        "stick_breaking": lambda: stick_breaking(s),
        "differential": lambda: differential(heads, h, norm.lam(0).item()),
        "selective": lambda: s.exp() / s.exp().sum(),  # of the scores less F (selected_away)
    }[name]()


@pytest.mark.parametrize("name", NORMS)
def test_each_normalizer_is_its_formula_on_the_visible_keys(name):
    scores, mask = scores_and_mask()
    norm = normalizer(name)
    weights = norm(scores, mask, 0)
    for index in row_indices(scores):
        b, h, i = index
        heads, keep = scores[b, :, i], mask[b, 0, i]
        if name == "selective":
            heads = heads - selected_away(scores[b], mask[b, 0], i)
        torch.testing.assert_close(weights[index][keep], reference(name, heads[:, keep], h, norm))
        assert (weights[index][~keep] == 0).all()


def row_indices(scores: torch.Tensor):
    b, h, lq, _ = scores.shape
    return [(i, j, k) for i in range(b) for j in range(h) for k in range(lq)]


def test_softmax_rows_sum_to_one_and_l2_rows_have_unit_norm():
    scores, mask = scores_and_mask(scale=10.0)
    torch.testing.assert_close(
        normalizer("softmax")(scores, mask, 0).sum(-1), torch.ones(2, 4, 5, dtype=torch.float64)
    )
    l2 = normalizer("l2")(scores, mask, 0)
    torch.testing.assert_close(l2.norm(dim=-1), torch.ones(2, 4, 5, dtype=torch.float64))


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_scores_and_fully_masked_rows_stay_finite(name, dtype):
    scores = torch.tensor(
        [[1e3, -1e3, 0.0, 1e3], [-1e3, -1e3, -1e3, -1e3], [5.0, 1.0, 2.0, 3.0]], dtype=dtype
    )
    scores = scores[None, None].repeat(1, SCORES_SHAPE.n_heads, 1, 1).requires_grad_()
    mask = torch.tensor([[True, True, True, True], [True, True, True, True], [False] * 4])[
        None, None
    ]
    weights = normalizer(name)(scores, mask, 0)
    weights.sum().backward()
    assert torch.isfinite(weights).all() and torch.isfinite(scores.grad).all()
    assert (weights[..., 2, :] == 0).all(), "a row with no visible key must be all zero"


def test_exp_without_a_clamp_ignores_a_masked_score_that_would_overflow():
    scores = torch.tensor([[[[1.0, 200.0, 3.0]]]], requires_grad=True)
    mask = torch.tensor([[[[True, False, True]]]])
    weights = normalizer("exp", "max_score=null")(scores, mask, 0)
    weights.sum().backward()
    torch.testing.assert_close(weights[0, 0, 0], torch.tensor([math.e, 0.0, math.exp(3.0)]))
    assert torch.isfinite(scores.grad).all()


@given(st.floats(-50, 50), st.integers(0, 100))
@settings(max_examples=30, deadline=None)
def test_shift_invariance_holds_exactly_for_softmax_and_l2(shift, seed):
    scores, mask = scores_and_mask(seed)
    for name in NORMS:
        norm = normalizer(name)
        same = torch.allclose(norm(scores + shift, mask, 0), norm(scores, mask, 0), atol=1e-9)
        if norm.shift_invariant:
            assert same, name
        elif abs(shift) > 1:
            assert not same, f"{name} should change under a per-row shift of {shift}"


def random_qkv(seed: int = 0, length: int = 6):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    h, d = SHAPE.n_heads, SHAPE.head_dim
    x = make(2, length, SHAPE.d_model)
    return x, make(2, h, length, d), make(2, h, length, d), make(2, h, length, d)


def nope_attention(norm: str, x, q, k, v, fast: bool = False):
    torch.manual_seed(0)  # the same parameters at each call (differential's λ vectors)
    parts = make_parts("none", norm, "dot").double()
    pos = torch.arange(q.shape[2])
    return attend(parts, 0, x, q, k, v, pos, pos, None, Compute(fast=fast))


@pytest.mark.parametrize("name", NORMS)
def test_without_positions_attention_is_permutation_equivariant(name):
    """...unless the normalizer reads the keys' order (stick-breaking): then permuting the
    keys changes the output, which is how it gives positions."""
    x, q, k, v = random_qkv()
    perm = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(1))
    out = nope_attention(name, x, q, k, v)
    permuted_keys = nope_attention(name, x, q, k[:, :, perm], v[:, :, perm])
    assert torch.allclose(permuted_keys, out) != normalizer(name).reads_order
    if not normalizer(name).reads_order:
        permuted_queries = nope_attention(name, x[:, perm], q[:, :, perm], k, v)
        torch.testing.assert_close(permuted_queries, out[:, :, perm])


@pytest.mark.parametrize("name", NORMS)
def test_a_key_bias_matters_only_for_normalizers_that_are_not_shift_invariant(name):
    x, q, k, v = random_qkv()
    b_k = torch.randn(1, SHAPE.n_heads, 1, SHAPE.head_dim, dtype=torch.float64)
    same = torch.allclose(nope_attention(name, x, q, k + b_k, v), nope_attention(name, x, q, k, v))
    assert same == normalizer(name).shift_invariant


def test_under_softmax_a_value_bias_passes_through():
    x, q, k, v = random_qkv()
    b_v = torch.randn(1, SHAPE.n_heads, 1, SHAPE.head_dim, dtype=torch.float64)
    torch.testing.assert_close(
        nope_attention("softmax", x, q, k, v + b_v), nope_attention("softmax", x, q, k, v) + b_v
    )


def test_exp_l2_leaks_position_under_a_causal_mask_with_identical_tokens():
    """Design notes §1.3: row sums of exactly √i for identical tokens (1-indexed)."""
    scores = torch.zeros(1, 1, 6, 6, dtype=torch.float64)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    row_sums = normalizer("l2")(scores, causal, 0).sum(-1)[0, 0]
    torch.testing.assert_close(row_sums, torch.arange(1, 7, dtype=torch.float64).sqrt())


@pytest.mark.parametrize("scale", [1.0, 1e3, -1e3])
def test_l2_of_equal_scores_is_one_over_root_n_in_float32_at_any_scale(scale):
    scores = torch.full((1, 1, 3, 4), scale, dtype=torch.float32)
    weights = normalizer("l2")(scores, None, 0)
    assert torch.equal(weights, torch.full_like(weights, 0.5)), "no cancellation error"


# round to nearest: a relative error of at most half the spacing of the significands
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@pytest.mark.parametrize(
    "name,dtype",
    [
        (name, dtype)
        for name in NORMS
        for dtype in (torch.bfloat16, torch.float16)
        if (name, dtype) != ("exp", torch.float16)  # refused: the next test
    ],
)
def test_low_precision_scores_are_normalized_in_float32_and_returned_in_their_dtype(name, dtype):
    scores, mask = scores_and_mask(scale=30.0)
    low = scores.to(dtype)
    weights = normalizer(name)(low, mask, 0)
    assert weights.dtype == dtype
    # the formula in float64 on the same rounded scores; only the output is rounded again
    exact = normalizer(name)(low.double(), mask, 0)
    torch.testing.assert_close(weights.double(), exact, rtol=UNIT_ROUNDOFF[dtype], atol=6e-8)


def test_exp_refuses_float16_and_names_the_precisions_that_work():
    scores = torch.zeros(1, 1, 2, 2)
    with pytest.raises(ConfigError, match="bf16-mixed or 32-true"):
        normalizer("exp")(scores.half(), None, 0)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(ConfigError, match="16-mixed"):
        normalizer("exp")(scores, None, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(normalizer("exp")(scores, None, 0), torch.ones_like(scores))


def test_an_exp_l2_row_sum_is_largest_and_flat_where_the_rows_scores_are_equal():
    """Σ_j w_ij = ‖e^s‖₁ / ‖e^s‖₂ ≤ √n, with equality at equal scores: there its gradient is
    zero, so a PE whose score terms start near zero learns slowly through the row sums."""
    norm = build(variant("norm", "l2"), shape=SCORES_SHAPE)
    equal = torch.full((1, 1, 1, 6), 0.3, dtype=torch.float64, requires_grad=True)
    (gradient,) = torch.autograd.grad(norm(equal, None, 0).sum(), equal)
    assert norm(equal, None, 0).sum().item() == pytest.approx(6**0.5)
    assert gradient.abs().max().item() < 1e-12
    spread = torch.linspace(0.0, 0.5, 6, dtype=torch.float64).view(1, 1, 1, 6).requires_grad_()
    (gradient,) = torch.autograd.grad(norm(spread, None, 0).sum(), spread)
    assert norm(spread, None, 0).sum().item() < 6**0.5
    assert gradient.abs().max().item() > 1e-2


@pytest.mark.parametrize("name", NORMS)
def test_rows_sum_to_one_exactly_where_the_normalizer_declares_it(name):
    scores, mask = scores_and_mask(scale=5.0)
    sums = normalizer(name)(scores, mask, 0).sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums)) == normalizer(name).rows_sum_to_one


@pytest.mark.parametrize("name", NORMS)
def test_row_sums_are_one_number_per_head_whatever_the_scores_where_declared(name):
    """Softmax's 1, differential attention's 1 − λ: identical values give equal outputs."""
    norm = normalizer(name)
    sums = torch.stack([norm(*scores_and_mask(seed, 5.0), 0).sum(-1) for seed in (0, 1)])
    fixed = torch.allclose(sums, sums[:1, :1, :, :1].expand_as(sums))  # [seed, B, H, Lq]
    assert fixed == norm.fixed_row_sums
    assert norm.fixed_row_sums or not norm.rows_sum_to_one
