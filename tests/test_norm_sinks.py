"""The normalizers that let a query attend to less than a whole row (sink, off_by_one,
softpick) or keep its focus as rows grow (ssmax), beyond the generic formula tests of
test_norm.py: their parameters per layer and head, and the properties their papers claim."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import SHAPE

from attnlab.config.build import build
from attnlab.config.options import variant

SHAPE3 = replace(SHAPE, n_heads=3, n_layers=2)


def normalizer(name: str, *overrides: str):
    return build(variant("norm", name, *overrides), shape=SHAPE3)


def test_the_sink_logit_is_learned_per_layer_and_head_and_off_by_one_fixes_it_at_zero():
    sink = normalizer("sink")
    assert [tuple(p.shape) for p in sink.parameters()] == [(2, 3)]
    assert list(normalizer("off_by_one").parameters()) == []
    with torch.no_grad():
        sink.sink.values.copy_(torch.tensor([[0.0, 1.0, -2.0], [3.0, 0.5, 0.0]]))
    scores = torch.randn(1, 3, 4, 5, dtype=torch.float64)
    for layer in (0, 1):
        weights = sink(scores, None, layer)
        b = sink.sink.values[layer].double()[:, None, None]
        expected = scores.exp() / (b.exp() + scores.exp().sum(-1, keepdim=True))
        torch.testing.assert_close(weights, expected.detach())
    weights = sink(scores.float(), None, 1)
    weights.sum().backward()
    assert sink.sink.values.grad[1].abs().min() > 0 and sink.sink.values.grad[0].eq(0).all()


def test_a_sink_lets_a_row_of_low_scores_attend_to_almost_nothing():
    scores = torch.full((1, 3, 1, 8), -10.0, dtype=torch.float64)
    assert normalizer("off_by_one")(scores, None, 0).sum(-1).max() < 1e-3
    torch.testing.assert_close(
        normalizer("softmax")(scores, None, 0).sum(-1), torch.ones(1, 3, 1, dtype=torch.float64)
    )


def test_softpick_gives_nonpositive_scores_no_weight_and_matches_the_authors_formula():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 6, 9, generator=g, dtype=torch.float64) * 4
    weights = normalizer("softpick")(scores, None, 0)
    assert (weights[scores <= 0] == 0).all() and (weights[scores > 0] > 0).all()
    assert (weights.sum(-1) <= 1 + 1e-12).all()
    # the authors' reference code (its ε unscaled): the same up to ε's scaling
    top = scores.amax(-1, keepdim=True)
    shifted = torch.exp(scores - top) - torch.exp(-top)
    theirs = F.relu(shifted) / (shifted.abs().sum(-1, keepdim=True) + 1e-8)
    torch.testing.assert_close(weights, theirs, rtol=1e-6, atol=1e-9)
    negative = -scores.abs() - 0.1
    assert normalizer("softpick")(negative, None, 0).eq(0).all(), "all ≤ 0: attend to nothing"


def test_ssmax_keeps_the_top_weight_as_rows_grow_where_softmax_fades():
    """Nakanishi 2025, Figure 1: one score of +3 among -2s, s = 0.43."""
    ssmax = normalizer("ssmax", "scale=0.43", "learned=false")
    softmax = normalizer("softmax")
    tops = {}
    for n in (10, 100, 1000, 10000):
        row = torch.full((1, 3, 1, n), -2.0, dtype=torch.float64)
        row[..., -1] = 3.0
        tops[n] = (
            ssmax(row, None, 0)[0, 0, 0, -1].item(),
            softmax(row, None, 0)[0, 0, 0, -1].item(),
        )
        expected = 1 / (1 + (n - 1) * n ** (-5 * 0.43))  # n^{3s} / (n^{3s} + (n-1) n^{-2s})
        assert tops[n][0] == pytest.approx(expected, rel=1e-7)  # s is stored in float32
    ss, soft = zip(*tops.values(), strict=True)
    assert list(ss) == sorted(ss) and ss[-1] > 0.99, "SSMax: the top weight grows toward 1"
    assert list(soft) == sorted(soft, reverse=True) and soft[-1] < 0.02, "softmax: it fades"


def test_ssmax_counts_the_keys_each_query_sees():
    ssmax = normalizer("ssmax")
    scores = torch.randn(1, 3, 5, 5, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    weights = ssmax(scores, causal, 0)
    for i in range(5):
        expected = torch.softmax(math.log(i + 1) * scores[..., i, : i + 1], -1)
        torch.testing.assert_close(weights[..., i, : i + 1], expected)
    assert [tuple(p.shape) for p in ssmax.parameters()] == [(2, 3)]
