"""Score terms that depend on the distance j − i alone, computed per distance.

A term b_h(j − i) (T5's buckets, ALiBi, KERPLE) has at most Lq + Lk − 1 distinct values per
head over consecutive positions, so a pass computes the vector

    u_h[r] = b_h(d_min + r),   r = 0 … R − 1          [H, R]

once, and the [H, Lq, Lk] term is its Toeplitz expansion, T_h[i, j] = u_h[(k0 + j) − (q0 + i)
− d_min], for queries at q0 … q0 + Lq − 1 and keys at k0 … k0 + Lk − 1. Its gradient is the
sum of the term's gradient along each diagonal, computed by writing the rows of the gradient
into a buffer whose row stride is one element shorter than its width ("skewing", as the
relative shift of Dai et al. 2019, Transformer-XL, and Huang et al. 2018, Music Transformer,
but in reverse), so that a diagonal becomes a column. This replaces the [Lq, Lk] gather of a
table, whose backward adds Lq·Lk gradients into a few rows (on a GPU, atomic adds that
contend).

On the CPU, softmax attention with such a term runs through `distance_attention`: the term is
expanded one block of queries at a time and handed, with the mask, to PyTorch's fused CPU
attention kernel as a float mask (its forward and backward keep no [Lq, Lk] matrix). That
kernel gives no gradient for its mask, so when u needs one, the backward pass recomputes each
block's scores and takes the softmax gradient from the saved log-sum-exp:

    P = exp(S − lse),   dS = P ∘ (dO·vᵀ − rowsum(dO ∘ O)),   du_h[r] = Σ_b Σ_{diagonal r} dS

Exact: the same arithmetic as the plain path, in another order (tested in float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function

SCORE_BLOCK = 1 << 22
"""Scores recomputed at once for u's gradient (4 Mi elements, 16 MiB in float32): the fastest of
64 to 1,024 query rows at L = 2,048 and 4,096 (batch 4, 4 heads) on a 2-core AVX-512 CPU,
where larger blocks leave the caches."""

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def consecutive_start(pos: Tensor) -> int | None:
    """pos[0] when `pos` is pos[0], pos[0] + 1, …; else None (randomized positions)."""
    n = pos.shape[0]
    start = int(pos[0])
    if n > 1 and not torch.equal(pos, torch.arange(start, start + n, device=pos.device)):
        return None
    return start


class Span:
    """The distances of queries q0 … q0 + Lq − 1 to keys k0 … k0 + Lk − 1: d_min … d_max,
    R = Lq + Lk − 1 of them."""

    def __init__(self, q0: int, lq: int, k0: int, lk: int) -> None:
        self.q0, self.lq, self.k0, self.lk = q0, lq, k0, lk
        self.d_min = k0 - (q0 + lq - 1)

    def distances(self, device: torch.device) -> Tensor:
        """[R] the integers d_min … d_max."""
        return torch.arange(self.d_min, self.d_min + self.lq + self.lk - 1, device=device)

    def offset(self, row: int) -> int:
        """Index in u of the distance from query row `row` to key 0."""
        return self.k0 - (self.q0 + row) - self.d_min


def distance_span(q_pos: Tensor, k_pos: Tensor) -> Span | None:
    """The `Span` of consecutive query and key positions; None if either is not consecutive."""
    q0, k0 = consecutive_start(q_pos), consecutive_start(k_pos)
    if q0 is None or k0 is None:
        return None
    return Span(q0, q_pos.shape[0], k0, k_pos.shape[0])


def hankel(w: Tensor, start: int, rows: int, cols: int) -> Tensor:
    """The view [H, rows, cols] with [h, i, j] = w[h, start + i + j] of w [H, R] (no copy;
    w contiguous)."""
    return w.as_strided((w.shape[0], rows, cols), (w.stride(0), 1, 1), w.storage_offset() + start)


def antidiagonal_sums(grad: Tensor) -> Tensor:
    """[H, Lq + Lk − 1] sums of grad [H, Lq, Lk] over each i + j = 0 … Lq + Lk − 2: row i is
    written at columns i … i + Lk − 1 of a buffer one column narrower than its row stride."""
    h, lq, lk = grad.shape
    width = lq + lk - 1
    buffer = grad.new_zeros(h, lq * width)
    buffer.as_strided((h, lq, lk), (lq * width, width + 1, 1)).copy_(grad)
    return buffer.view(h, lq, width).sum(1)


class _Hankel(Function):
    """A copy of `hankel`'s view, with the anti-diagonal-sum gradient."""

    @staticmethod
    def forward(ctx: Any, w: Tensor, start: int, rows: int, cols: int) -> Tensor:
        ctx.start, ctx.r = start, w.shape[-1]
        return hankel(w, start, rows, cols).clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        sums = antidiagonal_sums(grad)
        dw = sums.new_zeros(sums.shape[0], ctx.r)
        dw[:, ctx.start : ctx.start + sums.shape[1]] = sums
        return dw, None, None, None


