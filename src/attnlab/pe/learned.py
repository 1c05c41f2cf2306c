"""Learned absolute positions (BERT; Devlin et al. 2019): x_p = E_tok[t_p] + E_pos[p].

E_pos ∈ R^{max_len×d}; positions run from 0. A position ≥ max_len has no embedding: the
model raises an error instead of extrapolating.

Initialization: on the scale of the token embeddings as they are added, so that neither
signal drowns the other at the start of training. The papers agree on equal scales: BERT
draws E_tok, E_pos and the segment embeddings alike from N(0, 0.02²) (initializer_range)
and adds them unscaled; the learned positions that Vaswani et al. 2017 (§3.5) compare with
sinusoids are those of ConvS2S (Gehring et al. 2017, arXiv 1705.03122), whose word and
position embeddings are both drawn from N(0, 0.1²). attnlab draws E_pos from N(0, σ²) with
σ the RMS of its token embeddings as added (`StackShape.embedding_rms`): 1 with
model.embed_scale (N(0, 1/d)·√d, Vaswani et al.), model.init_std without (BERT's 0.02 by
default). `init_std` sets σ explicitly instead.
"""

from torch import Tensor, nn

from attnlab.config.values import is_number, require_counts
from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding
from attnlab.shape import StackShape


class LearnedPE(PositionalEncoding):
    embeds = True

    def __init__(self, shape: StackShape, max_len: int, init_std: float | None) -> None:
        super().__init__(shape)
        if init_std is not None and not (is_number(init_std) and init_std > 0):
            raise ConfigError(
                f"pe.init_std={init_std!r} must be a positive number, or null for the token "
                "embeddings' scale"
            )
        require_counts("pe", max_len=max_len)
        self.max_len = max_len
        self.table = nn.Embedding(max_len, shape.d_model)
        std = shape.embedding_rms if init_std is None else init_std
        nn.init.normal_(self.table.weight, std=std)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + self.table(pos)
