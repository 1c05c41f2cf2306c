"""Softmax (Vaswani et al. 2017): a_ij = e^{s_ij} / Σ_k e^{s_ik}.

Rows sum to 1 and are invariant to a per-row shift of the scores, which is why a relative
PE acting only on the scores cannot solve the position probe (Su 2022, kexue.fm/archives/9105).
This is the one normalizer the fused `F.scaled_dot_product_attention` path computes.
"""

import torch
from torch import Tensor

from attnlab.norm.base import Normalizer, exp_normalize


class Softmax(Normalizer):
    shift_invariant = True
    rows_sum_to_one = True
    fixed_row_sums = True
    sdpa = True

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        return exp_normalize(scores, mask, lambda s: torch.softmax(s, -1))
