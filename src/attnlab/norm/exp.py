"""No denominator (Su 2022, kexue.fm/archives/9105): a_ij = e^{s_ij}.

"Drop the denominator" of softmax: Σ_j e^{s_ij} varies with i near the sequence ends, which
solves the position probe with relative PEs. Convention: e^s overflows float32 above
s ≈ 88.7, so scores are clamped at `max_score` (default 30, e^30 ≈ 1e13) first; a clamped
entry passes no gradient. Set max_score: null to disable the clamp. Masked scores are −inf
before the exponential, so a masked overflow never turns into inf·0 = NaN.
"""

import torch
from torch import Tensor

from attnlab.norm.base import Normalizer, exp_normalize


class Exp(Normalizer):
    def __init__(self, max_score: float | None = 30.0) -> None:
        super().__init__()
        self.max_score = max_score

    def forward(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        if self.max_score is not None:
            scores = scores.clamp_max(self.max_score)
        return exp_normalize(scores, mask, torch.exp)
