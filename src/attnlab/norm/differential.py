"""Differential attention (Ye, Dong, Xia, Sun, Zhu, Huang, Wei, "Differential Transformer",
ICLR 2025, arXiv 2410.05258): heads come in pairs, and a pair attends with the difference of
its two softmax maps,

    A = softmax(Q₁K₁ᵀ/√d) − λ · softmax(Q₂K₂ᵀ/√d),
    λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init,   λ_init = 0.8 − 0.6 · exp(−0.3 · (l − 1)),

l the layer's number counted from 1 (attnlab's `layer` + 1: λ_init = 0.2 in the first
layer), so that noise common to both maps cancels. The pair's output A·V, V of width 2d,
goes through an RMSNorm over its 2d features (the paper's per-head "GroupNorm") and is
multiplied by (1 − λ_init): o = (1 − λ_init) · RMSNorm(A·V).

How it fits attnlab: heads 2p and 2p + 1 form pair p (n_heads even; the paper's h heads are
attnlab's 2h). Their scores are Q₁K₁ᵀ and Q₂K₂ᵀ, and `normalize` returns the pair's one map A
for both, so head 2p outputs A·V_2p and head 2p + 1 outputs A·V_2p+1; concatenated, these are
A·[V_2p, V_2p+1], the paper's one map applied to a 2d-wide value. Heads 2p and 2p + 1 are
adjacent columns of the value projection and of the output projection's input, the layout
of the authors' code (its v viewed as h heads of 2d). `output` (the normalizers' hook after
the weights are applied to v) applies the RMSNorm over [o_2p, o_2p+1] and the (1 − λ_init).

Conventions, as in the authors' code (microsoft/unilm, Diff-Transformer/
multihead_diffattn.py, read for this): one λ per layer, shared by its pairs, from four
learned vectors λ_q1, λ_k1, λ_q2, λ_k2 of the q/k head width d, each drawn from N(0, 0.1²)
(`lambda_std`); λ is computed in the parameters' dtype (float32 but in a float64 model);
the RMSNorm has ε = 1e-5 and a learned gain of width 2·d_v per layer, shared by the pairs and
starting at 1 (`gain: false` leaves it out), computed in float32 at least. Not confirmed
from the paper's text, which was not reached here: the λ vectors' initialization, the
sharing of λ and of the gain across a layer's pairs, ε, and whether the gain is learned
(the code read has it; other copies of that code leave it out). The λ vectors and the gain
are vectors, so attnlab's optimizer gives them no weight decay (the authors' setting was
not checked). The authors' code computes the gain's product in the activations' dtype;
here it is in float32, with the rest of the norm.

Declarations: rows sum to 1 − λ over the visible keys, not to 1 (a value bias does not pass
through), but to that one number whatever the scores (`fixed_row_sums`): identical values
give identical outputs, as under softmax. Each softmax is invariant to a per-row shift of its
own head's scores, so a key bias, which shifts each head's row by q_i·b, changes nothing
(`shift_invariant`). Masked keys get weight 0 in both maps, and a query with no visible key
gets all-zero weights and a zero output. Not for SDPA (the plain path forms both maps).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.norm.base import Normalizer, exp_normalize
from attnlab.shape import StackShape


def lambda_init(layer: int) -> float:
    """λ_init of attnlab's `layer` (from 0): 0.8 − 0.6·exp(−0.3·(l − 1)) with l = layer + 1."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class LayerLambda(nn.Module):
    """One layer's λ vectors and RMSNorm gain."""

    def __init__(self, shape: StackShape, lambda_std: float, gain: bool) -> None:
        super().__init__()
        for name in ("q1", "k1", "q2", "k2"):
            self.register_parameter(name, nn.Parameter(torch.randn(shape.head_dim) * lambda_std))
        self.gain = nn.Parameter(torch.ones(2 * shape.value_dim)) if gain else None


class Differential(Normalizer):
    shift_invariant = True
    fixed_row_sums = True
    acts_on_output = True
    paired_heads = "each pair subtracts one softmax map from the other"
    per_layer = ("layers",)

    def __init__(self, shape: StackShape, lambda_std: float, gain: bool, eps: float) -> None:
        super().__init__(shape)
        self.eps = eps
        self.layers = nn.ModuleList(
            LayerLambda(shape, lambda_std, gain) for _ in range(shape.n_layers)
        )

    def lam(self, layer: int) -> Tensor:
        """λ of `layer`, a scalar tensor in the parameters' dtype."""
        p = self.layers[layer]
        return (p.q1 @ p.k1).exp() - (p.q2 @ p.k2).exp() + lambda_init(layer)

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        if scores.shape[-3] % 2:
            raise ValueError(f"differential attention pairs heads: got {scores.shape[-3]}")
        maps = exp_normalize(scores, mask, lambda s: torch.softmax(s, -1))
        first, second = maps.unflatten(-3, (-1, 2)).unbind(-3)  # [.., H/2, Lq, Lk] each
        pair = first - self.lam(layer).to(maps.dtype) * second
        return torch.stack((pair, pair), -3).flatten(-4, -3)

    def output(self, out: Tensor, layer: int) -> Tensor:
        *lead, heads, length, width = out.shape
        pairs = out.unflatten(-3, (heads // 2, 2)).transpose(-3, -2).flatten(-2)
        wide = pairs.to(torch.promote_types(out.dtype, torch.float32))
        normed = wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + self.eps)
        gain = self.layers[layer].gain
        if gain is not None:
            normed = normed * gain.to(normed.dtype)
        normed = normed * (1 - lambda_init(layer))
        back = normed.to(out.dtype).unflatten(-1, (2, width)).transpose(-3, -2)
        return back.reshape(*lead, heads, length, width)
