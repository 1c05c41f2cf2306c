"""What each positional encoding declares it does, checked against what its hooks do.

The attention core chooses its path (SDPA, FlexAttention, plain) from these declarations
alone, so a wrong one would silently compute something else or lose a fused kernel.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, small_variant

from attnlab.config.build import build, own_class
from attnlab.config.options import options, variant
from attnlab.pe.base import PositionalEncoding

LENGTH = 6
BASES = {
    "rope": variant("pe", "rope"),
    "none": variant("pe", "none"),
    "shaw": variant("pe", "shaw", "value_term=false"),
}
VARIANTS = {
    **{pe: small_variant("pe", pe) for pe in options("pe")},
    "shaw key only": variant("pe", "shaw", "value_term=false"),
    **{f"urpe of {name}": {**variant("pe", "urpe"), "base": base} for name, base in BASES.items()},
}  # fmt: skip


def build_pe(name: str) -> PositionalEncoding:
    """The variant with its parameters moved off their initial values (URPE's C starts at
    ones, which would hide its reweighting)."""
    torch.manual_seed(0)
    node = VARIANTS[name]
    causal = bool(own_class(node["_target_"]).causal_only)  # bidirectional where it can be
    pe = build(node, shape=replace(SHAPE, causal=causal)).double()
    with torch.no_grad():
        for parameter in pe.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return pe


def heads(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, SHAPE.n_heads, LENGTH, SHAPE.head_dim, generator=g, dtype=torch.float64)


def score_term(pe: PositionalEncoding, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    pos = torch.arange(LENGTH)
    return pe.score_bias(q, k, pos, pos, 1)


def reads(pe: PositionalEncoding, which: int) -> bool:
    """Whether the score term changes when q (which=0) or k (which=1) changes."""
    q, k = heads(0), heads(1)
    changed = [q, k]
    changed[which] = heads(2)
    return not torch.allclose(score_term(pe, q, k), score_term(pe, *changed))


@pytest.mark.parametrize("name", VARIANTS)
def test_declared_capabilities_match_what_the_hooks_do(name):
    pe = build_pe(name)
    pos = torch.arange(LENGTH)
    x = heads(0)
    tokens = heads(4)[0].transpose(0, 1).flatten(1)  # [L, d_model]
    assert pe.embeds == (not torch.equal(pe.embed(tokens, pos), tokens))
    assert pe.rotates == (not torch.equal(pe.rotate(x, pos), x))
    term = score_term(pe, heads(0), heads(1))
    assert pe.adds_score_terms == (term is not None)
    if term is not None:
        assert pe.needs_query == reads(pe, 0)
        assert pe.needs_key == reads(pe, 1)
    weights = torch.softmax(heads(3)[..., :LENGTH], -1)
    reweighted = not torch.equal(pe.reweight(weights, pos, pos, 1), weights)
    value_term = pe.value_term(weights, pos, pos, 1) is not None
    assert pe.post_normalization == (reweighted or value_term)
    assert pe.reweights == reweighted
    data = heads(5)[..., :1].expand(-1, -1, -1, max(pe.data_width, 1))
    assert (pe.data_width > 0) == (pe.data_term(x, x, data, pos, pos, 1) is not None)
    terms = pe.rotates or pe.adds_score_terms or pe.post_normalization or pe.data_width > 0
    assert pe.acts_in_attention == terms


@pytest.mark.parametrize("name", VARIANTS)
def test_a_flex_variant_gives_its_score_term_as_a_score_mod_and_no_other_does(name):
    pe = build_pe(name)
    q, k = heads(0), heads(1)
    pos = torch.arange(LENGTH)
    if not pe.flex:
        with pytest.raises(NotImplementedError):
            pe.score_mod(q, pos, pos, 1)
        return
    score_mod = pe.score_mod(q, pos, pos, 1)
    term = score_term(pe, q, k).expand(2, SHAPE.n_heads, LENGTH, LENGTH)
    for b, h, i, j in [(0, 0, 0, 0), (1, 1, 2, 5), (0, 1, 5, 1), (1, 0, 3, 3)]:
        index = [torch.tensor(n) for n in (b, h, i, j)]
        zero = torch.zeros((), dtype=torch.float64)
        torch.testing.assert_close(score_mod(zero, *index), term[b, h, i, j])


def test_urpe_states_what_its_base_does():
    assert build_pe("urpe of rope").rotates and not build_pe("urpe of rope").adds_score_terms
    of_none = build_pe("urpe of none")
    assert not (of_none.rotates or of_none.adds_score_terms or of_none.needs_query)
    assert build_pe("urpe").adds_score_terms  # its default base, t5
    assert all(build_pe(name).post_normalization for name in VARIANTS if "urpe" in name)
