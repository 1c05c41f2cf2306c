"""Score terms of the distance alone (t5, alibi, kerple): the Toeplitz expansion and its
diagonal-sum gradient, and the fused CPU path, against the formula in float64."""

from __future__ import annotations

import pytest
import torch
from helpers import SHAPE, every_combination, make_parts, small_variant

import attnlab.attention.core as core
import attnlab.attention.distance as distance
from attnlab.attention.core import Compute, attend
from attnlab.attention.distance import (
    DistanceScores,
    Span,
    distance_attention,
    distance_span,
    toeplitz,
)
from attnlab.model.transformer import attention_mask

DISTANCE_PES = ["t5", "alibi", "kerple"]


def indexed(u: torch.Tensor, offset: int, lq: int, lk: int) -> torch.Tensor:
    """u[h, offset + j − i] by plain indexing: the definition."""
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None]
    return u[:, offset + j - i]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("lq,lk,extra", [(5, 5, 0), (1, 6, 0), (4, 9, 3), (7, 3, 2)])
def test_toeplitz_is_u_at_j_minus_i_with_the_gradient_of_indexing(lq, lk, extra, transposed):
    torch.manual_seed(0)
    r = lq + lk - 1 + 2 * extra
    u = (torch.randn(r, 3).T if transposed else torch.randn(3, r)).double().requires_grad_()
    offset = lq - 1 + extra
    expected = indexed(u, offset, lq, lk)
    got = toeplitz(u, offset, lq, lk)
    assert torch.equal(got, expected)
    grad = torch.randn_like(expected)
    torch.testing.assert_close(
        torch.autograd.grad(got, u, grad)[0], torch.autograd.grad(expected, u, grad)[0]
    )


def textbook(q, k, v, u, span: Span, mask, causal: bool, scale: float) -> torch.Tensor:
    """softmax(scale·q·kᵀ + u[d − d_min], masked) v, a row with no visible key giving zeros."""
    scores = q @ k.transpose(-2, -1) * scale + indexed(u, span.offset(0), span.lq, span.lk)
    if causal:
        mask = torch.ones(span.lq, span.lk, dtype=torch.bool).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0) @ v


CASES = every_combination(
    ["bidirectional", "causal", "padded", "a row with no key", "one query", "a query block"],
    [None, 3],
    [False, True],
    [None, 2],
)


@pytest.mark.parametrize("case,chunk,small_blocks,far", CASES)
def test_the_fused_path_is_the_textbook_formula_with_its_gradients(
    case, chunk, small_blocks, far, monkeypatch
):
    """With `far`, u is a table's entry per distance clamped to [−far, far] (as T5's last
    buckets), and its gradient is read per distance on a band below far only."""
    if small_blocks:  # u's gradient from scores recomputed a few rows at a time
        monkeypatch.setattr(distance, "SCORE_BLOCK", 10)
    g = torch.Generator().manual_seed(0)
    b, h, lk, d = 3, 2, 13, 4
    lq = {"one query": 1, "a query block": 5}.get(case, lk)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    q, k, v = make(b, h, lq, d), make(b, h, lk, d), make(b, h, lk, d)
    span = Span(lk - lq, lq, 0, lk)  # the last queries, as in cached decoding
    if far is None:
        table = u = make(h, lq + lk - 1)
    else:
        table = make(h, 2 * far + 1)
        u = table[:, span.distances(torch.device("cpu")).clamp(-far, far) + far]
    mask = None
    if case in ("padded", "a row with no key"):
        mask = torch.ones(b, 1, 1, lk, dtype=torch.bool)
        mask[1, ..., -3:] = False
        mask[0, ..., :2] = False
        if case == "a row with no key":
            mask[2] = False
    causal = case == "causal"
    out = distance_attention(q, k, v, DistanceScores(u, span, far), mask, causal, 0.4, chunk)
    expected = textbook(q, k, v, u, span, mask, causal, 0.4)
    torch.testing.assert_close(out, expected)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v, table), grad, retain_graph=True)
    for ours, theirs in zip(
        got, torch.autograd.grad(expected, (q, k, v, table), grad), strict=True
    ):
        torch.testing.assert_close(ours, theirs)
    if case == "a row with no key":
        assert torch.equal(out[2], torch.zeros_like(out[2]))


def test_the_band_is_used_where_it_pays(monkeypatch):
    """Self-attention longer than 4·far reads u's gradient on the band and the far sides."""
    calls = []
    far_gradients = distance._far_gradients
    monkeypatch.setattr(distance, "_far_gradients", lambda *a: calls.append(1) or far_gradients(*a))
    q, k, v = (torch.randn(1, 2, 12, 4, requires_grad=True) for _ in range(3))
    u = torch.randn(2, 23, requires_grad=True)
    for length, far in ((12, 2), (12, 3)):
        out = distance_attention(q, k, v, DistanceScores(u, Span(0, length, 0, length), far),
                                 None, False, 0.5, None)  # fmt: skip
        out.sum().backward()
    assert calls == [1], "12 keys: the band for far = 2, not for far = 3"


