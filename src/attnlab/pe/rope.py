"""RoPE, rotary position embedding (Su et al., RoFormer, arXiv 2104.09864).

q̃_m = R_m q_m, k̃_n = R_n k_n, with R_m block-diagonal 2×2 rotations by m·θ_i,
θ_i = base^(−2i/d_r) for i < d_r/2, so q̃_m·k̃_n = q_mᵀ R_{n−m} k_n depends on n − m only.
Applied per head to q and k after projection, never to v.

Conventions: `layout="interleaved"` rotates pairs (2i, 2i+1) as the official RoFormer code
does; `layout="half"` rotates (i, i + d_r/2) as GPT-NeoX/LLaMA do (the two differ by a fixed
permutation of head dimensions). `rotary_dim` (default: all of d_h) rotates only the first
d_r dimensions and passes the rest through (GPT-NeoX's partial rotary); θ uses d_r. It is a
number of dimensions (an integer) or a fraction of d_h (a number in (0, 1], GPT-NeoX's
`rotary_pct`: Kazemnejad et al. 2023, arXiv 2305.19466, rotate a quarter).
RoPE acts through q·k only: with a synthesizer that computes no q·k it has no effect.

Context extension (`scaling`, static, with s = `scaling_factor` = the evaluation context / the
training context L = `original_max_len`), to evaluate past the trained length; each keeps
q̃_m·k̃_n a function of n − m, so cached decoding is unchanged:

- `linear`, position interpolation (Chen, Wong, Chen, Tian 2023, "Extending Context Window of
  Large Language Models via Positional Interpolation", arXiv 2306.15595, §2.3): position m is
  read as m/s, i.e. θ_i' = θ_i / s.
- `ntk`, "NTK-aware" scaling (bloc97 2023, formalized in Peng et al. 2023 below, §3.1
  Eq. 14–16 and App. A.1): the base becomes b' = b·s^(d_r/(d_r−2)), which leaves the highest
  frequency θ_0 as it is and divides the lowest, θ_{d_r/2−1}, by exactly s.
- `yarn` (Peng, Quesnelle, Fan, Shippole 2023, "YaRN: Efficient Context Window Extension of
  Large Language Models", arXiv 2309.00071, ICLR 2024): "NTK-by-parts" (§3.2 Eq. 17–20) with
  r_i = L/λ_i = L·θ_i/2π and the ramp γ(r) = 0 for r < α, 1 for r > β, (r − α)/(β − α)
  between (α = `yarn_alpha`, β = `yarn_beta`, the paper's 1 and 32 for LLaMA):
  θ_i' = (1 − γ(r_i))·θ_i/s + γ(r_i)·θ_i; plus the attention temperature (§3.4 Eq. 21–22):
  q and k are each multiplied by √(1/t) = 0.1·ln(s) + 1 (≈ 1.208 for s = 8, Eq. 25), so
  the logits by (0.1·ln(s) + 1)².

YaRN conventions: the ramp is the paper's, linear in r. The reference code (jquesnelle/yarn's
scaled_rope, HF transformers' `_compute_yarn_parameters`) turns r = β and r = α into
fractional pair indices, floors and ceils them, and ramps linearly in the pair index between:
with few pairs or a short L the two differ (d_r = 8, b = 10⁴, s = 4, L = 512: θ_1' = 0.0423
here, 0.0625 there). Eq. 17 writes λ with a base b'; NTK-by-parts changes no base, so
λ_i = 2π/θ_i with the model's base. The temperature multiplies the whole head, the dimensions
past `rotary_dim` too, so that all of q·k is divided by t as in Eq. 21 (HF scales its cos and
sin tables, which leaves partial rotary's pass-through dimensions unscaled). PI and NTK-aware
scaling have no temperature.

The scaling options change no weight: eval.py may set them on a checkpoint trained without
them (`RoPE.evaluation_options`, which subclasses inherit), while a resumed training run may not
change them.
Dynamic scaling (YaRN §3.3: s = max(1, l/L) at the current length l) is not implemented: it
changes the angles of every key as the sequence grows, so a cache must hold keys before the
rotation, and the attention core caches rotated keys (`rotate_and_cache`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, angles
from attnlab.shape import StackShape
from attnlab.tensors import float64_home

SCALINGS = ("linear", "ntk", "yarn")
# the options each scaling takes (linear and ntk do not read the training context, but take it
# so that one command can compare the three); any other keeps its default
TAKES = {
    "linear": ("scaling_factor", "original_max_len"),
    "ntk": ("scaling_factor", "original_max_len"),
    "yarn": ("scaling_factor", "original_max_len", "yarn_alpha", "yarn_beta"),
}
DEFAULTS = {"scaling_factor": None, "original_max_len": None, "yarn_alpha": 1.0, "yarn_beta": 32.0}


def rotate(x: Tensor, pos: Tensor, base: float, layout: str) -> Tensor:
    """Rotate the last dimension of x [..., L, d] (d even) by positions pos [L]."""
    return rotate_by(x, angles(pos, x.shape[-1], base), layout)


def rotate_by(x: Tensor, theta: Tensor, layout: str) -> Tensor:
    """Rotate the last dimension of x [..., L, d] (d even) by angles theta [L, d/2]."""
    d = x.shape[-1]
    cos, sin = theta.cos().to(x.device, x.dtype), theta.sin().to(x.device, x.dtype)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


def yarn_ramp(r: Tensor, alpha: float, beta: float) -> Tensor:
    """γ(r) of YaRN's Eq. 18: 0 for r < α, 1 for r > β, linear between."""
    return ((r - alpha) / (beta - alpha)).clamp(0.0, 1.0)


