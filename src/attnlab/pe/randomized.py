"""Randomized positional encodings (Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani,
Legg, Veness, "Randomized Positional Encodings Boost Length Generalization of
Transformers", ACL 2023, arXiv 2305.16843).

For a forward pass over n positions, draw n distinct integers uniformly from {0, …, L−1}
(L = `max_position`, n ≤ L), sort them, p_0 < p_1 < … < p_{n−1}, and give the base PE
position p_i wherever it would have seen position i:

    embed(x, i) = base.embed(x, p_i)           rotate(x, i) = base.rotate(x, p_i)
    score_bias(q, k, i, j) = base.score_bias(q, k, p_i, p_j)   (reweight, value_term alike)

Trained on lengths n ≪ L, the model meets the encodings of positions up to L − 1, in order
and with gaps; a longer test sequence draws its positions from the same range, so none is
new to it. `base` is any other PE option (`pe@pe.base=<option>`, its options under
`pe.base`). The default is RoPE: of the reference's randomized encodings that evaluate the
base at the drawn absolute positions (sin/cos, learned, RoPE; its ALiBi and relative ones
draw distances, see below), the one that is relative (q·k depends on p_j − p_i) and needs
no table of L rows.

Conventions, against the reference code (google-deepmind/randomized_positional_encodings,
`models/positional_encodings.py` and `models/transformer.py`):

- One draw per forward pass, shared by every sequence of the batch, as the reference
  (`noisy_fixed_positional_encodings` draws one index set and broadcasts it over the batch).
- One draw for every hook and every layer of the pass. The reference draws a new set in
  each attention layer for RoPE and ALiBi (a fresh rng key per layer): a deviation, so that
  one sequence has one set of positions throughout the stack.
- Evaluation randomizes too (`eval_positions=random`, the default): the authors answer
  "we also randomize at test time" (issue #1 of their repository) and their range
  evaluation gives every batch a fresh rng. `eval_positions=plain` uses 0..n−1 instead
  whenever the module is not training (model.eval()).
- Relative bases see p_j − p_i of the drawn absolute positions, as the reference's RoPE
  does. Its ALiBi and Transformer-XL-style relative encodings instead draw sorted distances
  d_1 < d_2 < … from {1, …, L−1} and give the pair (i, j) the distance d_|i−j|, the same
  in every row (Toeplitz); this wrapper does not reproduce that.

Randomness: torch's global generator of the device (`torch.randperm`), which Lightning's
seed_everything(cfg.seed) seeds, so a seed repeats a run's draws. Under DDP each rank draws
from its own generator: ranks seeded alike draw the same positions while their generators
stay in step, which nothing enforces.

Decoding with the cache: a session draws once, at its first step, for the capacity of its
cache (`new_cache(capacity)`: prompt and new tokens), keeps the draw in the cache and indexes
it at each step, so it equals one forward pass over the whole sequence with that draw. A
session that outgrows its draw raises an error. Without the cache every step is a new pass
with a new draw. Beam search reorders rows, never the draw (shared by the batch).

Hooks called outside a stack's forward pass use the last pass's draw, and the positions as
given before any (so a PE built alone behaves as its base). A backward pass that recomputes
attention (model.attention_chunk) must come before the next forward pass, as in training.

Bounds: sequences (and sessions) of more than L positions are refused (pe.max_position); a
base with its own bound must hold every position (its max_len ≥ L). Refused: Transformer-XL
as base (its relative shift assumes consecutive positions), randomized as its own base, and
cross-attention (model.cross_pe: encoder and decoder draw apart). The wrapper declares what
its base does, FlexAttention's score_mod included (the base's, at the drawn positions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnlab.attention.distance import DistanceScores
from attnlab.config.build import build
from attnlab.config.values import is_count
from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, ScoreMod
from attnlab.pe.xl import TransformerXLPE
from attnlab.shape import StackShape

EVAL_POSITIONS = ("random", "plain")


def sorted_positions(n: int, max_position: int, device: torch.device | None = None) -> Tensor:
    """n distinct integers drawn uniformly from 0..max_position−1, ascending [n], from
    torch's global generator of `device`."""
    if n > max_position:
        raise ConfigError(
            f"{n} positions cannot be drawn without repeats from the {max_position} of "
            f"pe.max_position: raise pe.max_position to at least {n} or shorten the sequences"
        )
    return torch.randperm(max_position, device=device)[:n].sort().values


