"""FIRE, functional interpolation for relative positions (Li, You, Guruganesh, Ainslie,
Ontañón, Zaheer, Sanghai, Yang, Kumar, Bhojanapalli, ICLR 2024, arXiv 2310.04418,
"Functional Interpolation for Relative Positions Improves Long Context Transformers").

    scores_ij = q_i·k_j/√d_h + f_θ(u_ij)_h,   u_ij = ψ(i − j) / ψ(max(L, i)),   ψ(x) = log(c·x + 1)

f_θ is one MLP 1 → `mlp_width` → H with a ReLU, whose H outputs are the heads' biases; c and
the threshold L are learned. Dividing by ψ(max(L, i)) maps the distances a query sees into
[0, 1] once i ≥ L, so longer sequences are interpolated into the inputs seen in training
(progressive interpolation); below L the divisor stays ψ(L), so short sequences are not
stretched over the whole range. The log transform ψ spreads out short distances.

Conventions, as in a widely copied PyTorch port (e.g. mcleish7/arithmetic, class `FIRE`):
c starts at `init_c` = 0.1; L = |L_mult·L0| with L0 = `init_L` = 512 fixed and L_mult
learned from 1; ψ(x) = log(|c|·x + 1), the absolute values guarding against c or L_mult
turning negative; 10⁻⁶ added to the divisor; the MLP keeps torch's default init (drawn from
the global generator). One f_θ, c and L serve every layer, as T5's table does: whether the
paper shares them across layers could not be checked, so this is a choice. The port's
randomized training positions are not implemented.

Bidirectional stacks (not in the paper, which is causal only): a key after the query gets
u_ij = −ψ(j − i)/ψ(max(L, i, n)), n the last key position, and one before it
ψ(i − j)/ψ(max(L, i, n)), so f_θ can tell the two apart and |u| ≤ 1; the causal divisor
ψ(max(L, i)) would leave keys far after the query outside [−1, 1]. In a padded batch n
counts the padding. Cross-attention takes this form too (i the decoder's position, j the
memory's). Causal stacks compute the same signed input with the paper's divisor; their
future keys are masked. Cached decoding gives the full rows: u_ij depends on i, j and,
bidirectionally, n only.

The bias is computed in the parameters' precision with autocast off: bf16 keeps 8
significant bits of u, so at long range, where ψ is flat, many neighbouring distances would
share one input. Content-free, but an MLP per (i, j): as a FlexAttention score_mod it would
sum over the hidden units inside the kernel for every score, which is not attempted here, so
no `flex`.

Where every query has the same divisor (a bidirectional stack: reach_i is the last position;
a causal one while every position is below L), u_ij depends on i − j alone: f_θ then runs on
the Lq + Lk − 1 distances, not on every (i, j), and on the CPU softmax takes the fused path
of `attnlab.attention.distance`. A causal stack longer than L gets the MLP of every (i, j).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.attention.distance import DistanceScores, distance_span
from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, relative_positions
from attnlab.shape import StackShape

EPS = 1e-6  # added to the divisor ψ(max(L, i))


def psi(x: Tensor, c: Tensor) -> Tensor:
    """ψ(x) = log(|c|·x + 1), for x ≥ 0."""
    return torch.log1p(c.abs() * x)


def divisors(q_pos: Tensor, k_pos: Tensor, c: Tensor, threshold: Tensor, causal: bool) -> Tensor:
    """[Lq] ψ(max(L, reach_i)) + ε, where reach_i is i in a causal stack and max(i, last key
    position) otherwise."""
    reach = q_pos.to(c.dtype)
    if not causal:
        reach = torch.maximum(reach, k_pos.max().to(c.dtype))
    return psi(torch.maximum(reach, threshold), c) + EPS


def mlp_inputs(q_pos: Tensor, k_pos: Tensor, c: Tensor, threshold: Tensor, causal: bool) -> Tensor:
    """[Lq, Lk] inputs u_ij = sgn(i − j)·ψ(|i − j|)/(ψ(max(L, reach_i)) + ε)."""
    rel = -relative_positions(q_pos, k_pos).to(c.dtype)  # i − j
    divisor = divisors(q_pos, k_pos, c, threshold, causal)
    return rel.sign() * psi(rel.abs(), c) / divisor[:, None]


class FIRE(PositionalEncoding):
    adds_score_terms = True

    def __init__(self, shape: StackShape, mlp_width: int, init_c: float, init_L: float) -> None:
        super().__init__(shape)
        if mlp_width < 1:
            raise ConfigError(f"pe.mlp_width={mlp_width} must be at least 1 (FIRE uses 32)")
        if init_c <= 0:
            raise ConfigError(
                f"pe.init_c={init_c} must be positive (ψ(x) = log(c·x + 1); FIRE uses 0.1)"
            )
        if init_L <= 0:
            raise ConfigError(
                f"pe.init_L={init_L} must be positive (the threshold L in ψ(max(L, i)); "
                "FIRE uses 512)"
            )
        self.causal, self.init_L = shape.causal, float(init_L)
        self.mlp = nn.Sequential(
            nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, shape.n_heads)
        )
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_mult = nn.Parameter(torch.tensor(1.0))

    def threshold(self) -> Tensor:
        """L = |L_mult·L0|."""
        return (self.L_mult * self.init_L).abs()

    def mlp_inputs(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """[Lq, Lk] inputs u_ij of f_θ."""
        return mlp_inputs(q_pos, k_pos, self.c, self.threshold(), self.causal)

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """[1, H, Lq, Lk], the same for every layer."""
        scores = self.distance_scores(q_pos, k_pos)
        if scores is not None:
            return scores.expanded()[None]
        with torch.autocast(q_pos.device.type, enabled=False):
            bias = self.mlp(self.mlp_inputs(q_pos, k_pos)[..., None])
        return bias.permute(2, 0, 1)[None]

    def distance_scores(self, q_pos: Tensor, k_pos: Tensor) -> DistanceScores | None:
        """f_θ over the distances alone where every query has the same divisor: always in a
        bidirectional stack (reach_i is the last position), and in a causal one while every
        query is below the threshold L; over consecutive positions."""
        span = distance_span(q_pos, k_pos)
        if span is None:
            return None
        ends = q_pos[[0, -1]]
        divisor = divisors(ends, k_pos, self.c, self.threshold(), self.causal)
        if divisor[0] != divisor[1]:
            return None
        rel = -span.distances(q_pos.device).to(self.c.dtype)  # i − j
        with torch.autocast(q_pos.device.type, enabled=False):
            term = self.mlp((rel.sign() * psi(rel.abs(), self.c) / divisor[0])[:, None])
        return DistanceScores(term.T, span)
