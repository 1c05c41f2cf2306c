"""Attention composed of a positional encoding, a score synthesizer and a normalizer.

For query position i and key position j, in each head:

    scores_ij = dot · scale · q_i·k_j + logits_ij + bias_ij    synthesizer; PE score term
    weights   = reweight(normalize(scores, mask))              normalizer; PE reweighting
    o_i       = Σ_j weights_ij v_j + value_term_i              PE value term

The synthesizer gives `dot` and `logits` (dot-product attention: dot = 1, no logits); the
positional encoding gives `scale` (1/√d_h by default), `bias`, `reweight` and `value_term`.
When the normalizer is softmax and nothing acts after it, `F.scaled_dot_product_attention`
computes the same thing with logits, bias and mask folded into one additive float mask
(the fast path), or, when the mask is exactly causal and nothing is added to the scores,
with `is_causal=True` and no mask tensor, which lets SDPA skip the masked blocks (on CUDA
FlashAttention takes only this form); otherwise the plain path above runs. Both are tested
to agree. A synthesizer with no q·k (random, dense, factorized, their mixtures) could
reach SDPA only through zero q and k with its logits as the mask; on CPU that is 1.2-1.7×
slower than the plain path, with no memory saved (measured at L = 512 and 1024), so it
takes the plain path.

A PE score term of j − i alone over consecutive positions (t5, alibi, kerple; fire where
every query has one divisor; `PositionalEncoding.distance_scores`) is computed once per
distance, 2L − 1 values a head, not per (i, j). On the CPU, softmax of a plain dot product
with such a term takes PyTorch's fused CPU kernel with the term as its mask
(`attention/distance.py`: a Hankel view over keys in reverse order, no [Lq, Lk] copy; the
term's gradient from the saved log-sum-exp, summed along diagonals), without dropout only.
Elsewhere the term is expanded (one copy) and its gradient summed along diagonals, not
scattered into a table per (i, j). On the CPU, softmax of a plain dot product with any other
PE score or value term (shaw, xl, deberta, cope; terms at randomized's drawn positions; not
urpe's reweighting) takes the same kernel beyond `chunk` queries, in blocks of at most
`chunk`, each block's term from the PE's hooks as its mask and its gradient from the saved
log-sum-exp (`attention/term.py`).

On CUDA and when asked (`flex`, model.flex_attention=true), softmax with a PE score term
that FlexAttention can read per (i, j) (t5, alibi, kerple, shaw's key term; `pe.flex`) takes
FlexAttention instead (`attention/flex.py`): the term and the mask stay inside the kernel,
with no [Lq, Lk] tensor; without attention dropout only, and not for single-query decoding
steps. Its forward pass is tested against the plain path.

Long sequences attend in blocks of queries (`chunk`), in training each block recomputed in
the backward pass (Rabe & Staats 2021, "Self-attention does not need O(n²) memory",
arXiv 2112.05682), in evaluation one after another: every term above is row-local given
absolute positions, so blocks need no special case, and no [Lq, Lk] matrix of the whole
sequence is formed. Blocks are skipped where a fused kernel already keeps none (SDPA with
softmax, a plain dot product and no PE score term; the CPU kernel paths, which block
themselves; FlexAttention).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.attention.distance import DistanceScores, distance_attention
from attnlab.attention.flex import BlockMasks, flex_attend
from attnlab.attention.term import term_attention
from attnlab.config.build import build
from attnlab.errors import ConfigError
from attnlab.norm.base import Normalizer, RunningState
from attnlab.pe.base import PositionalEncoding
from attnlab.shape import StackShape
from attnlab.synthesizer.base import Synthesizer


@dataclass(frozen=True)
class Compute:
    """How attention is computed, never what: dropout on the weights, whether the fused SDPA
    path and (on CUDA) FlexAttention may be used, and the query block size for long
    sequences."""

    dropout: float = 0.0
    fast: bool = True
    chunk: int | None = None
    flex: bool = False  # opt-in until its backward pass is checked on a GPU

    def at(self, training: bool) -> Compute:
        """This computation in a module's mode: no dropout outside training."""
        return self if training else replace(self, dropout=0.0)


