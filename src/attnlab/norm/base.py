"""The normalizer interface: (scores [B, H, Lq, Lk], mask, layer) -> attention weights.

One normalizer object serves every layer of a stack (built with its StackShape); one with
parameters per layer and head (a sink logit, a scale) keeps them as `LayerHeads` and reads
the row of `layer`.

`mask` is boolean, broadcastable to the scores, True where a query may attend (None: all).
Exp-based normalizers put −inf at masked scores before the exponential; the others apply
their activation first and multiply masked entries by 0 afterwards (SiLU(−inf) is NaN).
A row with no visible key (a padding query) gets all-zero weights, never NaN.

Every normalizer computes in float32 at least, whatever the activations' dtype (bf16 or fp16
under mixed precision): exponentials, squares and row sums of bf16 scores lose up to 10% of a
weight, against the bf16 rounding of the scores themselves. The weights come back in the
scores' dtype, the one the product with v runs in.

A normalizer that also acts on the heads' outputs (differential attention's per-pair
RMSNorm) declares `acts_on_output` and overrides `output`, which `Attention.forward` applies
to the attention output [B, H, Lq, d_v] before the output gate and projection. One that
combines heads in pairs declares why in `paired_heads` and is refused for an odd number of
heads (block=gau has one).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.settings import ConfigError
from attnlab.shape import StackShape, check_causal_only


class Normalizer(nn.Module):
    sdpa = False  # True only for softmax: F.scaled_dot_product_attention computes the same
    shift_invariant = False  # w(s + c) = w(s) for a per-row constant c: a key bias does nothing
    rows_sum_to_one = False  # Σ_j w_ij = 1 over the visible keys: a value bias passes through
    fixed_row_sums = False  # Σ_j w_ij is one number per layer and head, whatever the scores
    acts_on_output = False  # `output` changes the attention output (else the identity)
    paired_heads: str | None = None  # why it combines its heads in pairs
    reads_order = False  # the weights depend on the keys' order: a positional mechanism itself
    causal_only: str | None = None  # why it is defined for causal self-attention only

    def __init__(self, shape: StackShape) -> None:
        super().__init__()
        check_causal_only(self, shape, "or choose another norm")
        if self.paired_heads and shape.n_heads % 2:
            raise ConfigError(
                f"{type(self).__name__} combines its heads in pairs ({self.paired_heads}), so "
                f"it needs an even number of heads, not {shape.n_heads}: set model.n_heads "
                "to an even number (block=gau has one head: use block=standard), or choose "
                "another norm"
            )

    def forward(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        """The weights of `normalize`, computed in float32 or wider, in the scores' dtype."""
        wide = scores.to(torch.promote_types(scores.dtype, torch.float32))
        return self.normalize(wide, mask, layer).to(scores.dtype)

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        raise NotImplementedError

    def output(self, out: Tensor, layer: int) -> Tensor:
        """The attention output [B, H, Lq, d_v] of `layer` as the layer passes it on."""
        return out


class LayerHeads(nn.Module):
    """One number per layer and head, learned or fixed, read as [H, 1, 1] for the scores
    [B, H, Lq, Lk] of one layer."""

    def __init__(self, shape: StackShape, initial: float, learned: bool) -> None:
        super().__init__()
        values = torch.full((shape.n_layers, shape.n_heads), float(initial))
        if learned:
            self.values = nn.Parameter(values)
        else:
            self.register_buffer("values", values)

    def forward(self, layer: int) -> Tensor:
        return self.values[layer][:, None, None]


def exp_normalize(
    scores: Tensor, mask: Tensor | None, normalize: Callable[[Tensor], Tensor]
) -> Tensor:
    """normalize(scores) with −inf at masked entries, and zero rows where every key is masked."""
    if mask is None:
        return normalize(scores)
    has_key = mask.any(-1, keepdim=True)
    fill = torch.where(has_key, float("-inf"), 0.0).to(scores.dtype)
    return normalize(torch.where(mask, scores, fill)) * has_key


def visible_keys(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Number of keys each query may attend to, [.., Lq, 1], at least 1."""
    if mask is None:
        return torch.full_like(scores[..., :1], scores.shape[-1])
    return mask.sum(-1, keepdim=True).clamp_min(1).to(scores.dtype)


def zero_masked(weights: Tensor, mask: Tensor | None) -> Tensor:
    return weights if mask is None else weights * mask
