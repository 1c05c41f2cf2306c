"""The positional-encoding interface: five optional hooks, each a no-op here.

A variant overrides only the hooks it needs (`q`, `k`: [B, H, L, d_h]; positions: [L]):

    embed(x, pos)                 add to the token embeddings            (learned, sinusoidal)
    rotate(x, pos)                transform q and k before q·k           (rope)
    rotate_key(x, pos)            k's transform, where it is not q's     (xpos); `rotate` here
    scale(head_dim)               factor on q·k, 1/√d_h by default       (deberta: 1/√(3 d_h))
    score_bias(q, k, ...)         add a term to the scores, before the normalizer
                                  (t5, alibi: content-free; shaw, xl, deberta: content-dependent)
    reweight(weights, ...)        transform the normalized matrix        (urpe)
    value_term(weights, ...)      add a term to the output               (shaw's a^V)
    data_term(q, k, data, ...)    add a term computed from the tokens    (fox: forget gates)
    begin(length, device, drawn)  start a forward pass: state its hooks share (randomized)
    without_dot_product()         the synthesizer computes no q·k: drop what acts through it (pope)

`score_bias`, `value_term` and `data_term` return None when they add nothing. A variant whose
positions are computed from the data (`data_width` > 0) gets, per layer, `data_width`
channels a head projected from the layer's input at every key ([B, H, Lk, data_width], the
cache's keys included: `data_term`'s `data`); the projection belongs to the layer, what the
channels mean to the variant. Relative positions are
built from the absolute `q_pos` and `k_pos`, so the same code serves full sequences,
cached decoding (one query at position t) and cross-attention.

What a variant does is declared in class attributes (`embeds`, `rotates`, `adds_score_terms`,
`post_normalization`, `reweights`, `needs_query`, `needs_key`, `flex`), which the attention
core reads to choose how to compute; a test checks each declaration against what the hooks do. A
variant defined for causal self-attention only says why in `causal_only`, and building it
for a bidirectional stack or cross-attention is refused with that reason.
A variant whose score term FlexAttention can compute from positions and small tables
(t5, alibi, kerple, shaw's key term) sets `flex` and gives that term as a `score_mod` too.
A term of the distance j − i alone subclasses `DistanceTerm` and gives `distance_term`, its
values over a vector of distances: `score_bias`, `score_mod` and `distance_scores` (the
per-distance form the attention core's CPU kernel path takes) follow from it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.attention.distance import DistanceScores, distance_span
from attnlab.shape import StackShape, check_causal_only
from attnlab.tensors import float64_home

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""FlexAttention's score_mod: (score, batch, head, query index, key index) -> score."""


