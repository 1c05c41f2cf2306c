"""L2 normalization of a general activation (Su 2022, kexue.fm/archives/9105):

    a_ij = f(s_ij) / √(Σ_k f(s_ik)² + ε)

with f = SiLU (swish) by default, which Su reports "has some feasibility". Entries may be
negative. The activation is applied first and masked entries are zeroed after it
(SiLU(−inf) is NaN); ε keeps rows where every f is 0 (padding) at 0 instead of NaN.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.norm.base import Normalizer, zero_masked
from attnlab.shape import StackShape

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
    "tanh": torch.tanh,
    "identity": lambda s: s,
}


class L2Act(Normalizer):
    def __init__(self, shape: StackShape, activation: str, eps: float) -> None:
        super().__init__(shape)
        if activation not in ACTIVATIONS:
            raise ConfigError(
                f"norm.activation={activation!r} is not one of: {', '.join(ACTIVATIONS)}"
            )
        self.activation, self.eps = ACTIVATIONS[activation], eps

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        f = zero_masked(self.activation(scores), mask)
        return f * torch.rsqrt(f.square().sum(-1, keepdim=True) + self.eps)
