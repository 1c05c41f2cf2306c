"""Score terms that read q or k, and value terms, on the CPU kernel in blocks of queries
(`attention/term.py`): outputs and every gradient against the plain path in float64."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, every_combination, make_parts, small_variant

import attnlab.attention.core as core
import attnlab.attention.term as term
from attnlab.attention.core import Compute, attend
from attnlab.config.options import shrink, variant
from attnlab.model.transformer import attention_mask, exactly_causal

PES = {
    "shaw": small_variant("pe", "shaw"),
    "shaw, key term only": shrink(variant("pe", "shaw", "value_term=false")),
    "xl": small_variant("pe", "xl"),
    "deberta": small_variant("pe", "deberta"),
    "cope": small_variant("pe", "cope"),
    "t5 at drawn positions": small_variant("pe", "t5"),
}
CASES = ["whole", "padded", "a row with no key", "one query", "a query block"]


def spy_on_term_path(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = term.term_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "term_attention", spy)
    return calls


def run_both(pe: str, case: str, causal: bool):
    """(term path, plain path), each as (output, gradients in q, k, v and the parameters)."""
    torch.manual_seed(0)
    shape = replace(SHAPE, causal=causal)
    parts = make_parts(PES[pe], "softmax", "dot", shape).double()
    g = torch.Generator().manual_seed(1)
    b, n = 3, 9
    lq = {"one query": 1, "a query block": 4}.get(case, n)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    x = make(b, lq, SHAPE.d_model)
    q = make(b, SHAPE.n_heads, lq, SHAPE.head_dim)
    k, v = (make(b, SHAPE.n_heads, n, SHAPE.head_dim) for _ in "kv")
    k_pos = torch.tensor([0, 2, 3, 7, 9, 10, 14, 15, 19]) if "drawn" in pe else torch.arange(n)
    q_pos = k_pos[n - lq :]  # the last queries, as in cached decoding
    padding = None
    if case in ("padded", "a row with no key"):
        padding = torch.zeros(b, n, dtype=torch.bool)
        padding[1, -3:] = True
        if case == "a row with no key":
            padding[2] = True
    mask = attention_mask(q_pos, k_pos, padding, causal)
    is_causal = exactly_causal(q_pos, k_pos, padding, causal)
    results = []
    for compute in (Compute(chunk=2), Compute(fast=False)):
        out = attend(parts, 1, x, q, k, v, q_pos, k_pos, mask, compute, is_causal)
        wrt = [q, k, v, *parts.parameters()]
        grads = torch.autograd.grad(out.square().sum(), wrt, allow_unused=True)
        results.append((out, grads))
    return results


@pytest.mark.parametrize("small_blocks", [False, True])
@pytest.mark.parametrize(
    "pe,case,causal",
    [
        pytest.param(*p.values, marks=p.marks)
        for p in every_combination(PES, CASES, [False, True])
        if p.values[2] or p.values[0] != "cope"  # CoPE is causal only
    ],
)
def test_the_term_path_is_the_plain_path_with_its_gradients(
    pe, case, causal, small_blocks, monkeypatch
):
    if small_blocks:  # blocks of a query or two
        monkeypatch.setattr(term, "TERM_BLOCK", 40)
    calls = spy_on_term_path(monkeypatch)
    (ours, our_grads), (plain, plain_grads) = run_both(pe, case, causal)
    assert calls == ([] if case == "one query" else [1]), "the term path ran for > chunk queries"
    torch.testing.assert_close(ours, plain)
    for mine, theirs in zip(our_grads, plain_grads, strict=True):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            torch.testing.assert_close(mine, theirs)


def test_blocks_hold_term_block_scores_and_a_causal_block_sees_keys_to_its_last_query():
    pe = make_parts(PES["shaw"]).pe
    pos = torch.arange(10)
    plan = term.TermPlan(pe, 0, pos, pos, None, True, 1.0, None)
    q = torch.zeros(2, 2, 10, 4)
    blocks = plan.blocks(q, 10)
    assert [(r.start, r.stop, n) for r, n in blocks] == [(0, 10, 10)]
    term_block = term.TERM_BLOCK
    try:
        term.TERM_BLOCK = 2 * 2 * 10 * 3  # three rows of ten keys, batch 2, 2 heads
        blocks = plan.blocks(q, 10)
    finally:
        term.TERM_BLOCK = term_block
    assert [(r.start, r.stop, n) for r, n in blocks] == [
        (0, 3, 3),
        (3, 6, 6),
        (6, 9, 9),
        (9, 10, 10),
    ]
    chunked = replace(plan, chunk=4, causal=False)  # at most chunk queries, whatever fits
    assert [(r.start, r.stop, n) for r, n in chunked.blocks(q, 10)] == [
        (0, 4, 10),
        (4, 8, 10),
        (8, 10, 10),
    ]


@pytest.mark.parametrize(
    "reason",
    [
        "nothing",
        "another normalizer",
        "dropout",
        "a reweighting pe",
        "a synthesizer",
        "chunk queries or fewer",
    ],
)
def test_the_term_path_is_taken_for_long_softmax_alone(reason, monkeypatch):
    pe = small_variant("pe", "urpe" if reason == "a reweighting pe" else "xl")
    norm = "relu2" if reason == "another normalizer" else "softmax"
    synthesizer = "dense" if reason == "a synthesizer" else "dot"
    parts = make_parts(pe, norm, small_variant("synthesizer", synthesizer))
    q, k, v = (torch.randn(2, SHAPE.n_heads, 5, SHAPE.head_dim) for _ in range(3))
    x = torch.randn(2, 5, SHAPE.d_model)
    pos = torch.arange(5)
    chunk = 5 if reason == "chunk queries or fewer" else 4
    compute = Compute(dropout=0.1 if reason == "dropout" else 0.0, chunk=chunk)
    calls = spy_on_term_path(monkeypatch)
    attend(parts, 0, x, q, k, v, pos, pos, None, compute)
    assert calls == ([1] if reason == "nothing" else [])
