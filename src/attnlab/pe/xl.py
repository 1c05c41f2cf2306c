"""Transformer-XL relative attention (Dai et al. 2019, arXiv 1901.02860; XLNet, Yang et al. 2019).

    scores_ij = [(q_i + u)·k_j + (q_i + v)·W_R R_{i−j}] / √d_h
    R_t = [sin(t ω) | cos(t ω)] at width d_model,  ω_k = 10000^(−2k/d_model)

Conventions, as in the official code (kimiyoung/transformer-xl `RelPartialLearnableMultiHeadAttn`,
zihangdai/xlnet `rel_attn_core`): the sinusoid argument is the distance i − j (query minus
key; positive = past), R's sin and cos halves are concatenated, not interleaved;
W_R [d_model -> H·d_h, no bias] is per layer; u (`r_w_bias`) and v (`r_r_bias`) [H, d_h] are
shared by all layers (XLNet's `untie_r=False`); u, v and W_R are initialized N(0, 0.02²);
`clamp_len` clips |i − j|. The scale 1/√d_h applies to both terms, so the core's
scale·q·k plus this bias is the whole score. TXL's dropout on R is not applied.

Efficient form: the position term is computed for each query against one row of distances
(`distances`), [B, H, Lq, R], and the rel-shift turns it into the [B, H, Lq, Lk] matrix
indexed by i − j with a pad and two reshapes, no gather. Causal stacks use TXL's form
(valid for keys at or before the query; later keys hold other values that the causal mask
removes); bidirectional stacks use XLNet's, valid everywhere. TXL and XLNet start the
distances at the key length, for queries at the last Lq key positions; starting them at
the last query position instead makes the same shift right for any contiguous block of
queries among keys 0..Lk−1: a whole sequence, a cached decoding step (q_pos = [t]) or a
block of queries of chunked attention. XL is undefined for cross-attention and refuses it.
Like every score-only PE it keeps softmax rows stochastic, so identical tokens give
identical outputs (Su 2022, kexue.fm/archives/9105).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding
from attnlab.pe.sinusoidal import sinusoids
from attnlab.shape import StackShape
from attnlab.tensors import linear


def distances(q_pos: Tensor, k_len: int, causal: bool) -> Tensor:
    """i − j at each column of the unshifted position term (TXL's and XLNet's `pos_seq`),
    for contiguous queries q_pos among keys 0..k_len−1."""
    width = k_len if causal else k_len + q_pos.shape[0]
    start = q_pos[-1] if causal else q_pos[-1] + 1
    return start - torch.arange(width, device=q_pos.device)


def rel_shift_causal(x: Tensor) -> Tensor:
    """TXL: x [..., Lq, Lk] over `distances(causal=True)` -> [..., Lq, Lk] at i − j.

    Entry (i, j) holds distance q_pos[i] − j for keys j ≤ q_pos[i], something else above.
    """
    *batch, q_len, k_len = x.shape
    padded = F.pad(x, (1, 0)).view(*batch, k_len + 1, q_len)
    return padded[..., 1:, :].reshape(*batch, q_len, k_len)


def rel_shift_bidirectional(x: Tensor) -> Tensor:
    """XLNet: x [..., Lq, Lk + Lq] over `distances(causal=False)` -> [..., Lq, Lk] at i − j."""
    *batch, q_len, r_len = x.shape
    shifted = x.reshape(*batch, r_len, q_len)[..., 1:, :].reshape(*batch, q_len, r_len - 1)
    return shifted[..., : r_len - q_len]


class TransformerXLPE(PositionalEncoding):
    adds_score_terms = True
    needs_query = True
    needs_key = True
    per_layer = ("w_r",)

    def __init__(self, shape: StackShape, clamp_len: int | None, init_std: float) -> None:
        super().__init__(shape)
        if shape.cross:
            raise ConfigError(
                "pe=xl supports self-attention only (its rel-shift needs the queries to be the "
                "last keys): set model.cross_pe=false"
            )
        if clamp_len is not None and clamp_len < 1:
            raise ConfigError(f"pe.clamp_len={clamp_len} must be at least 1, or null for none")
        self.clamp_len = clamp_len
        h, d_h = shape.n_heads, shape.head_dim
        self.w_r = nn.ModuleList(
            linear(shape.d_model, h * d_h, False, init_std) for _ in range(shape.n_layers)
        )
        self.u = nn.Parameter(torch.randn(h, d_h) * init_std)  # content bias, r_w_bias
        self.v = nn.Parameter(torch.randn(h, d_h) * init_std)  # position bias, r_r_bias

    def projected_positions(self, t: Tensor, layer: int) -> Tensor:
        """W_R R_t for distances t [R], as [H, d_h, R]."""
        if self.clamp_len is not None:
            t = t.clamp(-self.clamp_len, self.clamp_len)
        w_r = self.w_r[layer]
        r = w_r(sinusoids(t, self.shape.d_model, w_r.weight.dtype, interleaved=False))
        return r.view(-1, self.shape.n_heads, self.shape.head_dim).permute(1, 2, 0)

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        assert q is not None and k is not None
        causal = self.shape.causal
        t = distances(q_pos, k_pos.shape[0], causal)
        position = torch.matmul(q + self.v[:, None], self.projected_positions(t, layer))
        position = rel_shift_causal(position) if causal else rel_shift_bidirectional(position)
        content = torch.matmul(k, self.u[..., None]).transpose(-2, -1)  # u·k_j, [B, H, 1, Lk]
        return (position + content) * self.scale(q.shape[-1])
