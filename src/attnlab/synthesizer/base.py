"""The synthesizer interface: what produces the pre-normalization score matrix.

A synthesizer returns a `Synthesis`: the weight on the scaled dot product q·k (None when it
computes no q·k) and synthesized logits broadcastable to [B, H, Lq, Lk] (None for pure
dot-product attention). The attention core forms

    scores = dot · scale · q·kᵀ + logits (+ the PE's score term, + the mask)

so every mask, PE bias and normalizer applies to synthesized logits exactly as to
dot-product ones. Logits are indexed by the absolute query and key positions: parameters
built at `max_len` are sliced for shorter sequences, and cached decoding takes the row of
the current position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.shape import StackShape


@dataclass(frozen=True)
class Synthesis:
    dot: float | Tensor | None  # weight on scale·q·kᵀ; None: no dot product
    logits: Tensor | None  # [B|1, H, Lq, Lk]


class Synthesizer(nn.Module):
    max_len: int | None = None  # positions must be < max_len; None: unbounded
    max_len_option = "max_len"  # the option that sets max_len, for error messages
    needs_query = False
    needs_key = False
    # Its logits read the keys' positions (a table column per key j), or the query's (a row
    # per query i): permuting the tokens then changes the weights (the permutation study).
    key_positions = False
    query_positions = False
    # The synthesis is the scaled dot product alone (dot 1, no logits), so the core may let
    # F.scaled_dot_product_attention compute it from q, k and v without forming the scores.
    plain_dot = False
    # attributes holding an entry for each layer of the stack (attnlab.shape.per_layer_parameters)
    per_layer: tuple[str, ...] = ()

    def __init__(self, shape: StackShape) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Synthesis:
        """x [B, Lq, d]: the (normalized) query-side input of the attention sublayer."""
        raise NotImplementedError


def require_positive(option: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"synthesizer.{option}={value} must be a positive integer")


def glorot_uniform(shape: tuple[int, ...], fan_in: int, fan_out: int) -> Tensor:
    """A tensor ~ U(±√(6/(fan_in + fan_out))); the fans are given because mesh-tf's differ
    from the per-matrix ones (see attnlab.synthesizer.random)."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return torch.empty(shape).uniform_(-bound, bound)


def at_positions(table: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """table[..., q_pos[i], k_pos[j]]: [..., Lq, Lk] from a [..., max_len, max_len] table."""
    return table[..., q_pos[:, None], k_pos[None, :]]
