"""Factorized Random Synthesizer (Tay et al., "Synthesizer", arXiv 2005.00743), §3.2.

    B = R₁ R₂ᵀ,    R₁, R₂ ∈ R^{ℓ×k},    Y = softmax(B) G(X)

per head and layer, ℓ = `max_len`: 2ℓk parameters instead of ℓ² (low rank k). As for
Random, the logits of a call are B[q_pos[i], k_pos[j]] = R₁[q_pos[i]]·R₂[k_pos[j]], so
shorter sequences use the leading block and cached decoding (q_pos = [t]) takes row t.

This is the paper's form. The released mesh-tensorflow code (`synthetic_attention`, mode
`factorized`) computes something else: it declares R₁ and R₂ with axes [k, heads,
memory_length] and asks the einsum for [length, heads, memory_length], so mtf contracts k
and broadcasts the new length axis. Its logits are Σ_t R₁[t, h, m]·R₂[t, h, m], one vector
over keys repeated for every query: a query-independent distribution, not R₁R₂ᵀ. It also
fixes ℓ at 512 regardless of `max_length`.

Initialization: glorot-uniform with the fans TensorFlow computes for mesh-tf's variables of
shape [k, H, ℓ]: fan_in = H·k, fan_out = ℓ·k (see `attnlab.synthesizer.random`).
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.shape import StackShape
from attnlab.synthesizer.base import Synthesis, Synthesizer, glorot_uniform, require_positive


class FactorizedRandom(Synthesizer):
    key_positions = query_positions = True
    per_layer = ("r1", "r2")

    def __init__(self, shape: StackShape, max_len: int, k: int) -> None:
        super().__init__(shape)
        require_positive("max_len", max_len)
        require_positive("k", k)
        self.max_len = max_len
        h = shape.n_heads
        size = (shape.n_layers, h, max_len, k)
        self.r1 = nn.Parameter(glorot_uniform(size, h * k, max_len * k))
        self.r2 = nn.Parameter(glorot_uniform(size, h * k, max_len * k))

    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Synthesis:
        r1 = self.r1[layer][:, q_pos]  # [H, Lq, k]
        r2 = self.r2[layer][:, k_pos]  # [H, Lk, k]
        return Synthesis(dot=None, logits=(r1 @ r2.transpose(-2, -1))[None])
