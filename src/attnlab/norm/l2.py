"""exp-L2 normalization (Su 2022, kexue.fm/archives/9105): a_ij = e^{s_ij} / √(Σ_k e^{2 s_ik}).

Softmax is the l1 normalization of e^{s_i·}; this is the l2 one. Computed after shifting
each row by its maximum m_i, a_ij = w_ij / ‖w_i‖₂ with w_ij = e^{s_ij − m_i} ∈ (0, 1]: finite
for scores of ±1e3 (the naive form overflows), and without the cancellation of the closed
form exp(s_ij − ½·LSE_k(2 s_ik)), which loses 5e-5 in float32 on equal scores of 1e3. Row sums r_i = ‖e^{s_i}‖₁/‖e^{s_i}‖₂ lie in [1, √n_i], so position leaks through
them: with relative PEs this solves the position probe. Still invariant to a per-row shift.
"""

import torch
from torch import Tensor

from attnlab.norm.base import Normalizer, exp_normalize


def l2_normalize_exp(scores: Tensor) -> Tensor:
    # the result does not depend on the shift, so its gradient through the max is zero
    w = torch.exp(scores - scores.amax(-1, keepdim=True).detach())
    return w * torch.rsqrt(w.square().sum(-1, keepdim=True))


class L2(Normalizer):
    shift_invariant = True

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        return exp_normalize(scores, mask, l2_normalize_exp)
