"""URPE, universal relative positional encoding (Luo et al., NeurIPS 2022, arXiv 2205.13401,
"Your Transformer May Not be as Powerful as You Expect").

    weights = normalize(scores) ⊙ C,   C^(h)_ij = c^(h)[j − i],   o_i = Σ_j weights_ij v_j

`scores` are those of a base relative PE (the `base` config node, any other PE option: T5 by
default, as the official code pairs URPE with a T5-style per-head bias table). C is Toeplitz
per head, so the rows of the weights no longer sum to 1: with identical tokens,
o_i = (Σ_j a_ij c[j − i]) v varies with i, which restores universal approximation and solves
the position probe (Luo et al. 2022, arXiv 2205.13401, §3; Su 2022, kexue.fm/archives/9105).

Conventions, as in the official code (lsj2408/URPE with --ur-attn-unique and
--constant-init-ur-attn): relative position j − i (key minus query, negative = past); one
entry per distance, a table c [2·max_len − 1, H] at row j − i + max_len − 1, shared by all
layers (the official encoder computes C once and passes it to every layer); initialized to
ones, so training starts exactly at the base PE's attention. C multiplies after the
normalizer and before attention dropout; masked keys already have weight 0, as the official
code zeroes C at padding. The bucketed C and --ur-attn-with-relu are not implemented.

URPE delegates embed, rotate, rotate_key, scale and score_bias to its base, builds the base
itself and declares what the base does (embeds, rotates, adds_score_terms, needs_query,
needs_key). It bounds positions to the smaller of its own max_len and the base's. Acting
after the normalizer, it always takes the plain path, never SDPA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config.build import build
from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, relative_positions
from attnlab.shape import StackShape


class URPE(PositionalEncoding):
    post_normalization = True
    reweights = True

    def __init__(self, shape: StackShape, base: Mapping[str, Any], max_len: int) -> None:
        super().__init__(shape)
        if max_len < 1:
            raise ConfigError(f"pe.max_len={max_len} must be at least 1 (URPE's tasks use 128)")
        self.base = build(base, shape=shape)
        if self.base.post_normalization:
            raise ConfigError(
                f"URPE's base {type(self.base).__name__} already acts after the normalizer "
                "(a reweight or value term): choose a base that only changes the scores, "
                "e.g. pe@pe.base=t5, or turn its post-normalization term off"
            )
        self.max_len = max_len
        if self.base.max_len is not None and self.base.max_len < max_len:
            self.max_len, self.max_len_option = (
                self.base.max_len,
                f"base.{self.base.max_len_option}",
            )
        self.embeds, self.rotates = self.base.embeds, self.base.rotates
        self.adds_score_terms = self.base.adds_score_terms
        self.needs_query, self.needs_key = self.base.needs_query, self.base.needs_key
        self.table = nn.Parameter(torch.ones(2 * self.max_len - 1, shape.n_heads))

    def without_dot_product(self) -> None:
        self.base.without_dot_product()

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.base.embed(x, pos)

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.base.rotate(x, pos)

    def rotate_key(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.base.rotate_key(x, pos)

    def scale(self, head_dim: int) -> float:
        return self.base.scale(head_dim)

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        return self.base.score_bias(q, k, q_pos, k_pos, layer)

    def toeplitz(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """C [H, Lq, Lk], C^(h)_ij = c^(h)[j − i]."""
        return self.table[relative_positions(q_pos, k_pos) + self.max_len - 1].permute(2, 0, 1)

    def reweight(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return weights * self.toeplitz(q_pos, k_pos)
