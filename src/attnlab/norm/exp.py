"""No denominator (Su 2022, kexue.fm/archives/9105): a_ij = e^{s_ij}.

"Drop the denominator" of softmax: Σ_j e^{s_ij} varies with i near the sequence ends, which
solves the position probe with relative PEs. Convention: e^s overflows float32 above
s ≈ 88.7, so scores are clamped at `max_score` (default 30, e^30 ≈ 1e13) first; a clamped
entry passes no gradient. Set max_score: null to disable the clamp. Masked scores are −inf
before the exponential, so a masked overflow never turns into inf·0 = NaN.

Weights reach e^30 ≈ 1e13, far beyond float16's largest value (65504), and their products
with v overflow even below the clamp: the weights are computed in float32 like every
normalizer's, and float16 activations (`trainer.precision=16-mixed`) are refused.
"""

import torch
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.norm.base import Normalizer, RunningState, exp_normalize
from attnlab.shape import StackShape


def in_float16(scores: Tensor) -> bool:
    """Whether the scores, or the matmuls that use the weights, run in float16."""
    device = scores.device.type
    autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device)
    return torch.float16 in (scores.dtype, autocast)


class Exp(Normalizer):
    def __init__(self, shape: StackShape, max_score: float | None) -> None:
        super().__init__(shape)
        self.max_score = max_score

    def forward(
        self, scores: Tensor, mask: Tensor | None, layer: int, state: RunningState | None = None
    ) -> Tensor:
        if in_float16(scores):
            raise ConfigError(
                "norm=exp gives weights up to e^max_score, beyond float16's range: train it "
                "with trainer.precision=bf16-mixed or 32-true, not 16-mixed"
            )
        return super().forward(scores, mask, layer, state)

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        if self.max_score is not None:
            scores = scores.clamp_max(self.max_score)
        return exp_normalize(scores, mask, torch.exp)
