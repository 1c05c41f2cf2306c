"""Softmax with a sink: a logit b in each row's denominator that no value answers,

    a_ij = e^{s_ij} / (e^{b} + Σ_k e^{s_ik}),

so a row sums to less than 1 and a query may attend to (almost) nothing instead of piling
its weight on the first token (the attention sink of Xiao et al. 2024, arXiv 2309.17453).
OpenAI's gpt-oss (2025, its model card) learns b per layer and head (its `sinks`); Miller 2023 ("Attention
is off by one") fixes b = 0, the "softmax1" Σ + 1. `learned` chooses between them and
`sink_logit` is b's value at initialization (gpt-oss's initial value is not published: 0
here, where both start alike). Computed as a softmax over the row with b appended, then
b's column dropped (stable at any scale); a row with no visible key gives all its weight to
the sink, so zero weights. Not invariant to a per-row shift: a key bias matters.
"""

import torch
from torch import Tensor

from attnlab.norm.base import LayerHeads, Normalizer
from attnlab.shape import StackShape


class SinkSoftmax(Normalizer):
    def __init__(self, shape: StackShape, sink_logit: float, learned: bool) -> None:
        super().__init__(shape)
        self.sink = LayerHeads(shape, sink_logit, learned)

    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        sink = self.sink(layer).to(scores.dtype)  # [H, 1, 1]
        rows = torch.broadcast_shapes((*scores.shape[:-1], 1), sink.shape)
        logits = torch.cat([scores.expand(*rows[:-1], scores.shape[-1]), sink.expand(rows)], -1)
        return torch.softmax(logits, -1)[..., :-1]
