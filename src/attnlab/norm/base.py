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

A normalizer whose weights for query i read the scores of earlier queries (selective
attention) declares `carries_state` and overrides `adjust`, which turns the scores into the
ones it normalizes. Between cached decoding steps it keeps what it needs of the earlier
queries in a `RunningState` that the layer's KV cache holds; attention never splits its
queries into blocks for it, so the full pass sees every earlier query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError
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
    carries_state = False  # query i's weights read earlier queries' scores (`adjust`)
    # attributes holding an entry for each layer of the stack (attnlab.shape.per_layer_parameters)
    per_layer: tuple[str, ...] = ()

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

    def forward(
        self, scores: Tensor, mask: Tensor | None, layer: int, state: RunningState | None = None
    ) -> Tensor:
        """The weights of `normalize`, computed in float32 or wider, in the scores' dtype.
        `state`: the cache's, for a normalizer that `carries_state` (None: no earlier queries)."""
        wide = scores.to(torch.promote_types(scores.dtype, torch.float32))
        return self.normalize(self.adjust(wide, mask, state), mask, layer).to(scores.dtype)

    def adjust(self, scores: Tensor, mask: Tensor | None, state: RunningState | None) -> Tensor:
        """The scores as `normalize` takes them: unchanged but where `carries_state`."""
        return scores

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        raise NotImplementedError

    def output(self, out: Tensor, layer: int) -> Tensor:
        """The attention output [B, H, Lq, d_v] of `layer` as the layer passes it on."""
        return out


@dataclass
class RunningState:
    """What a normalizer that `carries_state` keeps of one layer's earlier queries between
    cached decoding steps: one value per batch row and key seen so far, [B, Lk] (None
    before the first step)."""

    value: Tensor | None = None

    def widened(self, like: Tensor) -> Tensor:
        """The value [.., Lk] for the keys of `like` [.., Lk]: zeros for keys it has not seen."""
        if self.value is None:
            return torch.zeros_like(like)
        return F.pad(self.value, (0, like.shape[-1] - self.value.shape[-1]))

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search)."""
        self.value = None if self.value is None else self.value.index_select(0, index)


class LayerHeads(nn.Module):
    """One number per layer and head, learned or fixed, read as [H, 1, 1] for the scores
    [B, H, Lq, Lk] of one layer."""

    per_layer = ("values",)

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


def own_keys(visible: Tensor) -> Tensor:
    """Each row's last visible key [.., Lq, Lk]: in causal self-attention the query's own
    (with or without a cache, where the queries are the last keys)."""
    return visible & (visible.flip(-1).cumsum(-1).flip(-1) == 1)