class AttentionParts(nn.Module):
    """The three choices of one attention stack, shared by its layers."""

    def __init__(self, pe: PositionalEncoding, norm: Normalizer, synthesizer: Synthesizer) -> None:
        super().__init__()
        if not (synthesizer.needs_query and synthesizer.needs_key):
            pe.without_dot_product()
        elif pe.replaces_dot and not synthesizer.plain_dot:
            raise ConfigError(
                f"{type(pe).__name__} {pe.replaces_dot}, but {type(synthesizer).__name__} "
                "weighs q·k in a mixture: use synthesizer=dot, or a synthesizer without q·k"
            )
        self.pe, self.norm, self.synthesizer = pe, norm, synthesizer
        self.block_masks = BlockMasks()  # FlexAttention's, shared by the stack's layers

    @classmethod
    def from_config(
        cls, pe: dict, norm: dict, synthesizer: dict, shape: StackShape
    ) -> AttentionParts:
        return cls(
            build(pe, shape=shape), build(norm, shape=shape), build(synthesizer, shape=shape)
        )

    @property
    def needs_query(self) -> bool:
        return self.synthesizer.needs_query or self.pe.needs_query

    @property
    def needs_key(self) -> bool:
        return self.synthesizer.needs_key or self.pe.needs_key

    @property
    def max_len(self) -> int | None:
        bounds = [b for b in (self.pe.max_len, self.synthesizer.max_len) if b is not None]
        return min(bounds) if bounds else None

    def fast(self) -> bool:
        """Whether SDPA can compute this combination."""
        return self.norm.sdpa and not self.pe.post_normalization

    def fused(self) -> bool:
        """Whether SDPA computes it from q, k and v alone: no [Lq, Lk] tensor is formed."""
        terms = self.pe.adds_score_terms or self.pe.data_width > 0
        return self.fast() and self.synthesizer.plain_dot and not terms

    def flex(self) -> bool:
        """Whether FlexAttention computes it: softmax of q·k plus a score term it can read."""
        plain_softmax = self.fast() and self.synthesizer.plain_dot
        return plain_softmax and self.pe.adds_score_terms and self.pe.flex


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None or b is None:
        return a if b is None else b
    return a + b


def attend(
    parts: AttentionParts,
    layer: int,
    x: Tensor,
    q: Tensor | None,
    k: Tensor | None,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Tensor | None,
    compute: Compute = Compute(),
    is_causal: bool = False,
    data: Tensor | None = None,
    state: RunningState | None = None,
) -> Tensor:
    """Attention output [B, H, Lq, d_v].

    x [B, Lq, d] is the query-side input (for synthesizers that read tokens); q, k
    [B, H, L, d_h] (None where nothing needs them); v [B, H, Lk, d_v]; mask boolean,
    broadcastable to [B, H, Lq, Lk], True where a query may attend; `is_causal` says that
    it is exactly the causal mask of Lq = Lk positions (see `exactly_causal`); `data`
    [B, H, Lk, w] the channels a data-dependent PE reads at every key (`pe.data_width`);
    `state` the cache's, for a normalizer that `carries_state`. With `compute.chunk`,
    attention runs in blocks of that many queries, recomputed in training (see the module
    docstring), unless the normalizer reads earlier queries (`carries_state`).
    """
    n, chunk = q_pos.shape[0], compute.chunk
    flex = compute.flex and v.is_cuda and n > 1 and not compute.dropout and parts.flex()
    distance = _distance_scores(parts, compute, q, v, q_pos, k_pos)
    term = distance is None and _term_path(parts, compute, q, v, n)
    fused = flex or distance is not None or term or (compute.fast and parts.fused())
    if chunk is not None and n > chunk and not fused and not parts.norm.carries_state:
        whole = replace(compute, chunk=None)
        blocks = []
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            block_q = None if q is None else q[:, :, rows]
            block_mask = mask if mask is None or mask.shape[-2] == 1 else mask[..., rows, :]
            args = (x[:, rows], block_q, k, v, q_pos[rows], k_pos, block_mask, whole)
            if torch.is_grad_enabled():
                blocks.append(
                    checkpoint(attend, parts, layer, *args, use_reentrant=False, data=data)
                )
            else:
                blocks.append(attend(parts, layer, *args, data=data))
        return torch.cat(blocks, 2)
    if flex:
        return flex_path(parts, layer, q, k, v, q_pos, k_pos, mask)
    if distance is not None:
        assert q is not None and k is not None
        scores = distance._replace(term=distance.term.to(q.dtype))
        scale = parts.pe.scale(q.shape[-1])
        return distance_attention(q, k, v, scores, mask, is_causal, scale, chunk)
    if term:
        assert q is not None and k is not None
        pe = parts.pe
        return term_attention(pe, layer, q, k, v, q_pos, k_pos, mask, is_causal, chunk)
    synthesis = parts.synthesizer(x, q_pos, k_pos, layer)
    extra = _add(synthesis.logits, _pe_scores(parts.pe, layer, q, k, q_pos, k_pos, data))
    if synthesis.dot is not None and compute.fast and parts.fast():
        assert q is not None and k is not None
        q, scale = _scaled_dot(parts, synthesis.dot, q)
        if extra is None and is_causal:
            return F.scaled_dot_product_attention(
                q, k, v, None, compute.dropout, is_causal=True, scale=scale
            )
        if extra is not None:
            extra = extra.to(q.dtype)  # float32 bias tables with bf16 activations
            mask = extra if mask is None else torch.where(mask, extra, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, mask, compute.dropout, scale=scale)
    weights = _weights(parts, layer, synthesis.dot, extra, q, k, q_pos, k_pos, mask, state)
    weights = F.dropout(weights, compute.dropout, training=compute.dropout > 0)
    return _add(torch.matmul(weights, v), parts.pe.value_term(weights, q_pos, k_pos, layer))


