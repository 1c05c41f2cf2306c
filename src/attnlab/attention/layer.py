"""One attention layer: its projections, its cache and its output gate. What attention
computes from the projected heads is `attend` (attnlab.attention.core).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.core import AttentionParts, Compute, attend, attention_weights
from attnlab.norm.base import RunningState
from attnlab.pe.base import PositionalEncoding
from attnlab.shape import StackShape
from attnlab.tensors import linear, merge_heads, split_heads


class Projected(NamedTuple):
    """One layer's heads [B, H, L, ·] for `attend`: q, k, v and a data-dependent PE's data
    channels (None where nothing reads them)."""

    q: Tensor | None
    k: Tensor | None
    v: Tensor
    data: Tensor | None = None


def rotate_and_cache(
    pe: PositionalEncoding, new: Projected, q_pos: Tensor, cache: KVCache | None
) -> Projected:
    """Self-attention's new q and k rotated by the PE at their positions, then the cache's
    keys, values and data ahead of the new ones: what every block does between its
    projections and `attend`."""
    q = None if new.q is None else pe.rotate(new.q, q_pos)
    k = None if new.k is None else pe.rotate_key(new.k, q_pos)
    rotated = Projected(q, k, new.v, new.data)
    return rotated if cache is None else cache.extend(rotated)


def _cat(old: Tensor | None, new: Tensor | None) -> Tensor | None:
    return new if old is None or new is None else torch.cat((old, new), 2)


@dataclass
class KVCache:
    """Keys, values and data channels seen so far by one attention layer (incremental
    decoding), and what its normalizer keeps of the earlier queries (`carries_state`)."""

    k: Tensor | None = None
    v: Tensor | None = None
    data: Tensor | None = None
    norm_state: RunningState = field(default_factory=RunningState)

    def extend(self, new: Projected) -> Projected:
        """Append the new keys, values and data; return all of them with the new queries."""
        self.k, self.v, self.data = (
            _cat(self.k, new.k),
            _cat(self.v, new.v),
            _cat(self.data, new.data),
        )
        assert self.v is not None
        return Projected(new.q, self.k, self.v, self.data)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search)."""
        self.k, self.v, self.data = (
            None if t is None else t.index_select(0, index) for t in (self.k, self.v, self.data)
        )
        self.norm_state.reorder(index)


OUTPUT_GATES = (None, "headwise", "elementwise")


