"""Softpick (Zuhri, Fuadi, Aji 2025, arXiv 2504.20966): a rectified softmax,

    a_ij = ReLU(e^{s_ij} − 1) / (Σ_k |e^{s_ik} − 1| + ε),

whose weights are exactly 0 for scores ≤ 0 and whose rows sum to at most 1, so no token
has to absorb the rest (no attention sink). Computed, as the authors' reference code does,
with the row maximum taken out, here m = max(0, max_k s_ik) so that neither exponential
overflows: ReLU(e^{s−m} − e^{−m}) / (Σ|e^{s−m} − e^{−m}| + ε·e^{−m}) is the same ratio
(their code adds ε unscaled; ε, 1e-8 there, matters only for rows of exact zeros). Masked
keys are left out of both sums; a row with none visible is all zeros. Not invariant to a
per-row shift.
"""

import torch
from torch import Tensor

from attnlab.norm.base import Normalizer, zero_masked
from attnlab.shape import StackShape


class Softpick(Normalizer):
    def __init__(self, shape: StackShape, eps: float) -> None:
        super().__init__(shape)
        self.eps = eps

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        visible = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
        top = visible.amax(-1, keepdim=True).clamp_min(0)  # 0 for a row of no visible key
        shifted = zero_masked(torch.exp(visible - top) - torch.exp(-top), mask)
        total = shifted.abs().sum(-1, keepdim=True) + self.eps * torch.exp(-top)
        return torch.relu(shifted) / total