def test_a_causal_term_is_never_read_past_the_diagonal():
    """In a causal stack u at distances above 0 gets no gradient and changes nothing."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    span = Span(0, 6, 0, 6)
    u = torch.randn(2, 11, dtype=torch.float64, requires_grad=True)
    out = distance_attention(q, k, v, DistanceScores(u, span), None, True, 0.5, 2)
    changed = u.detach().clone()
    changed[:, span.offset(0) + 1 :] = 1e6
    again = distance_attention(q, k, v, DistanceScores(changed, span), None, True, 0.5, 2)
    torch.testing.assert_close(again, out)
    (grad,) = torch.autograd.grad(out.square().sum(), u)
    assert torch.equal(grad[:, span.offset(0) + 1 :], torch.zeros(2, 5, dtype=torch.float64))


def test_spans_are_found_for_consecutive_positions_only():
    pos = torch.arange(8)
    span = distance_span(pos[5:], pos)
    assert (span.q0, span.lq, span.k0, span.lk, span.d_min) == (5, 3, 0, 8, -7)
    assert distance_span(torch.tensor([0, 2, 3]), pos) is None
    assert distance_span(pos, torch.tensor([1, 4])) is None
    assert distance_span(pos[3:4], pos[:4]) is not None  # one query: cached decoding


def spy_on_fused_path(monkeypatch) -> list[int]:
    calls: list[int] = []

    def spy(*args, **kwargs):
        calls.append(1)
        return distance_attention(*args, **kwargs)

    monkeypatch.setattr(core, "distance_attention", spy)
    return calls


@pytest.mark.parametrize("pe,causal", every_combination(DISTANCE_PES, [False, True]))
def test_softmax_with_a_distance_term_takes_the_fused_path_and_agrees_with_the_plain_one(
    pe, causal, monkeypatch
):
    torch.manual_seed(0)
    parts = make_parts(small_variant("pe", pe), "softmax", "dot").double()
    g = torch.Generator().manual_seed(1)
    b, n = 3, 7
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    x = make(b, n, SHAPE.d_model)
    q, k, v = (make(b, SHAPE.n_heads, n, SHAPE.head_dim) for _ in range(3))
    padding = torch.zeros(b, n, dtype=torch.bool)
    padding[1, -2:] = True
    pos = torch.arange(n)
    mask = attention_mask(pos, pos, padding, causal)
    calls = spy_on_fused_path(monkeypatch)
    results = []
    for compute in (Compute(chunk=3), Compute(fast=False)):
        out = attend(parts, 1, x, q, k, v, pos, pos, mask, compute)
        wrt = [q, k, v, *parts.parameters()]
        results.append((out, torch.autograd.grad(out.square().sum(), wrt, allow_unused=True)))
    assert calls == [1], "the fused path ran once, the plain path never"
    (fused, fused_grads), (plain, plain_grads) = results
    torch.testing.assert_close(fused, plain)
    for ours, theirs in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("reason", ["another normalizer", "dropout", "drawn positions"])
def test_the_fused_path_is_not_taken_where_it_would_not_be_exact(reason, monkeypatch):
    pe = small_variant("pe", "t5")
    parts = make_parts(pe, "relu2" if reason == "another normalizer" else "softmax", "dot")
    q, k, v = (torch.randn(2, SHAPE.n_heads, 5, SHAPE.head_dim) for _ in range(3))
    x = torch.randn(2, 5, SHAPE.d_model)
    pos = torch.arange(5)
    q_pos = torch.tensor([0, 2, 3, 7, 9]) if reason == "drawn positions" else pos
    compute = Compute(dropout=0.1 if reason == "dropout" else 0.0)
    calls = spy_on_fused_path(monkeypatch)
    attend(parts, 0, x, q, k, v, q_pos, q_pos, None, compute)
    assert calls == []


@pytest.mark.parametrize("pe", DISTANCE_PES)
def test_the_term_at_drawn_positions_is_the_term_of_each_pair(pe):
    """Positions that are not consecutive (pe=randomized) get b_h(p_j − p_i) per pair."""
    torch.manual_seed(0)
    encoding = make_parts(small_variant("pe", pe)).pe.double()
    q_pos, k_pos = torch.tensor([1, 4, 5, 11]), torch.tensor([0, 3, 4, 9, 12])
    rel = k_pos[None, :] - q_pos[:, None]
    expected = torch.stack([encoding.distance_term(r) for r in rel], 1)  # [H, Lq, Lk]
    torch.testing.assert_close(encoding.score_bias(None, None, q_pos, k_pos, 0)[0], expected)


def test_evaluation_attends_in_query_blocks_too():
    """Without gradients, a variant no fused kernel computes attends `chunk` queries at a
    time (no [L, L] scores of the whole sequence), with the whole sequence's result."""
    torch.manual_seed(0)
    parts = make_parts(small_variant("pe", "fire"), "l2", "dot").double()
    q, k, v = (
        torch.randn(2, SHAPE.n_heads, 10, SHAPE.head_dim, dtype=torch.float64) for _ in "qkv"
    )
    x = torch.randn(2, 10, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(10)
    seen = []
    normalize = parts.norm.forward
    parts.norm.forward = lambda scores, mask, layer, state: (
        seen.append(scores.shape[-2]) or normalize(scores, mask, layer, state)
    )
    with torch.no_grad():
        blocks = attend(parts, 0, x, q, k, v, pos, pos, None, Compute(chunk=4))
        whole = attend(parts, 0, x, q, k, v, pos, pos, None, Compute())
    torch.testing.assert_close(blocks, whole)
    assert seen == [4, 4, 2, 10]
