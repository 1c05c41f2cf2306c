"""Learned absolute positions (BERT; Devlin et al. 2019): x_p = E_tok[t_p] + E_pos[p].

E_pos ∈ R^{max_len×d}, initialized N(0, init_std²) as BERT does (initializer_range 0.02);
positions run from 0. A position ≥ max_len has no embedding: the model raises an error
instead of extrapolating.
"""

from torch import Tensor, nn

from attnlab.pe.base import PositionalEncoding
from attnlab.shape import StackShape


class LearnedPE(PositionalEncoding):
    embeds = True

    def __init__(self, shape: StackShape, max_len: int = 512, init_std: float = 0.02) -> None:
        super().__init__(shape)
        self.max_len = max_len
        self.table = nn.Embedding(max_len, shape.d_model)
        nn.init.normal_(self.table.weight, std=init_std)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + self.table(pos)
