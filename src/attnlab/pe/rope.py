"""RoPE, rotary position embedding (Su et al., RoFormer, arXiv 2104.09864).

q̃_m = R_m q_m, k̃_n = R_n k_n, with R_m block-diagonal 2×2 rotations by m·θ_i,
θ_i = base^(−2i/d_r) for i < d_r/2, so q̃_m·k̃_n = q_mᵀ R_{n−m} k_n depends on n − m only.
Applied per head to q and k after projection, never to v.

Conventions: `layout="interleaved"` rotates pairs (2i, 2i+1) as the official RoFormer code
does; `layout="half"` rotates (i, i + d_r/2) as GPT-NeoX/LLaMA do (the two differ by a fixed
permutation of head dimensions). `rotary_dim` (default: all of d_h) rotates only the first
d_r dimensions and passes the rest through (GPT-NeoX's partial rotary); θ uses d_r.
RoPE acts through q·k only: with a synthesizer that computes no q·k it has no effect.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.config import ConfigError
from attnlab.pe.base import PositionalEncoding, angles
from attnlab.shape import StackShape


def rotate(x: Tensor, pos: Tensor, base: float, layout: str) -> Tensor:
    """Rotate the last dimension of x [..., L, d] (d even) by positions pos [L]."""
    d = x.shape[-1]
    theta = angles(pos, d, base)  # [L, d/2], m·θ_i
    cos, sin = theta.cos().to(x.device, x.dtype), theta.sin().to(x.device, x.dtype)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


class RoPE(PositionalEncoding):
    rotates = True

    def __init__(
        self,
        shape: StackShape,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: str = "interleaved",
    ) -> None:
        super().__init__(shape)
        self.rotary_dim = shape.head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= shape.head_dim:
            raise ConfigError(
                f"pe.rotary_dim={rotary_dim} must be even and between 2 and the head width "
                f"{shape.head_dim}"
            )
        if base <= 0:
            raise ConfigError(f"pe.base={base} must be positive (θ_i = base^(−2i/d))")
        if layout not in ("interleaved", "half"):
            raise ConfigError(f"pe.layout={layout!r} is not one of: interleaved, half")
        self.base, self.layout = base, layout

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        d = self.rotary_dim
        if d == x.shape[-1]:
            return rotate(x, pos, self.base, self.layout)
        return torch.cat((rotate(x[..., :d], pos, self.base, self.layout), x[..., d:]), -1)
