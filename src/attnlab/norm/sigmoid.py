"""Sigmoid attention (Ramapuram et al. 2024, arXiv 2409.04431): a_ij = σ(s_ij + b).

The paper recommends b = −ln n, so that σ(s − ln n) ≈ e^s/n and the row sum starts O(1).
Convention: with `bias: null` (default) n is the number of keys query i may attend to
(padding does not change a row; a causal row uses its own length); a number fixes b for
every row, as the authors' code does. Elementwise, masked entries are zeroed; not invariant
to a per-row shift, so a key bias matters.
"""

import torch
from torch import Tensor

from attnlab.norm.base import Normalizer, visible_keys, zero_masked
from attnlab.shape import StackShape


class Sigmoid(Normalizer):
    def __init__(self, shape: StackShape, bias: float | None) -> None:
        super().__init__(shape)
        self.bias = bias

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        bias = -visible_keys(scores, mask).log() if self.bias is None else self.bias
        return zero_masked(torch.sigmoid(scores + bias), mask)
