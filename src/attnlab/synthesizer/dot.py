"""Dot-product attention (Vaswani et al. 2017): scores_ij = q_i·k_j/√d_h.

The vanilla synthesizer: it only asks the core for the scaled dot product.
"""

from torch import Tensor

from attnlab.synthesizer.base import Synthesis, Synthesizer

DOT_ONLY = Synthesis(dot=1.0, logits=None)


class Dot(Synthesizer):
    needs_query = True
    needs_key = True
    plain_dot = True

    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Synthesis:
        return DOT_ONLY
