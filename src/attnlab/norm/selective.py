"""Selective attention (Leviathan, Kalman, Matias 2024, "Selective Attention Improves
Transformer", arXiv 2410.02703, ICLR 2025): a token may mask an earlier token for every
token after it. The first head's scores select,

    S_kj = ReLU(s⁰_kj)   for visible j, 0 for j = 0 (the first key) and j = k (its own),
    F_ij = Σ_{k<i} S_kj  (what earlier queries selected of key j),
    a_ij = softmax_j(s_ij − F_ij)   in every head,

so what a token selects away fades for all later queries, and the weights depend on the
order of the tokens without any positional encoding.

Conventions (the paper's section 3 as far as it was read, and x-transformers' form of it):
S reads the scores of head `head` (the first, by default) as they enter the softmax, PE terms
and 1/√d included, with their gradient; the first key is never masked (the paper's BOS,
here the sequence's first token) and a query never masks its own key; selection counts from
strictly earlier queries. Causal self-attention only. Cached decoding is exact: the cache
keeps Σ_k S_kj for every key (`RunningState`), where x-transformers zeroes the selection of
cached keys; queries are never split into blocks. Left out: the paper's context pruning
(dropping keys whose F passes a budget), which saves memory and does not change the scores.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.norm.base import RunningState, own_keys
from attnlab.norm.softmax import Softmax
from attnlab.shape import StackShape


class Selective(Softmax):
    shift_invariant = False  # a per-row shift of head `head` changes what it selects
    reads_order = True
    carries_state = True
    causal_only = "a token masks earlier tokens for the tokens after it"
    sdpa = False

    def __init__(self, shape: StackShape, head: int) -> None:
        super().__init__(shape)
        if not 0 <= head < shape.n_heads:
            raise ConfigError(
                f"norm.head={head} names no head of {shape.n_heads}: set it between 0 and "
                f"{shape.n_heads - 1}"
            )
        self.head = head

    def adjust(self, scores: Tensor, mask: Tensor | None, state: RunningState | None) -> Tensor:
        visible = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask
        rows = torch.broadcast_shapes(scores.shape, visible.shape)  # logits may have no batch
        scores, visible = scores.expand(rows), visible.expand(rows)
        selected = selection(scores[..., self.head, :, :], visible[..., self.head, :, :])
        earlier = F.pad(selected, (0, 0, 1, 0))[..., :-1, :].cumsum(-2)  # Σ_{k<i} S_kj
        if state is not None:  # the queries before this call, from the cache
            before = state.widened(selected[..., 0, :])
            earlier = earlier + before[..., None, :]
            state.value = before + selected.sum(-2)
        return scores - earlier[..., None, :, :]


def selection(scores: Tensor, visible: Tensor) -> Tensor:
    """S [.., Lq, Lk]: ReLU of one head's scores where visible, but never the first key or
    a query's own."""
    chosen = visible & ~own_keys(visible)
    chosen[..., 0] = False
    return torch.where(chosen, F.relu(scores), 0.0)
