"""ALiBi, attention with linear biases (Press, Smith, Lewis, ICLR 2022, arXiv 2108.12409).

    scores_ij = q_i·k_j/√d_h − m_h·|i − j|

No position enters the input; each head h penalizes distance with a fixed slope m_h (not
learned). Slopes as in the official `get_slopes`: for H = 2^a heads m_h = 2^(−8h/H),
h = 1…H; otherwise the c = 2^⌊log2 H⌋ slopes of c heads, followed by elements 0, 2, 4, … of
the slopes of 2c heads (so the list is not monotone, e.g. H = 6: 2^−2, 2^−4, 2^−6, 2^−8,
2^−1, 2^−3). In a causal stack the mask removes j > i and the bias is the paper's
−m_h·(i − j); bidirectional stacks use the symmetric −m_h·|i − j| the authors give in issue #5
of their repository. One slope vector serves every layer. No parameters and no length limit:
ALiBi extrapolates to sequences longer than any seen in training.

Convention: the official fairseq code adds +m_h·j instead, which differs from −m_h·(i − j)
by the per-row constant m_h·i. That trick is only valid for normalizers invariant to a
per-row shift (softmax, exp-L2); under relu², sigmoid or swish-L2 it changes the weights, so
the true bias is used here for every normalizer. Content-free: softmax keeps the SDPA path,
or on CUDA FlexAttention, which computes −m_h·|i − j| per (i, j) (`score_mod`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.pe.base import DistanceTerm
from attnlab.shape import StackShape


def geometric_slopes(n_heads: int) -> list[float]:
    """2^(−8h/n) for h = 1…n: the slopes of a power-of-two head count."""
    return [2.0 ** (-8 * h / n_heads) for h in range(1, n_heads + 1)]


def alibi_slopes(n_heads: int) -> list[float]:
    """The slope m_h of each head, for any head count."""
    c = 1 << (n_heads.bit_length() - 1)  # the largest power of two ≤ n_heads
    return geometric_slopes(c) + geometric_slopes(2 * c)[0::2][: n_heads - c]


class ALiBi(DistanceTerm):
    def __init__(self, shape: StackShape) -> None:
        super().__init__(shape)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(shape.n_heads)), persistent=False)

    def distance_term(self, distances: Tensor) -> Tensor:
        """[H, R] −m_h·|d|."""
        return -(self.slopes[:, None] * distances.abs())