class PositionalEncoding(nn.Module):
    max_len: int | None = None  # positions must be < max_len; None: unbounded
    max_len_option = "max_len"  # the option that sets max_len, for error messages
    embeds = False  # embed adds to the token embeddings (an absolute PE)
    rotates = False  # rotate changes q and k
    adds_score_terms = False  # score_bias returns a term (then no fused SDPA kernel holds it)
    post_normalization = False  # reweight or value_term acts: no SDPA path at all
    reweights = False  # reweight acts: the weights themselves change, no kernel forms P·v
    needs_query = False  # score_bias reads q
    needs_key = False  # score_bias reads k
    flex = False  # score_mod gives score_bias's term to FlexAttention
    causal_only: str | None = None  # why it is defined for causal self-attention only
    replaces_dot: str | None = None  # what it puts in q·k's place: no mixture may weigh q·k
    data_width = 0  # channels a head that data_term reads, projected from the layer's input
    # options that change no weight, so eval.py and generate may set them on a trained model
    evaluation_options: tuple[str, ...] = ()
    # attributes holding an entry for each layer of the stack (attnlab.shape.per_layer_parameters)
    per_layer: tuple[str, ...] = ()

    def __init__(self, shape: StackShape) -> None:
        super().__init__()
        check_causal_only(self, shape, "without model.cross_pe, or choose another pe")
        self.shape = shape

    @property
    def acts_in_attention(self) -> bool:
        """Whether it does anything inside attention (cross-attention has no `embed`)."""
        return (
            self.rotates or self.adds_score_terms or self.post_normalization or self.data_width > 0
        )

    def begin(self, length: int, device: torch.device, drawn: Tensor | None) -> Tensor | None:
        """Called by the stack on its PE, and on every PE inside it, once per forward pass
        before any other hook: the pass covers positions 0..length−1 (a decoding session's:
        every position it will use), and `drawn` is what this returned at the session's
        first step (None for a new pass or session). Returns what every hook and layer of
        the pass must share, for the stack to hand back at the session's later steps
        (randomized's sampled positions); nothing here."""
        return None

    def without_dot_product(self) -> None:
        """Called by the attention parts where the synthesizer computes no q·k, before any
        pass: a variant whose parameters act through `rotate` and `rotate_key` alone (pope's
        phase bias) drops them, since a parameter without a gradient stops DDP; nothing here."""

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        return x

    def rotate_key(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.rotate(x, pos)

    def scale(self, head_dim: int) -> float:
        return head_dim**-0.5

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        return None

    def score_mod(self, q: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int) -> ScoreMod:
        """`score_bias` as a FlexAttention score_mod, for variants that set `flex`."""
        raise NotImplementedError(f"{type(self).__name__} gives no score_mod")

    def distance_scores(self, q_pos: Tensor, k_pos: Tensor) -> DistanceScores | None:
        """`score_bias`'s whole term as a vector [H, R] over the distances of a span, where it
        is a term of j − i alone over consecutive positions (`DistanceTerm`); None here."""
        return None

    def reweight(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return weights

    def value_term(
        self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        return None

    def data_term(
        self,
        q: Tensor | None,
        k: Tensor | None,
        data: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        layer: int,
    ) -> Tensor | None:
        """A term [B, H, Lq, Lk] added to the scores from `data` [B, H, Lk, data_width], the
        channels projected from the layer's input at every key (see the module docstring)."""
        return None


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """[Lq, Lk] matrix of j − i (key minus query; T5/Shaw convention, negative = past)."""
    return k_pos[None, :] - q_pos[:, None]


def gather_relative(table_scores: Tensor, index: Tensor) -> Tensor:
    """Pick, for each (i, j), column index[i, j] of table_scores [..., Lq, R] -> [..., Lq, Lk]."""
    expanded = index.expand(*table_scores.shape[:-2], *index.shape)
    return torch.gather(table_scores, -1, expanded)


def angles(pos: Tensor, dim: int, base: float) -> Tensor:
    """[L, dim/2] angles p·base^(−2i/dim) of sinusoidal tables (sinusoidal, xl, rope), in
    float64 so that long positions keep their precision, on `float64_home(pos.device)`."""
    pos = pos.to(float64_home(pos.device), torch.float64)
    frequencies = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)
    return pos[:, None] * frequencies[None, :]


class DistanceTerm(PositionalEncoding):
    """A score term b_h(j − i) of the distance alone (t5, alibi, kerple): a subclass gives
    `distance_term`, b over a vector of distances, and gets `score_bias` and `score_mod`.
    Over consecutive positions the term is computed once per distance and expanded
    (`attnlab.attention.distance`); on the CPU, softmax attention then takes the fused kernel
    with the term as its mask."""

    adds_score_terms = True
    flex = True
    far: int | None = None  # b_h is one value at every d ≥ far and one at every d ≤ −far

    def distance_term(self, distances: Tensor) -> Tensor:
        """[H, R] b_h(d) of each distance d in `distances` [R] (integers, key minus query)."""
        raise NotImplementedError

    def distance_scores(self, q_pos: Tensor, k_pos: Tensor) -> DistanceScores | None:
        span = distance_span(q_pos, k_pos)
        if span is None:
            return None
        return DistanceScores(self.distance_term(span.distances(q_pos.device)), span, self.far)

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """[1, H, Lq, Lk], the same for every layer."""
        scores = self.distance_scores(q_pos, k_pos)
        if scores is None:  # not consecutive (randomized positions): one value per (i, j)
            rel = relative_positions(q_pos, k_pos)
            return self.distance_term(rel.flatten()).view(-1, *rel.shape)[None]
        return scores.expanded()[None]

    def score_mod(self, q: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int) -> ScoreMod:
        """Reads b_h(j − i) from the vector over every distance between the positions."""
        low = int(k_pos.min() - q_pos.max())
        high = int(k_pos.max() - q_pos.min())
        term = self.distance_term(torch.arange(low, high + 1, device=q_pos.device))

        def add_term(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score + term[h, k_pos[j] - q_pos[i] - low]

        return add_term