def _cpu_kernel(parts: AttentionParts, compute: Compute, q: Tensor | None, v: Tensor) -> bool:
    """Whether the fused CPU kernel may compute softmax of a plain dot product here: on the
    CPU, without attention dropout, with weights that the PE does not reweight, and queries
    as wide as values (the kernel's condition; GAU's are not)."""
    same_width = q is not None and q.shape[-1] == v.shape[-1]
    applies = compute.fast and not compute.dropout and v.device.type == "cpu" and same_width
    softmax = parts.norm.sdpa and parts.synthesizer.plain_dot and not parts.pe.reweights
    return applies and softmax


def _distance_scores(
    parts: AttentionParts,
    compute: Compute,
    q: Tensor | None,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
) -> DistanceScores | None:
    """The PE's term per distance for the fused CPU path (`attention/distance.py`), or None
    where that path does not apply: not the CPU kernel's case (`_cpu_kernel`), a value term,
    or not a term of j − i over consecutive positions."""
    if not (_cpu_kernel(parts, compute, q, v) and parts.fast()):
        return None
    return parts.pe.distance_scores(q_pos, k_pos)


def _term_path(
    parts: AttentionParts, compute: Compute, q: Tensor | None, v: Tensor, n: int
) -> bool:
    """Whether a PE's score or value term takes the CPU kernel in blocks (`attention/term.py`):
    the CPU kernel's case, with a term that is not per distance, for more than `chunk`
    queries. Up to `chunk` the plain path forms the scores once, with nothing recomputed:
    at L = 512 the term path took 9-37% longer (shaw, xl, deberta, cope; BENCHMARKS.md, one
    process). Beyond it the term path was 1.1-2.2× faster at 1,024-4,096 for xl, deberta and
    cope; shaw's took 14-17% longer at 1,024-2,048 and 11% less time at 4,096, with 17% less
    memory."""
    pe = parts.pe
    long = compute.chunk is not None and n > compute.chunk
    terms = pe.adds_score_terms or pe.post_normalization
    return long and terms and not pe.data_width and _cpu_kernel(parts, compute, q, v)


def flex_path(
    parts: AttentionParts,
    layer: int,
    q: Tensor | None,
    k: Tensor | None,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Tensor | None,
    compiled: bool = True,
) -> Tensor:
    """`attend` by FlexAttention, where `parts.flex()`; `compiled=False` for CPU tests."""
    assert q is not None and k is not None
    block = None if mask is None else parts.block_masks(mask, q.shape[2], k.shape[2])
    score_mod = parts.pe.score_mod(q, q_pos, k_pos, layer)
    return flex_attend(q, k, v, score_mod, block, parts.pe.scale(q.shape[-1]), compiled)


def attention_weights(
    parts: AttentionParts,
    layer: int,
    x: Tensor,
    q: Tensor | None,
    k: Tensor | None,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Tensor | None,
    data: Tensor | None = None,
) -> Tensor:
    """The weights [B, H, Lq, Lk] that `attend` applies to v (without dropout), by the plain
    path; for looking at them (the fused path never forms them)."""
    synthesis = parts.synthesizer(x, q_pos, k_pos, layer)
    extra = _add(synthesis.logits, _pe_scores(parts.pe, layer, q, k, q_pos, k_pos, data))
    return _weights(parts, layer, synthesis.dot, extra, q, k, q_pos, k_pos, mask)


def _pe_scores(
    pe: PositionalEncoding,
    layer: int,
    q: Tensor | None,
    k: Tensor | None,
    q_pos: Tensor,
    k_pos: Tensor,
    data: Tensor | None,
) -> Tensor | None:
    """The PE's score terms: its positional term and, where it reads the data, its data term."""
    term = pe.score_bias(q, k, q_pos, k_pos, layer)
    if data is None:
        return term
    return _add(term, pe.data_term(q, k, data, q_pos, k_pos, layer))


def _scaled_dot(parts: AttentionParts, dot: Tensor | float, q: Tensor) -> tuple[Tensor, float]:
    """q times the synthesizer's dot weight, and the PE's scale for q·k."""
    scale = parts.pe.scale(q.shape[-1])
    return (q if isinstance(dot, float) and dot == 1.0 else q * dot), scale


def _weights(
    parts: AttentionParts,
    layer: int,
    dot: Tensor | float | None,
    extra: Tensor | None,
    q: Tensor | None,
    k: Tensor | None,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Tensor | None,
    state: RunningState | None = None,
) -> Tensor:
    if dot is not None:
        assert q is not None and k is not None
        q, scale = _scaled_dot(parts, dot, q)
        extra = _add(torch.matmul(q * scale, k.transpose(-2, -1)), extra)
    assert extra is not None, "a synthesizer must give a dot product, logits or both"
    weights = parts.norm(extra, mask, layer, state)
    return parts.pe.reweight(weights, q_pos, k_pos, layer)
