"""KERPLE, kernelized relative positional embedding (Chi, Fan, Ramadge, Rudnicky, NeurIPS 2022,
arXiv 2205.09921, "KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation").

    scores_ij = q_i·k_j/√d_h + b_h(|i − j|)
    variant=log:    b_h(d) = −r1_h·log(1 + r2_h·d)     r1_h, r2_h ≥ 0.01
    variant=power:  b_h(d) = −r1_h·d^r2_h              r1_h ≥ 0.01, 0.01 ≤ r2_h ≤ 2

Each bias is minus a conditionally positive definite kernel of the distance; the constant
that would make it positive definite shifts every score of a row alike, which softmax
ignores. r1 and r2 are learned per head; one pair of [H] vectors serves every layer, as in
the authors' code (chijames/KERPLE, `ParallelKerpleLog`, `ParallelKerplePower`: one module
handed to every layer). Initialized as there, from torch's global generator:
log r1 ~ U[0, 2), r2 ~ U[0, 1); power r1 ~ U[0, 1), r2 ~ U[0, 2) (the code's `bias_p` and
`bias_a` swap meanings between its two classes; the paper's r1, r2 are used here). No
parameters per position, so no length limit.

Bounds: the authors clamp `.data` in place at every forward pass. Here parameters are never
written in a forward pass, so torch.compile traces it without a graph break, and evaluation,
recomputed blocks (model.attention_chunk) and DDP replicas leave them as the optimizer set
them. The bias reads the clamped values through `bounded`, whose gradient is the clamp's
value gradient except where it would push a value already past a bound further out: a plain
clamp has no gradient past a bound, so a parameter one update pushed there would never move
again; a straight-through clamp lets the stored value run arbitrarily far past the bound
while the loss keeps pushing, and then as long to come back; a softplus/sigmoid
reparametrization changes the init, the gradient scale and what weight decay pulls toward.
So a stored value goes past a bound by about one update (plus what momentum carries) and
comes back with the first push inward, close to the authors' projected updates; only the
bounded values enter the bias, and a checkpoint stores the raw ones.

Distance |i − j| in every stack: a causal stack masks j > i and sees the paper's i − j; a
bidirectional stack (and cross-attention) gets the same kernel both ways, which cannot tell
a key before the query from one after it (as this repo's bidirectional ALiBi); the paper
and its code are causal only. Added after the 1/√d_h scaling, as the authors' code does.
Content-free: softmax keeps the SDPA path, or on CUDA FlexAttention, which computes
b_h(|i − j|) per (i, j) (`score_mod`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.pe.base import DistanceTerm
from attnlab.shape import StackShape

LOWER_BOUND = 0.01  # every r, as in the authors' code
EXPONENT_BOUND = 2.0  # d^r2 is conditionally positive definite for 0 < r2 ≤ 2


class _Bounded(torch.autograd.Function):
    """x clamped to [low, high]; the gradient passes except where it would move a value
    already past a bound further out (under gradient descent, x ← x − lr·grad)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, low: float, high: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (x,) = ctx.saved_tensors
        outward = ((x < ctx.low) & (grad > 0)) | ((x > ctx.high) & (grad < 0))
        return grad.masked_fill(outward, 0.0), None, None


def bounded(x: Tensor, low: float, high: float = math.inf) -> Tensor:
    """x clamped to [low, high], with the gradient of `_Bounded`."""
    return _Bounded.apply(x, low, high)


def log_kernel(r1: Tensor, r2: Tensor, distance: Tensor) -> Tensor:
    """−r1·log(1 + r2·d)."""
    return -r1 * torch.log1p(r2 * distance)


def power_kernel(r1: Tensor, r2: Tensor, distance: Tensor) -> Tensor:
    """−r1·d^r2."""
    return -r1 * distance.pow(r2)


class Variant(NamedTuple):
    kernel: Callable[[Tensor, Tensor, Tensor], Tensor]
    r2_bound: float  # upper bound of r2
    r1_init: float  # r1 ~ U[0, r1_init)
    r2_init: float  # r2 ~ U[0, r2_init)


VARIANTS = {
    "log": Variant(log_kernel, math.inf, 2.0, 1.0),
    "power": Variant(power_kernel, EXPONENT_BOUND, 1.0, 2.0),
}


class KERPLE(DistanceTerm):
    def __init__(self, shape: StackShape, variant: str) -> None:
        super().__init__(shape)
        if variant not in VARIANTS:
            raise ConfigError(f"pe.variant={variant!r} is not one of: {', '.join(VARIANTS)}")
        self.variant = variant
        self.kernel, self.r2_bound, r1_init, r2_init = VARIANTS[variant]
        self.r1 = nn.Parameter(torch.rand(shape.n_heads) * r1_init)
        self.r2 = nn.Parameter(torch.rand(shape.n_heads) * r2_init)

    def bounded(self) -> tuple[Tensor, Tensor]:
        """r1 and r2 [H] within their bounds, as the bias uses them."""
        return bounded(self.r1, LOWER_BOUND), bounded(self.r2, LOWER_BOUND, self.r2_bound)

    def distance_term(self, distances: Tensor) -> Tensor:
        """[H, R] b_h(|d|)."""
        r1, r2 = self.bounded()
        return self.kernel(r1[:, None], r2[:, None], distances.abs().to(r1.dtype))
