"""DeBERTa disentangled attention (He et al., ICLR 2021, arXiv 2006.03654; v3 arXiv 2111.09543).

    scores_ij = [q_i·k_j + q_i·K^r_{δ(i,j)} + k_j·Q^r_{δ(i,j)}] / √(d_h·(1 + #terms))
    K^r = LN(P) W_{k,r} + b_{k,r}  (content-to-position, c2p)
    Q^r = LN(P) W_{q,r} + b_{q,r}  (position-to-content, p2c)

Conventions, as in the official code (microsoft/DeBERTa `disentangled_attention.py`,
`da_utils.py`):
- Relative position rel = i − j (query minus key: DeBERTa's sign, the opposite of T5's).
- δ(i,j) = clamp(bucket(rel) + k, 0, 2k − 1) indexes the table P [2k, d_model]. With
  `position_buckets` > 0 (v2/v3), k = position_buckets and bucket() is
  `make_log_bucket_position`: |rel| ≤ k/2 keeps its own row, larger distances are spaced
  logarithmically up to `max_relative_positions`, computed in float64 as the reference's
  numpy; beyond it the final clamp maps every distance to the edge rows. With
  position_buckets = 0 (v1), k = max_relative_positions and bucket(rel) = rel.
- p2c uses δ(i,j) like c2p, as both official versions and HF compute it; the paper writes
  δ(j,i) (microsoft/DeBERTa issue #162). The code's form is kept so checkpoints would load.
- The scale 1/√(d_h·(1 + #terms)), 1/√(3 d_h) for c2p and p2c, applies to q·k through the
  `scale` hook and to both position terms inside the bias. The p2p term (unused upstream)
  is not implemented.
- P and its LayerNorm (v2/v3 `norm_rel_ebd`, eps 1e-7) are shared by all layers; each layer
  has its own W_{k,r}, W_{q,r} with biases (v2 with share_att_key=false; v1 had no bias on
  W_{k,r}). v3's share_att_key=true, which reuses the content projections W_q, W_k, is not
  implemented. P and W init N(0, 0.02²) (BERT's initializer_range), biases 0. The official
  hidden dropout on P is not applied. No absolute position is added to the input
  (position_biased_input=false).

Efficient: only the table rows that some (i, j) uses are normalized and projected;
q·(K^r)ᵀ [B, H, Lq, R] and k·(Q^r)ᵀ [B, H, Lk, R] are gathered at δ, so no [Lq, Lk, d]
tensor is formed. The bias reads q and k, so a softmax stack still takes the SDPA path with
a per-batch [B, H, Lq, Lk] float mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, gather_relative, relative_positions
from attnlab.shape import StackShape
from attnlab.tensors import float64_home, linear, split_heads

TERMS = ("c2p", "p2c")


def log_bucket(rel: Tensor, buckets: int, max_position: int) -> Tensor:
    """DeBERTa v2/v3 `make_log_bucket_position`: rel itself while |rel| ≤ buckets/2, then
    sign(rel)·(mid + ⌈ln(|rel|/mid)/ln((max_position − 1)/mid)·(mid − 1)⌉), mid = buckets/2."""
    mid = buckets // 2
    device, rel = rel.device, rel.to(float64_home(rel.device))
    size = rel.abs()
    ratio = torch.log(size.clamp_min(mid).double() / mid) / math.log((max_position - 1) / mid)
    far = rel.sign() * (mid + torch.ceil(ratio * (mid - 1)).long())
    return torch.where(size <= mid, rel, far).to(device)


def check_sizes(max_relative_positions: int, position_buckets: int) -> None:
    if max_relative_positions < 1:
        raise ConfigError(
            f"pe.max_relative_positions={max_relative_positions} must be at least 1 "
            "(DeBERTa uses 512)"
        )
    if position_buckets and not 2 <= position_buckets // 2 + 1 < max_relative_positions:
        raise ConfigError(
            f"pe.position_buckets={position_buckets} must be 0 (no log buckets) or between 2 "
            f"and 2·(max_relative_positions − 2) = {2 * (max_relative_positions - 2)} "
            "(DeBERTa v3 uses 256 with max_relative_positions 512)"
        )


def parse_terms(pos_att_type: str | Sequence[str]) -> tuple[str, ...]:
    """The position terms, from a list or the official "c2p|p2c" string."""
    terms = pos_att_type.split("|") if isinstance(pos_att_type, str) else list(pos_att_type)
    if not terms or not set(terms) <= set(TERMS) or len(set(terms)) < len(terms):
        raise ConfigError(
            f"pe.pos_att_type={pos_att_type!r} must be a non-empty list of distinct terms from "
            f"{list(TERMS)}, e.g. [c2p, p2c]; for content-only attention use pe=none"
        )
    return tuple(terms)


class DeBERTa(PositionalEncoding):
    adds_score_terms = True
    per_layer = ("pos_key_proj", "pos_query_proj")

    def __init__(
        self,
        shape: StackShape,
        max_relative_positions: int,
        position_buckets: int,
        pos_att_type: str | Sequence[str],
        init_std: float,
        layer_norm_eps: float,
    ) -> None:
        super().__init__(shape)
        check_sizes(max_relative_positions, position_buckets)
        self.max_relative_positions = max_relative_positions
        self.position_buckets = position_buckets
        self.span = position_buckets or max_relative_positions  # k: P has 2k rows
        self.terms = parse_terms(pos_att_type)
        self.needs_query, self.needs_key = "c2p" in self.terms, "p2c" in self.terms
        self.rel_embeddings = nn.Parameter(torch.randn(2 * self.span, shape.d_model) * init_std)
        self.norm = nn.LayerNorm(shape.d_model, eps=layer_norm_eps)
        self.pos_key_proj = self.projections(self.needs_query, init_std)
        self.pos_query_proj = self.projections(self.needs_key, init_std)

    def projections(self, used: bool, init_std: float) -> nn.ModuleList | None:
        """One Linear(d_model → H·d_h) per layer, or None for a term that is off."""
        if not used:
            return None
        d, width = self.shape.d_model, self.shape.n_heads * self.shape.head_dim
        return nn.ModuleList(linear(d, width, True, init_std) for _ in range(self.shape.n_layers))

    def scale(self, head_dim: int) -> float:
        return (head_dim * (1 + len(self.terms))) ** -0.5

    def relative_index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """[Lq, Lk] δ(i, j): the row of P for query i and key j."""
        rel = -relative_positions(q_pos, k_pos)  # i − j
        if self.position_buckets:
            rel = log_bucket(rel, self.position_buckets, self.max_relative_positions)
        return (rel + self.span).clamp(0, 2 * self.span - 1)

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """[B, H, Lq, Lk]: (q_i·K^r_δ + k_j·Q^r_δ) times the attention scale."""
        index = self.relative_index(q_pos, k_pos)
        first, last = index.aminmax()
        first, last = int(first), int(last)  # a host sync, to slice P to the rows in use
        rows = self.norm(self.rel_embeddings[first : last + 1])[None]  # [1, R, d_model]
        index = index - first
        scale = self.scale(self.shape.head_dim)
        bias = None
        if self.pos_key_proj is not None:
            assert q is not None
            pos_key = split_heads(self.pos_key_proj[layer](rows), self.shape.n_heads)
            bias = gather_relative((q * scale) @ pos_key.transpose(-2, -1), index)
        if self.pos_query_proj is not None:
            assert k is not None
            pos_query = split_heads(self.pos_query_proj[layer](rows), self.shape.n_heads)
            by_key = gather_relative((k * scale) @ pos_query.transpose(-2, -1), index.T)
            p2c = by_key.transpose(-2, -1)
            # in place: a gather's output is not needed for its backward, and this spares
            # one more [B, H, Lq, Lk] tensor
            bias = p2c if bias is None else bias.add_(p2c)
        assert bias is not None
        return bias