class RandomizedPE(PositionalEncoding):
    max_len_option = "max_position"

    def __init__(
        self,
        shape: StackShape,
        base: Mapping[str, Any],
        max_position: int,
        eval_positions: str,
    ) -> None:
        super().__init__(shape)
        if not is_count(max_position):
            raise ConfigError(
                f"pe.max_position={max_position!r} must be a positive integer (the paper's "
                "example draws from 2048)"
            )
        if eval_positions not in EVAL_POSITIONS:
            raise ConfigError(
                f"pe.eval_positions={eval_positions!r} is not one of: {', '.join(EVAL_POSITIONS)}"
            )
        if shape.cross:
            raise ConfigError(
                "pe=randomized cannot give cross-attention the positions its encoder and "
                "decoder drew apart: set model.cross_pe=false"
            )
        self.base = build(base, shape=shape)
        check_base(self.base, max_position)
        self.max_len, self.eval_positions = max_position, eval_positions
        self.embeds, self.rotates = self.base.embeds, self.base.rotates
        self.adds_score_terms = self.base.adds_score_terms
        self.post_normalization = self.base.post_normalization
        self.reweights = self.base.reweights
        self.needs_query, self.needs_key = self.base.needs_query, self.base.needs_key
        self.flex = self.base.flex
        self.drawn: Tensor | None = None  # p_0 < … < p_{n−1} of the current pass, or None

    @property
    def randomizes(self) -> bool:
        return self.training or self.eval_positions == "random"

    def begin(self, length: int, device: torch.device, drawn: Tensor | None) -> Tensor | None:
        """Draw the positions of a new pass or session, or take the session's draw."""
        if not self.randomizes:
            self.drawn = None
            return None
        if drawn is None:
            drawn = sorted_positions(length, self.max_len, device)
        elif length > drawn.shape[0]:
            raise ValueError(
                f"this decoding session drew {drawn.shape[0]} positions and needs {length}: "
                "make its cache with new_cache(capacity) for every position it will use"
            )
        self.drawn = drawn
        return drawn

    def at(self, pos: Tensor) -> Tensor:
        """The drawn positions p_i at positions i (i itself when nothing is drawn)."""
        return pos if self.drawn is None or not self.randomizes else self.drawn[pos]

    def without_dot_product(self) -> None:
        self.base.without_dot_product()

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.base.embed(x, self.at(pos))

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.base.rotate(x, self.at(pos))

    def rotate_key(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.base.rotate_key(x, self.at(pos))

    def scale(self, head_dim: int) -> float:
        return self.base.scale(head_dim)

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        return self.base.score_bias(q, k, self.at(q_pos), self.at(k_pos), layer)

    def score_mod(self, q: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int) -> ScoreMod:
        return self.base.score_mod(q, self.at(q_pos), self.at(k_pos), layer)

    def distance_scores(self, q_pos: Tensor, k_pos: Tensor) -> DistanceScores | None:
        return self.base.distance_scores(self.at(q_pos), self.at(k_pos))

    def reweight(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return self.base.reweight(weights, self.at(q_pos), self.at(k_pos), layer)

    def value_term(
        self, weights: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        return self.base.value_term(weights, self.at(q_pos), self.at(k_pos), layer)


def check_base(base: PositionalEncoding, max_position: int) -> None:
    """Raise a ConfigError for a base that cannot take positions drawn from 0..max_position−1."""
    if isinstance(base, RandomizedPE):
        raise ConfigError(
            "pe.base=randomized would draw positions among drawn positions: choose another "
            "base, e.g. pe@pe.base=rope"
        )
    if isinstance(base, TransformerXLPE):
        raise ConfigError(
            "pe.base=xl cannot take drawn positions, as its relative shift assumes consecutive "
            "ones: choose another base, e.g. pe@pe.base=rope"
        )
    if base.max_len is not None and base.max_len < max_position:
        raise ConfigError(
            f"pe.base.{base.max_len_option}={base.max_len} cannot hold the positions drawn from "
            f"pe.max_position={max_position}: raise pe.base.{base.max_len_option} to "
            f"{max_position} or lower pe.max_position"
        )
