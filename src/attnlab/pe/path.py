"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda & Kim 2025, "PaTH Attention:
Position Encoding via Accumulating Householder Transformations", NeurIPS 2025,
arXiv 2505.16381).

Each head of each layer has, at every token t, a Householder-like matrix computed from the
layer's (normalized) input x_t:

    H_t = I − β_t w_t w_tᵀ,    w_t = u_t / ‖u_t‖,    β_t = 2 σ(b_t)    (u_t, b_t from x_t)
    scores_ij = q_iᵀ P_ij k_j / √d,    P_ij = H_i H_{i−1} ⋯ H_{j+1}    for j ≤ i (causal)

so P_ii = I, and the key k_j meets H_{j+1} first, the query's own H_i last. With β_t ∈ (0, 2)
H_t has the eigenvalue 1 − β_t ∈ (−1, 1) along w_t and 1 elsewhere; β_t = 2 is a reflection
(P orthogonal), β_t = 0 the identity (no positional information at all: NoPE).

Conventions, as the authors' reference code (flash-linear-attention, `fla/layers/path_attn.py`
and `fla/ops/path_attn/naive.py`): the product order above (their decoding step updates every
cached key by H_t of the new token, k_j ← H_t k_j, and leaves the new key as it is, so
P_ii = I; their naive form applies the query's chunk, H_i first, to q_iᵀ on the right, then
the earlier chunks); w from a linear projection of the layer's input, then a short causal
convolution (kernel 3), then L2 normalization per head; β = 2·sigmoid of a projection with
a bias, one a head; scores scaled by 1/√d. Here both come from the layer's data projection
(`data_width` = d + 1 channels a head: u_t's d, then b_t), a full-rank linear map with a bias
and N(0, init_std²) weights (`Attention.data_proj`). Deviations: no short convolution on w
(w_t reads x_t alone), no low-rank factor of w's projection (theirs has rank 32 where heads
are not shared), and w's projection has a bias (theirs has none); the L2 normalization's
epsilon (1e-6 here, floored on the norm) is not confirmed against theirs. PaTH-FoX, PaTH with
FoX's forget gate (their `use_forget_gate`, Σ log σ over the tokens between), is not built
here: it would be pe=fox's term added to this one.

The attention core still adds the synthesizer's scaled q_i·k_j, so `data_term` returns the
difference (q_iᵀ P_ij k_j − q_i·k_j)·scale with scale = `self.scale(d)`: the total is PaTH's
score, exact up to rounding. That needs synthesizer=dot's unit weight on q·k: a mixture
with a dot component (dense_vanilla, random_vanilla) weighs q·k by its α while this term
is unweighted, so it is refused (`replaces_dot`). A synthesizer with no q·k (random, dense, factorized)
leaves PaTH nothing to transform: as rope, it then does nothing, and it asks for no data
channels (`without_dot_product`), so no projection is left without a gradient.

Computed in quadratic time, float32 at least: for all queries at once, the keys are visited
from the last to the first, keeping U_i = P_ijᵀ q_i = H_{j+1} ⋯ H_i q_i (H_t is symmetric),
so that s_ij = U_i·k_j and U_i ← H_j U_i = U_i − β_j (w_j·U_i) w_j before key j − 1, for the
queries at or after key j: O(Lk) steps of O(B·H·Lq·d) each; in training autograd keeps
every step's U, O(B·H·Lq·Lk·d) memory (`model.attention_chunk` bounds Lq: blocks are
recomputed in the backward pass). Not the authors' chunked UT/WY form nor their kernels.
Cached decoding gives the one query and every cached key's channels, and the same loop
serves. Causal self-attention only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.pe.base import PositionalEncoding
from attnlab.shape import StackShape

EPS = 1e-6  # floor on ‖u_t‖ in w_t = u_t / ‖u_t‖


class PaTH(PositionalEncoding):
    causal_only = "its transforms accumulate over the tokens between key and query, in order"
    replaces_dot = "replaces q_i·k_j by q_iᵀ P_ij k_j"

    def __init__(self, shape: StackShape) -> None:
        super().__init__(shape)
        self.data_width = shape.head_dim + 1  # u_t (w_t before normalization), then β_t's logit

    def without_dot_product(self) -> None:
        self.data_width = 0  # no q·k to transform: no channels, no projection

    def householders(self, data: Tensor) -> tuple[Tensor, Tensor]:
        """w [B, H, Lk, d] (unit vectors) and β [B, H, Lk] in (0, 2), at every key."""
        data = data.to(torch.promote_types(data.dtype, torch.float32))
        w = F.normalize(data[..., :-1], dim=-1, eps=EPS)
        return w, 2 * torch.sigmoid(data[..., -1])

    def data_term(
        self,
        q: Tensor | None,
        k: Tensor | None,
        data: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        layer: int,
    ) -> Tensor | None:
        """[B, H, Lq, Lk] (q_iᵀ P_ij k_j − q_i·k_j)·scale (zero where j > i, masked there)."""
        if q is None or k is None:
            return None
        w, beta = self.householders(data)
        q, k = q.to(w.dtype), k.to(w.dtype)
        at = (q_pos - k_pos[0]).to(q.device)  # each query's own key index (self-attention)
        u = q.expand(*w.shape[:2], *q.shape[2:])  # [B, H, Lq, d], U_i = q_i before any H
        columns = []
        for j in range(k.shape[2] - 1, -1, -1):
            columns.append((u * k[:, :, None, j]).sum(-1))  # s_ij = U_i·k_j
            if j == 0:
                break
            w_j = w[:, :, None, j]  # [B, H, 1, d]
            reflected = u - beta[:, :, j, None, None] * (u * w_j).sum(-1, keepdim=True) * w_j
            u = torch.where((at >= j)[:, None], reflected, u)  # H_j for queries at or after j
        path = torch.stack(columns[::-1], -1)
        return (path - q @ k.transpose(-2, -1)) * self.scale(q.shape[-1])
