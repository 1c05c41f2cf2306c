"""The attention core: the fused SDPA path and the plain path compute the same thing."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import SHAPE, dot_replaced_in_a_mixture, every_combination, make_parts, small_variant

from attnlab.attention.core import Compute, attend, flex_path
from attnlab.config.build import own_class
from attnlab.config.options import causal_only, options, variant
from attnlab.model.transformer import attention_mask, exactly_causal


def inputs(shape=SHAPE, batch=3, length=7, seed=0):
    """x, q, k, v in float64 with requires_grad, and a padded batch (row 1 has 2 pads)."""
    g = torch.Generator().manual_seed(seed)
    h, d, dv = shape.n_heads, shape.head_dim, shape.value_dim
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    x = make(batch, length, shape.d_model)
    q, k, v = make(batch, h, length, d), make(batch, h, length, d), make(batch, h, length, dv)
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1, -2:] = True
    return x, q, k, v, padding


def both_paths(parts, causal: bool, padding_override=None):
    x, q, k, v, padding = inputs()
    if padding_override is not None:
        padding = padding_override
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, padding, causal)
    results = []
    for fast in (True, False):
        out = attend(parts, 1, x, q, k, v, pos, pos, mask, Compute(fast=fast))
        wrt = [q, k, v, *parts.parameters()]
        grads = torch.autograd.grad(out.square().sum(), wrt, allow_unused=True)
        results.append((out, grads))
    return results


def takes_fast_path(pe: str, synthesizer: str) -> bool:
    parts = make_parts(
        small_variant("pe", pe), "softmax", small_variant("synthesizer", synthesizer)
    )
    pos = torch.arange(2)
    return (
        parts.fast()
        and parts.synthesizer(torch.zeros(1, 2, SHAPE.d_model), pos, pos, 0).dot is not None
    )


FAST_COMBINATIONS = [
    (pe, synthesizer)
    for pe, synthesizer in itertools.product(options("pe"), options("synthesizer"))
    if not dot_replaced_in_a_mixture(pe, synthesizer) and takes_fast_path(pe, synthesizer)
]


def assert_paths_agree(parts, causal: bool) -> None:
    (fast_out, fast_grads), (plain_out, plain_grads) = both_paths(parts, causal)
    torch.testing.assert_close(fast_out, plain_out)
    for fast_grad, plain_grad in zip(fast_grads, plain_grads, strict=True):
        torch.testing.assert_close(fast_grad, plain_grad)  # None on both when a part is unused


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pe,synthesizer", FAST_COMBINATIONS)
def test_fast_path_equals_plain_path(pe, synthesizer, causal):
    torch.manual_seed(0)
    assert_paths_agree(make_parts(pe, "softmax", synthesizer).double(), causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "norm", [n for n in options("norm") if own_class(variant("norm", n)["_target_"]).sdpa]
)
def test_a_normalizer_that_takes_the_fused_kernel_gives_the_plain_paths_output(norm, causal):
    """A normalizer declaring `sdpa` is softmax for the fused kernel: a subclass of softmax
    that changes the weights and keeps the flag is caught here."""
    torch.manual_seed(0)
    parts = make_parts("rope", norm, "dot").double()
    assert parts.fast()
    assert_paths_agree(parts, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_key_only_shaw_takes_the_fast_path_with_the_same_outputs_and_gradients(causal):
    torch.manual_seed(0)
    parts = make_parts(variant("pe", "shaw", "value_term=false"), "softmax", "dot").double()
    assert parts.fast()
    assert_paths_agree(parts, causal)


def test_the_fast_path_is_taken_wherever_sdpa_is_exact_and_faster():
    fast_pes = {pe for pe, _ in FAST_COMBINATIONS}
    fast_synthesizers = {s for _, s in FAST_COMBINATIONS}
    assert fast_pes == set(options("pe")) - {"shaw", "urpe"}  # shaw's value term, urpe's C
    # no q·k, no SDPA: it is slower there than the plain path (see attnlab.attention.core)
    assert fast_synthesizers == {"dot", "random_vanilla", "dense_vanilla"}


@pytest.mark.parametrize("pe,synthesizer", FAST_COMBINATIONS)
def test_is_causal_equals_the_causal_mask_tensor(pe, synthesizer):
    """The flag that lets SDPA use its causal kernel gives the masked path's outputs and
    gradients in float64 (pes with a score term keep the tensor mask and ignore it)."""
    torch.manual_seed(0)
    parts = make_parts(pe, "softmax", synthesizer).double()
    x, q, k, v, _ = inputs()
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, None, causal=True)
    assert exactly_causal(pos, pos, None, causal=True)
    wrt = [q, k, v, *parts.parameters()]
    results = []
    for compute, is_causal in ((Compute(), True), (Compute(fast=False), False)):
        out = attend(parts, 1, x, q, k, v, pos, pos, mask, compute, is_causal)
        results.append((out, torch.autograd.grad(out.square().sum(), wrt, allow_unused=True)))
    (flag_out, flag_grads), (mask_out, mask_grads) = results
    torch.testing.assert_close(flag_out, mask_out)
    for flag_grad, mask_grad in zip(flag_grads, mask_grads, strict=True):
        torch.testing.assert_close(flag_grad, mask_grad)


def test_a_mask_is_exactly_causal_only_when_square_unpadded_and_causal():
    """Where `exactly_causal` holds, the mask is the lower triangle; padding, a cached prefix,
    one query or a bidirectional stack keep the tensor mask."""
    pos = torch.arange(5)
    assert torch.equal(attention_mask(pos, pos, None, True)[0, 0], torch.ones(5, 5).tril().bool())
    padding = torch.zeros(2, 5, dtype=torch.bool)
    assert not exactly_causal(pos, pos, padding, True)  # padded batches keep the tensor
    assert not exactly_causal(pos[2:], pos, None, True)  # new queries after a cached prefix
    assert not exactly_causal(pos[:1], pos[:1], None, True)
    assert not exactly_causal(pos, pos, None, False)


def test_fully_masked_rows_give_zeros_on_both_paths():
    parts = make_parts("none", "softmax", "dot").double()
    padding = torch.ones(3, 7, dtype=torch.bool)
    (fast_out, fast_grads), (plain_out, plain_grads) = both_paths(parts, False, padding)
    assert torch.equal(plain_out, torch.zeros_like(plain_out))
    torch.testing.assert_close(fast_out, plain_out)
    for grad in (*fast_grads[:3], *plain_grads[:3]):
        assert torch.isfinite(grad).all()


def test_the_plain_path_is_the_textbook_formula():
    parts = make_parts("none", "softmax", "dot").double()
    x, q, k, v, padding = inputs()
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, padding, causal=True)
    out = attend(parts, 0, x, q, k, v, pos, pos, mask, Compute(fast=False))
    scores = q @ k.transpose(-2, -1) / SHAPE.head_dim**0.5
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    "pe,norm,synthesizer,causal",
    [
        case
        for case in every_combination(
            options("pe"), options("norm"), options("synthesizer"), [False, True]
        )
        if case.values[3] or not causal_only(case.values[1], "norm")  # a causal-only norm
        if not dot_replaced_in_a_mixture(case.values[0], case.values[2])  # refused at build
    ],  # is refused in bidirectional stacks: only its causal cases
)
def test_attention_in_recomputed_query_blocks_equals_whole_sequence_attention(
    pe, norm, synthesizer, causal
):
    torch.manual_seed(0)
    nodes = [
        small_variant(g, o) for g, o in (("pe", pe), ("norm", norm), ("synthesizer", synthesizer))
    ]
    parts = make_parts(*nodes).double()
    x, q, k, v, padding = inputs()
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, padding, causal)
    results = []
    for chunk in (None, 3):
        out = attend(parts, 1, x, q, k, v, pos, pos, mask, Compute(chunk=chunk))
        wrt = [x, q, k, v, *parts.parameters()]
        results.append((out, torch.autograd.grad(out.square().sum(), wrt, allow_unused=True)))
    (whole, whole_grads), (blocks, block_grads) = results
    torch.testing.assert_close(blocks, whole)
    for block_grad, whole_grad in zip(block_grads, whole_grads, strict=True):
        torch.testing.assert_close(block_grad, whole_grad)


FLEX_PES = {
    "t5": small_variant("pe", "t5"),
    "alibi": small_variant("pe", "alibi"),
    "shaw key only": variant("pe", "shaw", "value_term=false"),
}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(
    "pe,queries,causal",
    every_combination(list(FLEX_PES), ["all", "a block"], [False, True], strength=1),
)
def test_flex_attention_computes_what_the_plain_path_computes(pe, queries, causal):
    torch.manual_seed(0)
    parts = make_parts(FLEX_PES[pe], "softmax", "dot").double()
    assert parts.flex()
    x, q, k, v, padding = (t.detach() for t in inputs())
    padding[2] = True  # a row of queries with no visible key
    k_pos = torch.arange(x.shape[1])
    q_pos = k_pos if queries == "all" else k_pos[2:6]
    x, q = x[:, q_pos], q[:, :, q_pos]
    mask = attention_mask(q_pos, k_pos, padding, causal)
    with torch.no_grad():  # FlexAttention has no backward pass on the CPU
        flex = flex_path(parts, 1, q, k, v, q_pos, k_pos, mask, compiled=False)
        plain = attend(parts, 1, x, q, k, v, q_pos, k_pos, mask, Compute(fast=False))
    torch.testing.assert_close(flex, plain)
    assert torch.equal(flex[2], torch.zeros_like(flex[2]))


def test_flex_attention_is_chosen_for_softmax_with_t5_alibi_or_shaws_key_term_only():
    chosen = {
        (pe, norm, synthesizer)
        for pe, norm, synthesizer in itertools.product(
            [*options("pe"), "shaw key only"], options("norm"), options("synthesizer")
        )
        if pe == "shaw key only" or not dot_replaced_in_a_mixture(pe, synthesizer)
        if make_parts(
            FLEX_PES.get(pe) or small_variant("pe", pe),
            norm,
            small_variant("synthesizer", synthesizer),
        ).flex()
    }
    assert chosen == {(pe, "softmax", "dot") for pe in ("t5", "alibi", "shaw key only", "kerple")}