def toeplitz(u: Tensor, offset: int, lq: int, lk: int) -> Tensor:
    """[H, Lq, Lk] with [h, i, j] = u[h, offset + j − i] (needs offset ≥ Lq − 1 and offset + Lk
    ≤ R), differentiable in u: the Hankel matrix of u reversed, its columns reversed."""
    start = u.shape[-1] - offset - lk
    return _Hankel.apply(u.flip(-1).contiguous(), start, lq, lk).flip(-1)


def _blocks(rows: slice, size: int | None) -> list[slice]:
    """`rows` in blocks of at most `size`, the last first (the widest, in a causal stack)."""
    size = size or rows.stop - rows.start
    starts = range(rows.start, rows.stop, size)
    return [slice(start, min(start + size, rows.stop)) for start in starts][::-1]


@dataclass(frozen=True)
class Layout:
    """Which keys the queries see: their distances, the mask (None, or boolean and
    broadcastable to [B, H, Lq, Lk]), whether it is exactly causal, and the query block size."""

    span: Span
    mask: Tensor | None
    causal: bool
    chunk: int | None


class _Blocks:
    """What the forward and backward passes share: keys and values in reverse order, the
    reversed distance vector w [H, R], the reversed mask, and each block's term."""

    def __init__(self, k: Tensor, v: Tensor, w: Tensor, layout: Layout) -> None:
        self.k, self.v, self.w = k.flip(2), v.flip(2), w
        self.span, self.causal, self.chunk = layout.span, layout.causal, layout.chunk
        mask = layout.mask
        self.mask = None if mask is None or self.causal else mask.flip(-1)
        self.lk = k.shape[2]

    def kernel_blocks(self, n: int) -> list[slice]:
        """The kernel's query blocks: all queries at once (it keeps no [Lq, Lk] matrix), or in
        a causal stack blocks of `chunk`, each seeing the keys up to its last query."""
        return _blocks(slice(0, n), self.chunk if self.causal else None)

    def keys(self, rows: slice) -> int:
        """How many keys (from the first) the block's queries see: all, or in a causal stack
        those up to its last query."""
        return rows.stop if self.causal else self.lk

    def reversed_kv(self, n_keys: int) -> tuple[Tensor, Tensor]:
        return self.k[:, :, self.lk - n_keys :], self.v[:, :, self.lk - n_keys :]

    def start(self, rows: slice, n_keys: int) -> int:
        """Where in w the block's Hankel term starts."""
        return self.w.shape[-1] - self.span.offset(rows.start) - n_keys

    def term(self, rows: slice, n_keys: int) -> Tensor:
        """[1 or B, H, rows, n_keys], keys reversed: a view of w, or with −inf where the mask
        is False (a copy)."""
        term = hankel(self.w, self.start(rows, n_keys), rows.stop - rows.start, n_keys)[None]
        if self.mask is None:
            return term
        mask = self.mask if self.mask.shape[-2] == 1 else self.mask[..., rows, :]
        return torch.where(mask, term, float("-inf"))


