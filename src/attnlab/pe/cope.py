"""CoPE, contextual position encoding (Golovneva, Wang, Weston, Sukhbaatar 2024, "Contextual
Position Encoding: Learning to Count What's Important", arXiv 2405.18719).

    g_ij = σ(q_i·k_j/√d_h) for j ≤ i, 0 for j > i        gates: which keys count
    p_ij = min(Σ_{t=j..i} g_it, p_max)                    contextual position, fractional
    e[p] = e[⌊p⌋] + (p − ⌊p⌋)·(e[⌈p⌉] − e[⌊p⌋])           interpolated embedding
    scores_ij = (q_i·k_j + q_i·e[p_ij])/√d_h

A position counts only the keys that the query's gates open, so a head can count words,
sentences or any tokens it picks; each head has its own gates and positions. p_ii = g_ii,
not 0. Cheap form: z_i[p] = q_i·e[p] for the integer p = 0…p_max (one [Lq, d_h] × [d_h,
p_max + 1] matmul), then the scalars z_i[⌊p⌋], z_i[⌈p⌉] are interpolated, so no [Lq, Lk, d_h]
tensor is formed. The weight p − ⌊p⌋ carries the gradient to the gates; ⌊p⌋ and ⌈p⌉ are
indices, without one.

Conventions, as in the authors' code (facebookresearch/RAM, projects/cope,
`ContextPosSelfAttn`) with its defaults, unless said otherwise:
- The gate reads the 1/√d_h-scaled q·k (`scale`), as the authors' code and x-transformers
  (`CoPE`) do; the paper writes σ(q_i·k_j). Only q·k enters the gate: x-transformers gates
  the whole logits (with any attention bias), here a synthesizer's dot weight or logits do
  not enter it. With a synthesizer that reads no q or k (random, dense, ...), q and k are
  still projected, since CoPE declares `needs_query` and `needs_key`.
- The position term is scaled by 1/√d_h together with q·k, the paper's q_i·(k_j + e[p_ij])
  under the usual scaling and the authors' default; their --cope-nodiv and x-transformers
  leave it unscaled.
- One table e [p_max + 1, d_h] per layer, shared by the heads, initialized to zeros as in
  both reference codes: training starts from causal attention without positions.
- p_max = `max_pos`, rows e[0…max_pos]. The default 16 is x-transformers' `cope_max_pos`,
  which counts rows and so clips at 15 (its 16 is max_pos=15 here); the authors' code
  defaults to the block size (no clipping), and the values of the paper's experiments
  could not be checked.
- Causality comes from positions, since the hook gets no mask: keys with k_pos > q_pos get
  gate 0 (x-transformers gates the masked logits, the authors' code multiplies the gates by
  the mask). Keys are in position order, so the suffix sum over keys is the sum over t = j…i.
  Padding keys are not removed from the gates: the causal stacks CoPE can serve have no
  padding (language modeling) or padding on the right (the causal probe's batches, padded
  by `pad_sequence`), so the keys j ≤ i of a real query are never padding; the rows of pad
  queries may count pad keys, but their outputs are never scored, and no real query reads
  them. (Seq2seq targets are right-padded too, but the encoder-decoder's bidirectional
  encoder refuses CoPE.)
- Gates and positions are computed in float32 or wider: a bf16 sum of a few hundred gates
  would lose whole positions.

CoPE is defined for causal self-attention only (a key after the query has no position), so
it declares `causal_only` and bidirectional stacks and cross-attention refuse it. The term needs whole rows of q·k, which
the hook recomputes: softmax takes SDPA with the term in a float mask, never FlashAttention
nor FlexAttention (p_ij depends on the row, not on (i, j) alone). Each row depends only on
its query and the keys at absolute positions, so cached decoding and chunked attention
need nothing special.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding, relative_positions
from attnlab.shape import StackShape


def causal_gates(logits: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """g_ij = σ(logits_ij) for k_pos ≤ q_pos, 0 after the query, in float32 or wider."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.sigmoid(wide).masked_fill(relative_positions(q_pos, k_pos) > 0, 0.0)


def contextual_positions(gates: Tensor, max_pos: int) -> Tensor:
    """p_ij = min(Σ_{t ≥ j} g_it, max_pos): the sum of the gates from key j on (a suffix sum
    over the key axis; the gates of later keys are 0)."""
    return gates.flip(-1).cumsum(-1).flip(-1).clamp_max(max_pos)


def interpolate(z: Tensor, p: Tensor) -> Tensor:
    """z [..., Lq, P] at the fractional indices p [..., Lq, Lk] (0 ≤ p ≤ P − 1): linear
    between z[⌊p⌋] and z[⌈p⌉], exactly z[p] at integer p."""
    floor = p.floor()
    low, high = z.gather(-1, floor.long()), z.gather(-1, p.ceil().long())
    return low + (p - floor) * (high - low)


class CoPE(PositionalEncoding):
    adds_score_terms = True
    needs_query = True
    needs_key = True
    causal_only = "a position counts the gated keys from the key up to the query"
    per_layer = ("tables",)

    def __init__(self, shape: StackShape, max_pos: int) -> None:
        super().__init__(shape)
        if max_pos < 1:
            raise ConfigError(
                f"pe.max_pos={max_pos} must be at least 1 (the largest contextual position "
                "with its own embedding; x-transformers uses 16)"
            )
        self.max_pos = max_pos
        self.tables = nn.ParameterList(
            nn.Parameter(torch.zeros(max_pos + 1, shape.head_dim)) for _ in range(shape.n_layers)
        )

    def positions(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """p_ij [B, H, Lq, Lk], clipped to max_pos."""
        logits = torch.matmul(q, k.transpose(-2, -1)) * self.scale(q.shape[-1])
        return contextual_positions(causal_gates(logits, q_pos, k_pos), self.max_pos)

    def score_bias(
        self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """q_i·e[p_ij]/√d_h [B, H, Lq, Lk]."""
        assert q is not None and k is not None
        z = torch.matmul(q * self.scale(q.shape[-1]), self.tables[layer].t())
        return interpolate(z, self.positions(q, k, q_pos, k_pos))
