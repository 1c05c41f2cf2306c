"""Sinusoidal absolute positions (Vaswani et al. 2017, §3.5).

PE[p, 2i] = sin(p·ω_i), PE[p, 2i+1] = cos(p·ω_i), ω_i = 10000^(−2i/d): the paper's
interleaved layout (tensor2tensor and fairseq concatenate halves and use a slightly
different timescale; Transformer-XL's R uses halves with the paper's ω, see `sinusoids`).
PE_p·PE_q = Σ_i cos((p−q)ω_i) depends only on p − q. No parameters, no length limit.
"""

import torch
from torch import Tensor

from attnlab.pe.base import PositionalEncoding, angles


def sinusoids(
    pos: Tensor, dim: int, dtype: torch.dtype, interleaved: bool = True, base: float = 10000.0
) -> Tensor:
    """[L, dim] table: interleaved (sin, cos) pairs, or [sin | cos] halves (computed in float64)."""
    theta = angles(pos, dim, base)  # [L, dim/2], p·ω_i
    sin, cos = theta.sin(), theta.cos()
    table = torch.stack((sin, cos), -1).flatten(-2) if interleaved else torch.cat((sin, cos), -1)
    return table.to(pos.device, dtype)


class SinusoidalPE(PositionalEncoding):
    embeds = True

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + sinusoids(pos, self.shape.d_model, x.dtype)
