"""Random Synthesizer (Tay et al., "Synthesizer", arXiv 2005.00743, ICML 2021), §3.2.

    B = R ∈ R^{ℓ×ℓ},    Y = softmax(B) G(X)

R is one input-independent matrix per head and layer, ℓ = `max_len`. Its entry (i, j) is
the logit of query position i for key position j: the logits of a call are R[q_pos[i],
k_pos[j]] (slices of R for shorter sequences; cached decoding with q_pos = [t] takes row t),
as in the released mesh-tensorflow code (`synthetic_attention`, mode `random`). Masks, PE
score terms and the normalizer apply to these logits as to dot-product ones. No q or k is
computed; v is the usual value projection.

`trainable: false` is the paper's "Fixed Random": R stays at its initialization and is a
buffer, saved in the state dict so a checkpoint reproduces the same attention.

Initialization: glorot-uniform, U(±√(6/(fan_in + fan_out))), with the fans TensorFlow
computes for mesh-tf's variable of shape [length, heads, memory_length] = [ℓ, H, ℓ]:
fan_in = H·ℓ, fan_out = ℓ·ℓ. This bound (≈0.0047 at ℓ = 512, H = 8) is far smaller than
the 2-D glorot bound √(3/ℓ) of one ℓ×ℓ matrix, so attention starts close to uniform.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.shape import StackShape
from attnlab.synthesizer.base import (
    Synthesis,
    Synthesizer,
    at_positions,
    glorot_uniform,
    require_positive,
)


class Random(Synthesizer):
    key_positions = query_positions = True  # a learned or fixed table over (i, j)
    per_layer = ("r",)

    def __init__(self, shape: StackShape, max_len: int, trainable: bool) -> None:
        super().__init__(shape)
        require_positive("max_len", max_len)
        self.max_len = max_len
        h = shape.n_heads
        r = glorot_uniform((shape.n_layers, h, max_len, max_len), h * max_len, max_len**2)
        if trainable:
            self.r = nn.Parameter(r)
        else:
            self.register_buffer("r", r)

    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Synthesis:
        return Synthesis(dot=None, logits=at_positions(self.r[layer], q_pos, k_pos)[None])
