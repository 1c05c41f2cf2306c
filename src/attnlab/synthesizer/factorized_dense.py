"""Factorized Dense Synthesizer (Tay et al., "Synthesizer", arXiv 2005.00743), §3.1.

    A_i = F_A(X_i) ∈ R^a,    B_i = F_B(X_i) ∈ R^b,    a·b = ℓ
    C_i = repeat_interleave(A_i, b) ⊙ tile(B_i, a) = vec(A_i B_iᵀ) ∈ R^ℓ
    Y = softmax(C) G(X)

F_A and F_B are two separate two-layer networks of the Dense synthesizer's form (see
`attnlab.synthesizer.dense`, same per-head and `shared_output` conventions). Key position
m gets C_i[m] = A_i[m // b]·B_i[m mod b]; the logits of a call are the columns of the key
positions, computed without building all ℓ of them.

The repeat order is our choice: the paper says only that A_i and B_i are "tiled" to length
ℓ, and no official code exists for this variant. Tiling both, tile(A_i, b) ⊙ tile(B_i, a),
gives C_i[m] = A_i[m mod a]·B_i[m mod b], which is periodic in m with period lcm(a, b):
when gcd(a, b) > 1 keys m and m + lcm(a, b) always get the same logit, and only a·b/gcd
of the a·b products ever appear (a = b = 16: 16 distinct logits for 256 keys). The
interleave-and-tile form uses every product A_i[r]·B_i[c] exactly once.
"""

from __future__ import annotations

import math

from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.shape import StackShape
from attnlab.synthesizer.base import Synthesis, Synthesizer, require_positive
from attnlab.synthesizer.dense import TokenMLP


def balanced_factors(n: int) -> tuple[int, int]:
    """(a, b) with a·b = n and a the largest divisor of n not above √n."""
    a = max(f for f in range(1, math.isqrt(n) + 1) if n % f == 0)
    return a, n // a


class FactorizedDense(Synthesizer):
    key_positions = True

    def __init__(
        self,
        shape: StackShape,
        max_len: int,
        a: int,
        b: int,
        hidden_dim: int | None,
        shared_output: bool,
    ) -> None:
        super().__init__(shape)
        hidden_dim = shape.head_dim if hidden_dim is None else hidden_dim
        for option, value in (("max_len", max_len), ("a", a), ("b", b), ("hidden_dim", hidden_dim)):
            require_positive(option, value)
        if a * b != max_len:
            fa, fb = balanced_factors(max_len)
            raise ConfigError(
                f"synthesizer.a·synthesizer.b = {a}·{b} = {a * b} must equal "
                f"synthesizer.max_len={max_len}: choose a and b whose product is max_len, "
                f"e.g. synthesizer.a={fa} synthesizer.b={fb}"
            )
        self.max_len, self.b = max_len, b
        self.f_a = TokenMLP(shape, a, hidden_dim, shared_output)
        self.f_b = TokenMLP(shape, b, hidden_dim, shared_output)

    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Synthesis:
        rows, cols = k_pos // self.b, k_pos % self.b
        return Synthesis(dot=None, logits=self.f_a(x, layer, rows) * self.f_b(x, layer, cols))
