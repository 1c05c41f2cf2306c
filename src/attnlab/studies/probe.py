"""What theory predicts for the position probe: can a configuration tell positions apart?

The probe's input is n identical tokens (Su 2022, "a theoretical flaw of relative position
encodings"). Without anything that differs by position, every token gets the same output
in every layer, so a sequence of length n has at most one position right: token accuracy
is at most (number of sequences) / (number of tokens), whole-sequence accuracy at most
that of the length-1 sequence. A configuration tells positions apart when one of these
breaks the symmetry:

- an absolute PE (`embeds`): each position gets its own input vector;
- a term after the normalizer (Shaw's value term, URPE's reweighting): output i sums
  position-dependent terms over the offsets j − i that exist for i;
- a relative PE inside attention (rotation, score terms) with [CLS]/[SEP] markers: the
  weights on the markers' different values depend on the distances to them;
- a relative PE with a normalizer whose rows do not sum to 1: the row sums depend on
  which offsets j − i exist, so the output is a different multiple of the common value
  (unless every row sums to one fixed number whatever its scores: 1 − λ under differential
  attention);
- a causal mask with markers (the share of [CLS] depends on i), or with a normalizer whose
  row sum over i equal scores depends on i (√i for exp-L2, i·e^s for exp).

Under softmax, rows sum to 1, so weights on identical values give the same output
whatever the scores: score-only PEs (RoPE, T5, ALiBi, XL, DeBERTa) cannot solve the probe.
The prediction reads the variants' declarations and evaluates the normalizer on ideal
rows; it covers the dot-product synthesizer, the one the probe studies use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnlab.config.build import build
from attnlab.errors import ConfigError
from attnlab.norm.base import Normalizer
from attnlab.shape import StackShape

SHAPE = StackShape(d_model=16, n_heads=2, head_dim=8, value_dim=8, n_layers=1, causal=False)
KEYS = 6  # keys of the ideal rows the normalizer is evaluated on


@dataclass(frozen=True)
class Prediction:
    distinguishes: bool  # whether outputs can differ between positions
    why: str


def row_sums(norm: Normalizer) -> torch.Tensor:
    """The row sums [2, H, KEYS] of two draws of random scores, for every head of SHAPE (a
    normalizer may combine heads)."""
    scores = torch.randn(2, SHAPE.n_heads, KEYS, KEYS, generator=torch.Generator().manual_seed(0))
    return norm(scores.double(), None, 0).sum(-1)


def rows_sum_to_one(norm: Normalizer) -> bool:
    sums = row_sums(norm)
    return torch.allclose(sums, torch.ones_like(sums))


def fixed_row_sums(norm: Normalizer) -> bool:
    """Whether each head's rows sum to one number whatever their scores."""
    sums = row_sums(norm)
    return torch.allclose(sums, sums[:1, :, :1].expand_as(sums))


def sum_depends_on_count(norm: Normalizer) -> bool:
    """Whether a row of i equal scores (a causal row of identical tokens) sums to a value
    that changes with i."""
    scores = torch.full((1, SHAPE.n_heads, KEYS, KEYS), 0.5, dtype=torch.float64)
    causal = torch.ones(KEYS, KEYS, dtype=torch.bool).tril()
    sums = norm(scores, causal, 0).sum(-1).flatten()
    return not torch.allclose(sums, sums[0].expand_as(sums))


def predict(
    pe: Mapping[str, Any],
    norm: Mapping[str, Any],
    synthesizer: Mapping[str, Any],
    markers: bool,
    causal: bool,
) -> Prediction:
    """The prediction for one probe configuration; `pe`, `norm` and `synthesizer` are
    config nodes."""
    if not build(synthesizer, shape=SHAPE).plain_dot:
        raise ConfigError(
            f"the probe's prediction covers synthesizer=dot only, not "
            f"synthesizer={synthesizer.get('name')}: compare such runs with kind configurations"
        )
    shape = replace(SHAPE, causal=causal)
    encoding, normalizer = build(pe, shape=shape), build(norm, shape=shape)
    stochastic = rows_sum_to_one(normalizer)
    fixed = stochastic or fixed_row_sums(normalizer)
    if encoding.embeds:
        return Prediction(True, "absolute PE: each position gets its own input vector")
    if normalizer.reads_order and not stochastic:  # rows summing to 1 average equal values
        return Prediction(True, "the normalizer's weights and their sums depend on the keys' order")
    if encoding.post_normalization:
        return Prediction(True, "a term after the normalizer depends on the offsets j − i")
    if causal and markers:
        return Prediction(True, "causal: the share of [CLS] depends on the visible keys")
    if causal and sum_depends_on_count(normalizer):
        return Prediction(True, "causal: the row sum depends on the number of visible keys")
    if encoding.acts_in_attention and markers:
        return Prediction(True, "relative PE: the distances to [CLS] and [SEP] differ")
    if encoding.acts_in_attention and not fixed:
        return Prediction(True, "rows do not sum to 1: their sums depend on which j − i exist")
    if not encoding.acts_in_attention and not causal:
        return Prediction(False, "no position information: the tokens are interchangeable")
    if stochastic:
        return Prediction(False, "rows sum to 1 over identical values: equal outputs")
    if fixed:
        return Prediction(False, "each row sums to the same number over identical values")
    return Prediction(False, "causal: every row sums to the same over identical values")


def chance_bound(lengths: range) -> float:
    """The best token accuracy when every position of a sequence gets the same output."""
    return len(lengths) / sum(lengths)