def yarn_temperature(factor: float) -> float:
    """√(1/t) = 0.1·ln(s) + 1 (YaRN's Eq. 22): the factor on q and on k."""
    return 0.1 * math.log(factor) + 1.0


def inverse_frequencies(
    dim: int,
    base: float,
    scaling: str | None,
    factor: float | None,
    original_max_len: int | None,
    alpha: float,
    beta: float,
) -> Tensor:
    """θ_i' [dim/2] of a `scaling` (None: θ_i = base^(−2i/dim)), in float64 on the CPU."""
    one = torch.ones(1)
    theta = angles(one, dim, base)[0]  # the angles of position 1
    if scaling is None:
        return theta
    assert factor is not None
    if scaling == "linear":
        return theta / factor
    if scaling == "ntk":
        return angles(one, dim, base * factor ** (dim / (dim - 2)))[0]
    assert original_max_len is not None
    gamma = yarn_ramp(original_max_len * theta / (2 * math.pi), alpha, beta)
    return (1 - gamma) * theta / factor + gamma * theta


def rotary_width(rotary_dim: int | float | None, head_dim: int) -> int:
    """d_r: all of the head (None), a number of dimensions (an integer) or a fraction of the
    head (a number): it must make an even whole number of dimensions (checked by the caller
    for an integer)."""
    if rotary_dim is None:
        return head_dim
    if isinstance(rotary_dim, int):
        return rotary_dim
    width = rotary_dim * head_dim
    if not (0 < rotary_dim <= 1 and width.is_integer() and width % 2 == 0):
        raise ConfigError(
            f"pe.rotary_dim={rotary_dim} is {width:g} of the head's {head_dim} dimensions: give "
            "a fraction in (0, 1] that makes an even whole number of them, or a number of "
            "dimensions (an even integer)"
        )
    return int(width)


