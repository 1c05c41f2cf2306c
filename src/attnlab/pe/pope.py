"""PoPE, polar coordinate position embedding (Gopalakrishnan, Csordás, Schmidhuber, Mozer 2025,
"Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings",
arXiv 2509.10534).

Each of the d components of a query or key becomes one complex number whose magnitude is
the content (the "what") and whose phase is the position (the "where"):

    q̃_tc = μ_qtc · e^{i·t·θ_c},           μ_qtc = softplus(q_tc)
    k̃_sc = μ_ksc · e^{i·(s·θ_c + δ_c)},   μ_ksc = softplus(k_sc)
    a_ts = Re[q̃_tᴴ k̃_s] = Σ_c μ_qtc μ_ksc cos((s − t)·θ_c + δ_c)

for c = 0 … d − 1, θ_c = base^(−c/d). Unlike RoPE, whose rotation adds the position to an
angle the content already has (the angle between a pair of q's coordinates), the content
here sets no phase at all: μ ≥ 0, so the phase is the position's alone, and a score is a
sum of non-negative magnitudes weighted by a cosine of the offset s − t. With δ = 0 the
matrix of scores of fixed vectors is Toeplitz, like RoPE's.

As real vectors (what `rotate` and `rotate_key` return, twice the head's width):

    q̃_t = [μ_qt ⊙ cos(t·θ), μ_qt ⊙ sin(t·θ)],  k̃_s = [μ_ks ⊙ cos(s·θ + δ), μ_ks ⊙ sin(s·θ + δ)]

so that q̃_t · k̃_s = a_ts. Values keep their width: only q·k changes. The attention core
scales q̃·k̃ by `scale`, 1/√d of the head's own width d (not of the 2d it receives), as
x-transformers does.

Conventions, and where they come from:
- Frequencies: d of them, one per component (RoPE has d/2, one per pair), θ_c =
  base^(−c/d) with base = 10,000, as x-transformers' `PolarEmbedding` (inv_freq =
  1/base^(arange(d)/d)); the paper's text on the schedule was not read here (not confirmed
  beyond the reference code). They are RoPE's frequencies for a head of width 2d
  (`attnlab.pe.base.angles(pos, 2d, base)`).
- Magnitudes: softplus with β = 1 (PyTorch's default, as x-transformers), on every
  component of q and of k, in at least float32.
- Phase bias δ (`phase_bias`): learned, one per head and frequency, added to the keys'
  phases only, clamped to [−2π, 0] in the forward pass, zero at the start (`bias_init:
  zero`) or drawn uniformly from [−2π, 0] (`uniform`): x-transformers' `learned_bias`
  [heads, 1, dim], its clamp and its `bias_uniform_init`. The paper names a learnable
  per-frequency bias δ_c; its sign convention (cos((s − t)θ_c + δ_c), key minus query) is
  the one of Re[q̃ᴴ k̃] with δ on the key, as above; the clamp range and the zero start are
  confirmed in the reference code only. As in that code, a δ the optimizer moves outside
  [−2π, 0] gets no gradient there (the clamp's), and stays where it is.
- Without q·k (a synthesizer that computes none), PoPE acts on nothing, as RoPE does, and
  drops δ (`without_dot_product`): a parameter without a gradient stops DDP.
- δ is shared by the stack's layers: attnlab's PE serves every layer and `rotate_key` has
  no layer argument; x-transformers likewise builds one `PolarEmbedding` per stack and
  hands it to every layer. Whether the paper keeps δ per layer was not confirmed.
- Layout: the cosine half first, then the sine half (x-transformers' `cat`); any fixed
  order of the 2d coordinates, the same for q and k, gives the same scores.
- Precision: angles t·θ_c in float64 (as RoPE's), their cosines and sines then cast; the
  key's phase s·θ_c + δ_c is formed by the angle-sum identity from cos(s·θ_c), sin(s·θ_c)
  and cos δ_c, sin δ_c, so long positions keep float64's precision and δ its gradient.
- No context scaling: RoPE's `scaling` options are not offered (the paper reports
  extrapolation past the trained length without any).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, angles
from attnlab.shape import StackShape

DELTA_RANGE = (-2 * math.pi, 0.0)  # δ_c is clamped to [−2π, 0]
BIAS_INITS = ("zero", "uniform")


def phases(pos: Tensor, dim: int, base: float) -> Tensor:
    """[L, dim] t·θ_c, θ_c = base^(−c/dim) for c < dim, in float64: RoPE's angles of a head
    of width 2·dim, one frequency per component."""
    return angles(pos, 2 * dim, base)


def magnitudes(x: Tensor) -> Tensor:
    """μ = softplus(x), in float32 at least (bf16 activations too)."""
    return F.softplus(x.to(torch.promote_types(x.dtype, torch.float32)))


def polar(mu: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """[..., 2d] the real form [μ ⊙ cos φ, μ ⊙ sin φ] of the complex numbers μ·e^{iφ}."""
    return torch.cat((mu * cos, mu * sin), -1)


def clamped(delta: Tensor) -> Tensor:
    """δ clamped to DELTA_RANGE."""
    return delta.clamp(*DELTA_RANGE)


class PoPE(PositionalEncoding):
    rotates = True

    def __init__(self, shape: StackShape, base: float, phase_bias: bool, bias_init: str) -> None:
        super().__init__(shape)
        if base <= 0:
            raise ConfigError(f"pe.base={base} must be positive (θ_c = base^(−c/d))")
        if bias_init not in BIAS_INITS:
            raise ConfigError(f"pe.bias_init={bias_init!r} is not one of: {', '.join(BIAS_INITS)}")
        self.base = base
        self.delta: nn.Parameter | None = None  # δ [H, d], the keys' phase bias
        if phase_bias:
            delta = torch.zeros(shape.n_heads, shape.head_dim)
            if bias_init == "uniform":
                delta.uniform_(*DELTA_RANGE)
            self.delta = nn.Parameter(delta)

    def without_dot_product(self) -> None:
        self.delta = None

    def _cos_sin(self, x: Tensor, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin [L, d] of t·θ_c at positions pos, in `dtype` on x's device."""
        phi = phases(pos, x.shape[-1], self.base)
        return phi.cos().to(x.device, dtype), phi.sin().to(x.device, dtype)

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """q [B, H, L, d] -> q̃ [B, H, L, 2d]: magnitudes softplus(q), phases t·θ."""
        mu = magnitudes(x)
        cos, sin = self._cos_sin(x, pos, mu.dtype)
        return polar(mu, cos, sin).to(x.dtype)

    def rotate_key(self, x: Tensor, pos: Tensor) -> Tensor:
        """k [B, H, L, d] -> k̃ [B, H, L, 2d]: magnitudes softplus(k), phases s·θ + δ."""
        if self.delta is None:
            return self.rotate(x, pos)
        mu = magnitudes(x)
        cos, sin = self._cos_sin(x, pos, mu.dtype)
        delta = clamped(self.delta).to(mu.dtype)[:, None, :]  # [H, 1, d]
        cos_delta, sin_delta = delta.cos(), delta.sin()
        shifted = cos * cos_delta - sin * sin_delta, sin * cos_delta + cos * sin_delta
        return polar(mu, *shifted).to(x.dtype)

    def scale(self, head_dim: int) -> float:
        """1/√d of the head's own width d: `head_dim` here is q̃'s, 2d."""
        return self.shape.head_dim**-0.5
