"""Relative position representations (Shaw, Uszkoreit, Vaswani, NAACL 2018, arXiv 1803.02155).

    scores_ij = q_i·(k_j + a^K_ij)/√d_h        o_i = Σ_j weights_ij (v_j + a^V_ij)
    a^K_ij = w^K[clip(j − i, −K, K) + K]       a^V_ij = w^V[clip(j − i, −K, K) + K]

Conventions, as in tensor2tensor (`dot_product_attention_relative`, `transformer_relative`):
relative position j − i (key minus query, negative = past), clipped to ±K with K =
`max_relative_position` (default 20); one table pair w^K [2K+1, d_h], w^V [2K+1, d_v] per
layer, shared across heads (T2T's tables have no head dimension); the key term is scaled by
1/√d_h like q·k; tables initialized Glorot-uniform (T2T's `uniform_unit_scaling`, i.e.
variance scaling, fan_avg, gain 1). No absolute PE is added (T2T sets `pos=None`).

No [Lq, Lk, d] tensor is formed: the key term gathers q·(w^K)ᵀ [B, H, Lq, 2K+1] at
clip(j − i) + K, and the value term sums the weights of each query into 2K+1 buckets before
multiplying by w^V. The value term acts after the normalizer, so it needs the plain path;
`value_term=False` (key-only Shaw) keeps the fused SDPA path, or on CUDA FlexAttention,
which reads q·(w^K)ᵀ at clip(j − i) + K per (i, j) (`score_mod`). The value term adds
Σ_j weights_ij a^V_ij, which varies with i even when all v_j are equal: unlike score-only
relative PEs, it can solve the position probe (Su 2022, kexue.fm/archives/9105).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, ScoreMod, gather_relative, relative_positions
from attnlab.shape import StackShape


def clipped_index(q_pos: Tensor, k_pos: Tensor, max_relative_position: int) -> Tensor:
    """[Lq, Lk] table row clip(j − i, −K, K) + K for each query i and key j."""
    k = max_relative_position
    return relative_positions(q_pos, k_pos).clamp(-k, k) + k


def bucket_sums(weights: Tensor, index: Tensor, n_buckets: int) -> Tensor:
    """[..., Lq, n_buckets]: for each query, the sum of weights [..., Lq, Lk] in each bucket."""
    sums = weights.new_zeros(*weights.shape[:-1], n_buckets)
    return sums.scatter_add(-1, index.expand_as(weights), weights)


def glorot_table(rows: int, width: int) -> nn.Parameter:
    table = torch.empty(rows, width)
    nn.init.xavier_uniform_(table)
    return nn.Parameter(table)


class ShawPE(PositionalEncoding):
    adds_score_terms = True
    needs_query = True
    flex = True
    per_layer = ("w_k", "w_v")

    def __init__(self, shape: StackShape, max_relative_position: int, value_term: bool) -> None:
        super().__init__(shape)
        if max_relative_position < 1:
            raise ConfigError(
                f"pe.max_relative_position={max_relative_position} must be at least 1 "
                "(the largest distance |j − i| with its own embedding; T2T uses 20)"
            )
        self.max_relative_position = max_relative_position
        self.post_normalization = value_term
        rows = 2 * max_relative_position + 1
        self.w_k = nn.ParameterList(
            glorot_table(rows, shape.head_dim) for _ in range(shape.n_layers)
        )
        self.w_v = (
            nn.ParameterList(glorot_table(rows, shape.value_dim) for _ in range(shape.n_layers))
            if value_term
            else None
        )

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        index = clipped_index(q_pos, k_pos, self.max_relative_position)
        return gather_relative(self.key_terms(q, layer), index)

    def key_terms(self, q: Tensor | None, layer: int) -> Tensor:
        """q·(w^K)ᵀ/√d_h [B, H, Lq, 2K+1]: each query's key term at every clipped distance."""
        assert q is not None
        return torch.matmul(q * self.scale(q.shape[-1]), self.w_k[layer].t())

    def score_mod(self, q: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int) -> ScoreMod:
        q_w, k = self.key_terms(q, layer), self.max_relative_position

        def add_key_term(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score + q_w[b, h, i, (k_pos[j] - q_pos[i]).clamp(-k, k) + k]

        return add_key_term

    def value_term(
        self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        if self.w_v is None:
            return None
        w_v = self.w_v[layer]
        index = clipped_index(q_pos, k_pos, self.max_relative_position)
        return torch.matmul(bucket_sums(weights, index, w_v.shape[0]), w_v)