class _DistanceAttention(Function):
    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, w: Tensor, layout: Layout, scale: float
    ) -> Tensor:
        blocks = _Blocks(k, v, w, layout)
        outs, lses = [], []
        for rows in blocks.kernel_blocks(q.shape[2]):
            n_keys = blocks.keys(rows)
            k_b, v_b = blocks.reversed_kv(n_keys)
            out, lse = _flash(
                q[:, :, rows], k_b, v_b, attn_mask=blocks.term(rows, n_keys), scale=scale
            )
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs[::-1], 2), torch.cat(lses[::-1], 2)
        ctx.save_for_backward(q, out, lse)
        ctx.blocks, ctx.scale = blocks, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, out, lse = ctx.saved_tensors
        blocks, scale = ctx.blocks, ctx.scale
        dq = torch.empty_like(q)
        dk = dv = None  # keys reversed; the first block (the last) reaches every key
        dw = torch.zeros_like(blocks.w) if ctx.needs_input_grad[3] else None
        grad_out = grad_out.contiguous()
        for rows in blocks.kernel_blocks(q.shape[2]):
            n_keys = blocks.keys(rows)
            k_b, v_b = blocks.reversed_kv(n_keys)
            dq[:, :, rows], dk_b, dv_b = _flash_backward(
                grad_out[:, :, rows], q[:, :, rows], k_b, v_b, out[:, :, rows], lse[:, :, rows],
                0.0, False, attn_mask=blocks.term(rows, n_keys), scale=scale,
            )  # fmt: skip
            if dk is None:
                dk, dv = dk_b, dv_b
            else:
                dk[:, :, blocks.lk - n_keys :] += dk_b
                dv[:, :, blocks.lk - n_keys :] += dv_b
            if dw is not None:
                _add_term_gradient(dw, blocks, rows, q, grad_out, out, lse, scale)
        assert dk is not None and dv is not None
        return dq, dk.flip(2), dv.flip(2), dw, None, None


def _add_term_gradient(
    dw: Tensor, blocks: _Blocks, rows: slice, q: Tensor, grad_out: Tensor, out: Tensor,
    lse: Tensor, scale: float,
) -> None:  # fmt: skip
    """Add to dw the gradient of w from query rows `rows`: Σ_b dS along each anti-diagonal,
    where dS = P ∘ (dO·vᵀ − rowsum(dO ∘ O)) and P = exp(S − lse), the scores recomputed
    `SCORE_BLOCK` at a time. The row terms ride in the products as one more column
    ([scale·q, −lse]·[k, 1]ᵀ = scale·q·kᵀ − lse), sparing two passes over the scores. The
    kernel gives a row that attends to nothing a finite lse, so its P is exp(−inf) = 0."""
    n_keys = blocks.keys(rows)
    k, v = blocks.reversed_kv(n_keys)
    k_t, v_t = _with(k, 1.0).transpose(-2, -1), _with(v, 1.0).transpose(-2, -1)
    row_terms = (grad_out * out).sum(-1)
    for part in _blocks(rows, max(1, SCORE_BLOCK // (q.shape[0] * q.shape[1] * n_keys))):
        p = torch.matmul(_with(q[:, :, part] * scale, -lse[:, :, part]), k_t)
        p = p.add_(blocks.term(part, n_keys)).exp_()
        dp = torch.matmul(_with(grad_out[:, :, part], -row_terms[:, :, part]), v_t)
        sums = antidiagonal_sums(p.mul_(dp).sum(0))
        start = blocks.start(part, n_keys)
        dw[:, start : start + sums.shape[1]] += sums


def _with(x: Tensor, column: Tensor | float) -> Tensor:
    """x [..., L, d] with one more column [..., L, d + 1]: `column` [..., L] or a constant."""
    extra = (
        x.new_full((*x.shape[:-1], 1), column) if isinstance(column, float) else column[..., None]
    )
    return torch.cat((x, extra.to(x.dtype)), -1)


def distance_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor,
    span: Span,
    mask: Tensor | None,
    causal: bool,
    scale: float,
    chunk: int | None,
) -> Tensor:
    """softmax(scale·q·kᵀ + T(u), masked) v by the fused CPU kernel, [B, H, Lq, d_v]: q, k, v
    [B, H, L, d]; u [H, R] over `span`'s distances; mask boolean, broadcastable to
    [B, H, Lq, Lk]; `causal`: the mask is exactly causal, and is then carried by u itself
    (−inf at distances above 0) with each block's keys past its last query skipped; at most
    `chunk` queries a block. The keys are reversed inside, so that each block's term is a
    Hankel view of u reversed: no [Lq, Lk] tensor is copied unless a mask must be applied."""
    if causal:
        u = u.masked_fill(span.distances(u.device) > 0, float("-inf"))
    w = u.flip(-1).contiguous()
    return _DistanceAttention.apply(q, k, v, w, Layout(span, mask, causal, chunk), scale)
