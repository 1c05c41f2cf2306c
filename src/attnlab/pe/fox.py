"""Forgetting attention (FoX; Lin, Nikishin, He & Courville 2025, "Forgetting Transformer:
Softmax Attention with a Forget Gate", ICLR 2025, arXiv 2503.02130).

Each head of each layer has a scalar forget gate per token, computed from the layer's input:

    f_t = σ(w_f · x_t + b_f)                        x_t the (normalized) input of the layer
    scores_ij = q_i·k_j / √d + Σ_{l=j+1..i} log f_l     for j ≤ i (causal)
              = q_i·k_j / √d + c_i − c_j,   c_t = Σ_{l ≤ t} log f_l

so a key's weight decays by the product of the gates between it and the query: a
data-dependent ALiBi (fixed gates f give ALiBi's slopes m = −log f). The score term is
`data_term`, from the cumulative sum c of log f over the keys (the cache's included), in
float32 at least. No other positional encoding: FoX uses none (the paper's default; its
optional RoPE is `use_rope`, not here).

Conventions, as the authors' code (zhixuan-lin/forgetting-transformer): w_f is one row per
head, N(0, init_std²), b_f = 0 at initialization (f = ½ everywhere); the gate reads the same
normalized input as q, k and v; log f by logsigmoid. Of FoX's "Pro" block, the output gate
is `model.output_gate=elementwise` (σ(x W), no bias, as theirs) and QK-norm is
`model.qk_norm=true` (an RMSNorm per head with a scale per head and dimension, as theirs);
its output RMSNorm and key/value shifts are not built here. Causal self-attention only: the sum runs over the
keys between j and i in order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.pe.base import PositionalEncoding


class ForgettingGate(PositionalEncoding):
    data_width = 1  # the forget gate's logit w_f · x_t + b_f, one a head
    causal_only = "its forget gates decay a key's weight over the tokens after it"

    def data_term(
        self,
        q: Tensor | None,
        k: Tensor | None,
        data: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        layer: int,
    ) -> Tensor:
        """[B, H, Lq, Lk] c_i − c_j = Σ_{l=j+1..i} log f_l (masked where j > i)."""
        log_f = F.logsigmoid(data[..., 0].to(torch.promote_types(data.dtype, torch.float32)))
        c = log_f.cumsum(-1)  # [B, H, Lk]: c at each key
        c_query = c[..., q_pos - k_pos[0]]  # the queries are keys too (self-attention)
        return c_query[..., :, None] - c[..., None, :]
