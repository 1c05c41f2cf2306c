"""The positional-encoding interface: five optional hooks, each a no-op here.

A variant overrides only the hooks it needs (`q`, `k`: [B, H, L, d_h]; positions: [L]):

    embed(x, pos)                 add to the token embeddings            (learned, sinusoidal)
    rotate(x, pos)                transform q and k before q·k           (rope)
    scale(head_dim)               factor on q·k, 1/√d_h by default       (deberta: 1/√(3 d_h))
    score_bias(q, k, ...)         add a term to the scores, before the normalizer
                                  (t5, alibi: content-free; shaw, xl, deberta: content-dependent)
    reweight(weights, ...)        transform the normalized matrix        (urpe)
    value_term(weights, ...)      add a term to the output               (shaw's a^V)

`score_bias` and `value_term` return None when they add nothing. Relative positions are
built from the absolute `q_pos` and `k_pos`, so the same code serves full sequences,
cached decoding (one query at position t) and cross-attention.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.shape import StackShape
from attnlab.tensors import float64_home


class PositionalEncoding(nn.Module):
    max_len: int | None = None  # positions must be < max_len; None: unbounded
    max_len_option = "max_len"  # the option that sets max_len, for error messages
    needs_query = False  # score_bias reads q
    needs_key = False  # score_bias reads k
    post_normalization = False  # reweight or value_term is active: no fused SDPA path

    def __init__(self, shape: StackShape) -> None:
        super().__init__()
        self.shape = shape

    def overrides(self, hook: str) -> bool:
        return getattr(type(self), hook) is not getattr(PositionalEncoding, hook)

    @property
    def adds_score_terms(self) -> bool:
        """Whether it adds to the scores (then they cannot stay inside a fused kernel)."""
        return self.overrides("score_bias")

    @property
    def acts_in_attention(self) -> bool:
        """Whether any hook besides `embed` does something (cross-attention has no embed)."""
        return any(map(self.overrides, ("rotate", "scale", "score_bias", "reweight", "value_term")))

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        return x

    def scale(self, head_dim: int) -> float:
        return head_dim**-0.5

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        return None

    def reweight(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return weights

    def value_term(
        self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
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
