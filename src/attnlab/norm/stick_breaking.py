"""Stick-breaking attention (Tan, Shen, Yang, Courville, Panda 2025, "Scaling Stick-Breaking
Attention", arXiv 2410.17980, ICLR 2025): each key before the query, from the nearest back,
takes a share β_ij = σ(s_ij) of what is left of a unit stick,

    A_ij = β_ij · Π_{j<k<i} (1 − β_ik),      j < i,

so weights favour recent keys without any positional encoding, and a row sums to at most 1
(what no key takes goes nowhere). Computed in log space, as the authors do:
log A_ij = log σ(s_ij) + Σ_{j<k<i} log σ(−s_ik), the sum a reversed cumulative sum over the
row's visible keys.

Conventions: causal self-attention only (the stick is broken from the query backwards). The
keys before the query are the row's visible keys but its last, which in causal
self-attention is the query's own: so the first position attends to nothing, and cached
decoding (one query over every key) gives the rows of the full pass. `attend_current: true`
lets the query's own key break the stick first (A_ij = β_ij Π_{j<k≤i}(1 − β_ik), j ≤ i).
Not invariant to a per-row shift.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.norm.base import Normalizer, own_keys
from attnlab.shape import StackShape


class StickBreaking(Normalizer):
    reads_order = True
    causal_only = "the stick is broken from each query back over the keys before it"

    def __init__(self, shape: StackShape, attend_current: bool) -> None:
        super().__init__(shape)
        self.attend_current = attend_current

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        visible = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask
        rows = torch.broadcast_shapes(scores.shape, visible.shape)  # logits may have no batch
        scores, visible = scores.expand(rows), visible.expand(rows)
        if not self.attend_current:  # the row's last visible key is the query's own
            visible = visible & ~own_keys(visible)
        rest = torch.where(visible, F.logsigmoid(-scores), 0.0)  # log(1 − β), 0 where unseen
        after = rest.flip(-1).cumsum(-1).flip(-1) - rest  # Σ over visible keys k > j
        return torch.where(visible, torch.exp(F.logsigmoid(scores) + after), 0.0)