def check_scaling(scaling: str | None, options: dict[str, float | None], rotary_dim: int) -> None:
    """Raise a ConfigError where `scaling` and its `options` (the keys of DEFAULTS) do not fit."""
    if scaling is not None and scaling not in SCALINGS:
        raise ConfigError(f"pe.scaling={scaling!r} is not one of: null, {', '.join(SCALINGS)}")
    for name, value in options.items():
        if name not in TAKES.get(scaling, ()) and value != DEFAULTS[name]:
            readers = " or ".join(s for s in SCALINGS if name in TAKES[s])
            raise ConfigError(
                f"pe.{name}={value} has no effect with pe.scaling={scaling or 'null'}: drop it, "
                f"or choose pe.scaling={readers}"
            )
    if scaling is None:
        return
    factor, length = options["scaling_factor"], options["original_max_len"]
    alpha, beta = options["yarn_alpha"], options["yarn_beta"]
    if factor is None:
        raise ConfigError(
            f"pe.scaling={scaling} needs pe.scaling_factor, s = the evaluation context / the "
            "training context (at least 1)"
        )
    if factor < 1:
        raise ConfigError(
            f"pe.scaling_factor={factor} must be at least 1 (s = the evaluation context / the "
            "training context)"
        )
    if scaling == "ntk" and rotary_dim < 4:
        raise ConfigError(
            f"pe.scaling=ntk needs at least 4 rotated dimensions, not {rotary_dim} "
            "(b' = b·s^(d/(d−2))): raise pe.rotary_dim or choose pe.scaling=linear"
        )
    if scaling == "yarn" and length is None:
        raise ConfigError(
            "pe.scaling=yarn needs pe.original_max_len, the context the model was trained on "
            "(task.data.block_size for task=lm)"
        )
    if length is not None and (not isinstance(length, int) or length < 1):
        raise ConfigError(f"pe.original_max_len={length} must be a positive number of positions")
    if scaling == "yarn" and not 0 <= alpha < beta:
        raise ConfigError(
            f"pe.yarn_alpha={alpha} and pe.yarn_beta={beta} must satisfy "
            "0 ≤ yarn_alpha < yarn_beta (the paper's are 1 and 32)"
        )


class RoPE(PositionalEncoding):
    rotates = True
    evaluation_options = (
        "scaling",
        "scaling_factor",
        "original_max_len",
        "yarn_alpha",
        "yarn_beta",
    )

    def __init__(
        self,
        shape: StackShape,
        base: float,
        rotary_dim: int | float | None,
        layout: str,
        scaling: str | None,
        scaling_factor: float | None,
        original_max_len: int | None,
        yarn_alpha: float,
        yarn_beta: float,
    ) -> None:
        super().__init__(shape)
        self.rotary_dim = rotary_width(rotary_dim, shape.head_dim)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= shape.head_dim:
            raise ConfigError(
                f"pe.rotary_dim={rotary_dim} must be even and between 2 and the head width "
                f"{shape.head_dim}"
            )
        if base <= 0:
            raise ConfigError(f"pe.base={base} must be positive (θ_i = base^(−2i/d))")
        if layout not in ("interleaved", "half"):
            raise ConfigError(f"pe.layout={layout!r} is not one of: interleaved, half")
        options = {
            "scaling_factor": scaling_factor,
            "original_max_len": original_max_len,
            "yarn_alpha": yarn_alpha,
            "yarn_beta": yarn_beta,
        }
        check_scaling(scaling, options, self.rotary_dim)
        self.base, self.layout, self.scaling = base, layout, scaling
        self.frequencies = inverse_frequencies(
            self.rotary_dim, base, scaling, scaling_factor, original_max_len, yarn_alpha, yarn_beta
        )  # a plain tensor, not a buffer: no state, and never cast below float64
        self._copy: Tensor | None = None  # frequencies on the device rotations run on
        self.temperature = yarn_temperature(scaling_factor) if scaling == "yarn" else 1.0

    def frequencies_on(self, device: torch.device) -> Tensor:
        """`frequencies` on `device`, copied there once (not at every rotation)."""
        if self._copy is None or self._copy.device != device:
            self._copy = self.frequencies.to(device)
        return self._copy

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        d = self.rotary_dim
        home = float64_home(pos.device)
        theta = pos.to(home, torch.float64)[:, None] * self.frequencies_on(home)[None, :]
        out = rotate_by(x[..., :d], theta, self.layout)
        if d < x.shape[-1]:
            out = torch.cat((out, x[..., d:]), -1)
        return out if self.temperature == 1.0 else out * self.temperature
