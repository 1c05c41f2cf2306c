"""xPos, RoPE with a per-frequency exponential decay (Sun, Dong, Patra, Ma, Huang, Benhaim,
Chaudhary, Song, Wei, "A Length-Extrapolatable Transformer", ACL 2023, arXiv 2212.10554).

    q̃_n = ζ^{n/B} ⊙ R_n q_n,   k̃_m = ζ^{−m/B} ⊙ R_m k_m,
    q̃_i·k̃_j = Σ_k ζ_k^{(i−j)/B} · [RoPE's term of pair k],   ζ_k = (2k/d + γ)/(1 + γ)

R_n is RoPE's rotation (θ_k = 10000^(−2k/d), `attnlab.pe.rope.rotate`) and ζ_k^{±n/B}
multiplies both coordinates of pair k; γ = 0.4, B = `scale_base` (512). ζ runs from
γ/(1 + γ) = 2/7 on the fastest pair to (1 − 2/d + γ)/(1 + γ) on the slowest, so in a
causal stack (i ≥ j) every pair decays geometrically with distance, the fast ones most.
q and k are scaled in opposite directions: the query's factor comes from `rotate`, the
key's from `rotate_key`. xPos acts through q·k only: with a synthesizer that computes no
q·k it has no effect. The paper's blockwise causal attention at inference is not part of it.

Conventions (the authors' torchscale `XPOS` and x-transformers `rotary_xpos` share the
formula above and differ from each other and from this module as follows):
- Centre: the scales use n − c with c = 0. Both references centre positions for range
  (torchscale c = ⌈L/2⌉, x-transformers c = max position // 2) and re-scale the whole cache
  at every step; here keys are cached already scaled, so c must never move. c cancels in
  q̃·k̃, so scores are the same.
- Range: with c = 0 the key scale ζ_0^{−m/B} = 3.5^{m/B} grows with m and the query scale
  shrinks as fast. They would leave float32's normal range (bf16's is the same,
  2^−126…2^128) at m = 126·B·ln 2/ln 3.5 ≈ 35,694 for B = 512 (the query scale reaches
  2^−126 there, the key scale 2^126, so a key entry above 4 overflows). Positions are
  bounded to scales within 2^±64, max_len = ⌊64·B·ln 2/ln 3.5⌋ + 1 = 18,131 for B = 512,
  which leaves 2^64 for the entries of q and k and the gradients the key scale multiplies;
  a longer sequence is refused with a ConfigError that names `scale_base` (the bound grows
  with it). float16 would overflow at m ≈ 4,532; the project trains in float32 or bf16.
- Precision: the scales are computed in float64 and cast to the activations' dtype, as
  RoPE's angles are.
- Rotated dims: the whole head, as torchscale; x-transformers rotates only half of it by
  default (`rotary_emb_dim = dim_head // 2`, ζ from that width).
- Pairs: `layout="interleaved"` (2k, 2k+1), as torchscale and x-transformers (since 2024);
  `layout="half"` (k, k + d/2) as GPT-NeoX, with ζ_k on the same pairs as the rotation.
- Causal only: for keys after the query (j > i) the factor ζ^{(i−j)/B} exceeds 1 and grows
  with distance, so bidirectional stacks and cross-attention are refused, as x-transformers
  refuses them; torchscale has no such guard.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding
from attnlab.pe.rope import rotate
from attnlab.shape import StackShape
from attnlab.tensors import float64_home

GAMMA = 0.4  # ζ_k = (2k/d + γ)/(1 + γ)
THETA_BASE = 10000.0  # RoPE's θ_k = base^(−2k/d)
SAFE_EXPONENT = 64  # positions keep ζ^{±n/B} within 2^±64


def zeta(dim: int, device: torch.device | None = None) -> Tensor:
    """[dim/2] ζ_k = (2k/d + γ)/(1 + γ), in float64."""
    k = torch.arange(0, dim // 2, dtype=torch.float64, device=device)
    return (2 * k / dim + GAMMA) / (1 + GAMMA)


def decay(pos: Tensor, dim: int, scale_base: float) -> Tensor:
    """[L, dim/2] ζ_k^{n/B} at positions n = pos, in float64 on `float64_home(pos.device)`."""
    pos = pos.to(float64_home(pos.device), torch.float64)
    return zeta(dim, pos.device)[None, :] ** (pos[:, None] / scale_base)


def safe_length(scale_base: float) -> int:
    """The number of positions n ≥ 0 whose scales ζ_0^{±n/B} stay within 2^±SAFE_EXPONENT."""
    return math.floor(SAFE_EXPONENT * math.log(2) * scale_base / -math.log(GAMMA / (1 + GAMMA))) + 1


class XPos(PositionalEncoding):
    rotates = True
    max_len_option = "scale_base"
    causal_only = "its factor ζ^((i−j)/B) grows with distance for keys after the query"

    def __init__(self, shape: StackShape, scale_base: float, layout: str) -> None:
        super().__init__(shape)
        if shape.head_dim % 2:
            raise ConfigError(
                f"xPos rotates pairs of dimensions, so the head width {shape.head_dim} must be "
                "even: change model.d_model or model.n_heads"
            )
        if scale_base <= 0:
            raise ConfigError(f"pe.scale_base={scale_base} must be positive (ζ^(n/scale_base))")
        if layout not in ("interleaved", "half"):
            raise ConfigError(f"pe.layout={layout!r} is not one of: interleaved, half")
        self.scale_base, self.layout = scale_base, layout
        self.max_len = safe_length(scale_base)

    def scaled(self, x: Tensor, pos: Tensor, sign: int) -> Tensor:
        """x [..., L, d] rotated by RoPE at pos and pair k scaled by ζ_k^{sign·n/B}."""
        scale = decay(sign * pos, x.shape[-1], self.scale_base).to(x.device, x.dtype)
        pairs = (
            scale.repeat_interleave(2, -1) if self.layout == "interleaved" else scale.repeat(1, 2)
        )
        return rotate(x, pos, THETA_BASE, self.layout) * pairs

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """The query: ζ^{n/B} ⊙ R_n q."""
        return self.scaled(x, pos, 1)

    def rotate_key(self, x: Tensor, pos: Tensor) -> Tensor:
        """The key: ζ^{−m/B} ⊙ R_m k."""
        return self.scaled(x, pos, -1)
