"""The normalizer interface: (scores [B, H, Lq, Lk], mask) -> attention weights.

`mask` is boolean, broadcastable to the scores, True where a query may attend (None: all).
Exp-based normalizers put −inf at masked scores before the exponential; the others apply
their activation first and multiply masked entries by 0 afterwards (SiLU(−inf) is NaN).
A row with no visible key (a padding query) gets all-zero weights, never NaN.

Every normalizer computes in float32 at least, whatever the activations' dtype (bf16 or fp16
under mixed precision): exponentials, squares and row sums of bf16 scores lose up to 10% of a
weight, against the bf16 rounding of the scores themselves. The weights come back in the
scores' dtype, the one the product with v runs in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class Normalizer(nn.Module):
    sdpa = False  # True only for softmax: F.scaled_dot_product_attention computes the same

    def forward(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        """The weights of `normalize`, computed in float32 or wider, in the scores' dtype."""
        wide = scores.to(torch.promote_types(scores.dtype, torch.float32))
        return self.normalize(wide, mask).to(scores.dtype)

    def normalize(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        raise NotImplementedError


def exp_normalize(
    scores: Tensor, mask: Tensor | None, normalize: Callable[[Tensor], Tensor]
) -> Tensor:
    """normalize(scores) with −inf at masked entries, and zero rows where every key is masked."""
    if mask is None:
        return normalize(scores)
    has_key = mask.any(-1, keepdim=True)
    fill = torch.where(has_key, float("-inf"), 0.0).to(scores.dtype)
    return normalize(torch.where(mask, scores, fill)) * has_key


def visible_keys(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Number of keys each query may attend to, [.., Lq, 1], at least 1."""
    if mask is None:
        return torch.full_like(scores[..., :1], scores.shape[-1])
    return mask.sum(-1, keepdim=True).clamp_min(1).to(scores.dtype)


def zero_masked(weights: Tensor, mask: Tensor | None) -> Tensor:
    return weights if mask is None else weights * mask
