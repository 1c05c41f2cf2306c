"""T5 relative attention bias (Raffel et al., JMLR 2020, arXiv 1910.10683).

    scores_ij = q_i·k_j/√d_h + b_h[bucket(j − i)]

bucket() as in mesh-tensorflow `_relative_position_bucket` (and HF `T5Attention`), with
rel = j − i (key minus query, negative = past): bidirectional stacks use half the buckets
per direction, future keys (rel > 0) in the upper half, so bucket num_buckets/2 is never
used; causal stacks use n = max(i − j, 0), future keys falling in bucket 0 with distance 0
(they are masked anyway). Distances below half the range get a bucket each, the rest are
spaced logarithmically up to `max_distance`, beyond which all share the last bucket; the
log is taken in float32 and truncated toward zero, exactly as the reference does.

One table b [num_buckets, H] per stack: T5 keeps it in layer 0 and reuses the bias in every
layer, so here the same table serves every `layer`. Initialized N(0, d_model^(−1/2)) as HF
does (`initializer_factor` 1). Convention: T5 has no 1/√d_h and folds it into the init of
W_q; attnlab keeps the explicit 1/√d_h (the default `scale`), so that only the position term
differs between PEs. T5 puts no bias on cross-attention: keep model.cross_pe=false.
The bias is content-free, so softmax attention keeps the fused SDPA path, or on CUDA
FlexAttention, which reads b_h[bucket(j − i)] per (i, j) (`score_mod`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.pe.base import DistanceTerm
from attnlab.shape import StackShape


def relative_position_bucket(
    rel: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5's bucket of each relative position rel = j − i (an integer tensor)."""
    offset = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        offset = (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        n = (-rel).clamp_min(0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(n.clamp_min(max_exact).float() / max_exact) / math.log(
        max_distance / max_exact
    )
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    return offset + torch.where(n < max_exact, n, large.clamp_max(num_buckets - 1))


def last_bucket_start(buckets: Tensor) -> int:
    """The first distance n whose bucket (of buckets [n] over n = 0, 1, …, non-decreasing) is
    the last: every distance from there on shares it, on each side."""
    return int((buckets < buckets[-1]).sum())


class T5PE(DistanceTerm):
    def __init__(self, shape: StackShape, num_buckets: int, max_distance: int) -> None:
        super().__init__(shape)
        bidirectional = not shape.causal
        if bidirectional and num_buckets % 2:
            raise ConfigError(
                f"pe.num_buckets={num_buckets} must be even in a bidirectional stack "
                "(half the buckets for each direction)"
            )
        per_direction = num_buckets // 2 if bidirectional else num_buckets
        if per_direction < 2:
            raise ConfigError(
                f"pe.num_buckets={num_buckets} is too small: use at least "
                f"{4 if bidirectional else 2} (T5 uses 32)"
            )
        if max_distance <= per_direction // 2:
            raise ConfigError(
                f"pe.max_distance={max_distance} must exceed {per_direction // 2}, where the "
                "logarithmic buckets start (T5 uses 128)"
            )
        self.bidirectional = bidirectional
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.randn(num_buckets, shape.n_heads) * shape.d_model**-0.5)
        self.far = last_bucket_start(self.bucket(-torch.arange(max_distance + 1, device="cpu")))

    def distance_term(self, distances: Tensor) -> Tensor:
        """[H, R] b_h[bucket(d)]."""
        return self.table[self.bucket(distances)].T

    def bucket(self, rel: Tensor) -> Tensor:
        return relative_position_bucket(
            rel, self.bidirectional, self.num_buckets, self.max_distance
        )
