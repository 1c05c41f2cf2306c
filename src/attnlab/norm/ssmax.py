"""Scalable-Softmax, SSMax (Nakanishi 2025, arXiv 2501.19399): a softmax whose logits are
multiplied by s·log n,

    a_ij = n_i^{s·s_ij} / Σ_k n_i^{s·s_ik} = softmax_j((s · log n_i) · s_ij),

n_i the number of keys query i may attend to, s learned per layer and head, so that the
largest weight does not fade as n grows (softmax's maximum weight tends to 0 with n).
Conventions: n_i counts the visible keys, so a causal row uses its own length and padding
changes nothing (the paper's n is the input vector's size); s starts at `scale`
(`learned: false` keeps it there). A row of one key has log n = 0 and gives it weight 1.
Invariant to a per-row shift of the scores, as softmax is.
"""

import torch
from torch import Tensor

from attnlab.norm.base import LayerHeads, Normalizer, exp_normalize, visible_keys
from attnlab.shape import StackShape


class SSMax(Normalizer):
    shift_invariant = True
    rows_sum_to_one = True
    fixed_row_sums = True

    def __init__(self, shape: StackShape, scale: float, learned: bool) -> None:
        super().__init__(shape)
        self.scale = LayerHeads(shape, scale, learned)

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        factor = self.scale(layer).to(scores.dtype) * visible_keys(scores, mask).log()
        return exp_normalize(scores * factor, mask, lambda s: torch.softmax(s, -1))