class HeadRMSNorm(nn.Module):
    """RMSNorm of each head's vector [B, H, L, d] with a learned scale per head and dimension
    (ones at init): x / √(mean(x²) + ε) · g_h."""

    def __init__(self, n_heads: int, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_heads, 1, dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = F.rms_norm(wide, (x.shape[-1],), eps=self.eps).to(x.dtype)
        return normed * self.weight.to(x.dtype)


class Attention(nn.Module):
    """Multi-head attention for one layer: projections and cache here, composition in `attend`.

    Self-attention projects q, k and v from x in one matmul, skipping q or k when neither the
    synthesizer nor the PE reads them; cross-attention projects q from x and k, v from memory.

    `output_gate` (gated attention, Qiu et al. 2025, arXiv 2505.06708, their G1 position):
    each head's output o_h, before the output projection, is multiplied by σ(x W_g), x the
    layer's (normalized) input at the query's position: one gate per head ("headwise") or
    one per output dimension of each head ("elementwise", the paper's best); W_g has no bias,
    as in the paper's Y' = Y ⊙ σ(X W_θ).

    `qk_norm` (QK-norm, as in the Forgetting Transformer's "Pro" block, Lin et al. 2025, and
    Dehghani et al. 2023, arXiv 2302.05442, there a LayerNorm): each head's q and k pass an
    RMSNorm with a learned scale per head and dimension, before the PE's rotation; the
    scores keep their 1/√d_h.

    A data-dependent PE (`data_width` > 0) gets its channels from a projection of x with a
    bias, N(0, init_std²) weights and zero bias, as the forget gate of Lin et al. 2025.
    """

    def __init__(
        self,
        shape: StackShape,
        layer: int,
        needs_query: bool,
        needs_key: bool,
        cross: bool = False,
        bias: bool = True,
        init_std: float = 0.02,
        out_std: float = 0.02,
        compute: Compute = Compute(),
        output_gate: str | None = None,
        data_width: int = 0,
        qk_norm: bool = False,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        h, d = shape.n_heads, shape.d_model
        self.shape, self.layer, self.cross, self.compute = shape, layer, cross, compute
        gates = {None: 0, "headwise": h, "elementwise": h * shape.value_dim}[output_gate]
        self.gate = linear(d, gates, False, init_std) if gates else None
        self.data_proj = linear(d, h * data_width, True, init_std) if data_width else None
        self.q_norm = HeadRMSNorm(h, shape.head_dim, norm_eps) if qk_norm and needs_query else None
        self.k_norm = HeadRMSNorm(h, shape.head_dim, norm_eps) if qk_norm and needs_key else None
        q_width = h * shape.head_dim if needs_query else 0
        k_width = h * shape.head_dim if needs_key else 0
        self.widths = (q_width, k_width, h * shape.value_dim)
        if cross:
            self.q_proj = linear(d, q_width, bias, init_std)
            self.kv_proj = linear(d, k_width + self.widths[2], bias, init_std)
        else:
            self.qkv_proj = linear(d, sum(self.widths), bias, init_std)
        self.out_proj = linear(h * shape.value_dim, d, bias, out_std)

    def _heads(self, x: Tensor | None, width: int) -> Tensor | None:
        return split_heads(x, self.shape.n_heads) if width else None

    def _queries(self, x: Tensor, width: int) -> Tensor | None:
        q = self._heads(x, width)
        return q if q is None or self.q_norm is None else self.q_norm(q)

    def _keys(self, x: Tensor, width: int) -> Tensor | None:
        k = self._heads(x, width)
        return k if k is None or self.k_norm is None else self.k_norm(k)

    def project(
        self,
        x: Tensor,
        parts: AttentionParts,
        q_pos: Tensor,
        k_pos: Tensor,
        memory: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Projected:
        """q, k, v [B, H, L, d] (rotated by the PE) and the PE's data channels, with the
        cache's."""
        qw, kw, vw = self.widths
        pe = parts.pe
        if self.cross:
            q = pe.rotate(self._queries(self.q_proj(x), qw), q_pos)
            if cache is not None and cache.v is not None:
                return Projected(q, cache.k, cache.v)
            k, v = self.kv_proj(memory).split((kw, vw), -1)
            k, v = pe.rotate_key(self._keys(k, kw), k_pos), self._heads(v, vw)
            if cache is not None:
                cache.k, cache.v = k, v
            return Projected(q, k, v)
        q, k, v = self.qkv_proj(x).split(self.widths, -1)
        h = self.shape.n_heads
        data = None if self.data_proj is None else split_heads(self.data_proj(x), h)
        new = Projected(self._queries(q, qw), self._keys(k, kw), split_heads(v, h), data)
        return rotate_and_cache(pe, new, q_pos, cache)

    def forward(
        self,
        x: Tensor,
        parts: AttentionParts,
        q_pos: Tensor,
        k_pos: Tensor,
        mask: Tensor | None,
        memory: Tensor | None = None,
        cache: KVCache | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        q, k, v, data = self.project(x, parts, q_pos, k_pos, memory, cache)
        compute = self.compute.at(self.training)
        state = None if cache is None else cache.norm_state
        args = (q_pos, k_pos, mask, compute, is_causal, data, state)
        out = attend(parts, self.layer, x, q, k, v, *args)
        out = parts.norm.output(out, self.layer)  # the identity but for differential attention
        if self.gate is not None:
            gate = torch.sigmoid(split_heads(self.gate(x), self.shape.n_heads))  # [B, H, L, 1|dv]
            out = out * gate.to(out.dtype)
        return self.out_proj(merge_heads(out))

    def weights(
        self,
        x: Tensor,
        parts: AttentionParts,
        q_pos: Tensor,
        k_pos: Tensor,
        mask: Tensor | None,
        memory: Tensor | None = None,
    ) -> Tensor:
        """The attention weights [B, H, Lq, Lk] of `forward` with the same inputs, no cache."""
        q, k, _, data = self.project(x, parts, q_pos, k_pos, memory)
        return attention_weights(parts, self.layer, x, q, k, q_pos, k_pos, mask, data)
