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

On the CPU, softmax attention with such a term runs through `distance_attention`: with the
keys in reverse order the term is a Hankel matrix, a strided view of u reversed, which
PyTorch's fused CPU attention kernel takes as its float mask with no [Lq, Lk] copy (its
forward and backward keep no [Lq, Lk] matrix; a padding mask costs one copy). That kernel
gives no gradient for its mask, so when u needs one, the backward pass recomputes the scores
in blocks and takes the softmax gradient from the saved log-sum-exp:

    P = exp(S − lse),   dS = P ∘ (dO·vᵀ − rowsum(dO ∘ O)),   du_h[r] = Σ_b Σ_{diagonal r} dS

A term constant past ±far (T5's last buckets) is read per distance on the band below far
only (`_far_gradients`). Exact: the same arithmetic as the plain path, in another order
(tested in float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd import Function

SCORE_BLOCK = 1 << 22
"""Scores recomputed at once for u's gradient (4 Mi elements, 16 MiB in float32): the fastest of
64 to 1,024 query rows at L = 2,048 and 4,096 (batch 4, 4 heads) on a 2-core AVX-512 CPU,
where larger blocks leave the caches."""

cpu_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
cpu_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


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
    far: int | None = None  # u is one value at every d ≥ far and one at every d ≤ −far


class _Blocks:
    """What the forward and backward passes share: keys and values in reverse order, the
    reversed distance vector w [H, R], the reversed mask, and each block's term."""

    def __init__(self, k: Tensor, v: Tensor, w: Tensor, layout: Layout) -> None:
        self.k, self.v, self.w = k.flip(2), v.flip(2), w
        self.span, self.causal, self.chunk = layout.span, layout.causal, layout.chunk
        mask = layout.mask
        self.mask = None if mask is None or self.causal else mask.flip(-1)
        self.lk = k.shape[2]
        self.far = layout.far if self.band_pays(layout.far) else None

    def band_pays(self, far: int | None) -> bool:
        """Whether u's gradient is read per distance below `far` only (`_far_gradients`):
        keys beyond 4·far, a mask of keys alone, every query with its far keys after the
        keys at distance below far (self-attention), both far sides within the span."""
        if far is None or self.lk <= 4 * far or (self.mask is not None and self.mask.shape[-2] > 1):
            return False
        span = self.span
        d_max = span.d_min + span.lq + span.lk - 2
        after = span.lk - span.lq - far - (span.q0 - span.k0) <= 0
        return after and span.d_min <= -far and d_max >= far

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

    def term(self, rows: slice, n_keys: int, keys: slice | None = None) -> Tensor:
        """[1 or B, H, rows, keys] over the first n_keys keys reversed (`keys` of them, all by
        default): a view of w, or with −inf where the mask is False (a copy)."""
        keys = keys or slice(0, n_keys)
        start = self.start(rows, n_keys) + keys.start
        term = hankel(self.w, start, rows.stop - rows.start, keys.stop - keys.start)[None]
        if self.mask is None:
            return term
        mask = self.mask if self.mask.shape[-2] == 1 else self.mask[..., rows, :]
        return torch.where(mask[..., self.lk - n_keys :][..., keys], term, float("-inf"))

    def band(self, rows: slice, n_keys: int, far: int) -> slice:
        """The keys (of the first n_keys, reversed) at distances below `far` from a query of
        `rows`: the only ones whose gradient is read per distance."""
        shift = self.span.q0 - self.span.k0  # original key j is at distance j − shift − i
        first = max(0, rows.start + shift - far + 1)
        last = min(n_keys - 1, rows.stop - 1 + shift + far - 1)
        return slice(n_keys - 1 - last, n_keys - first)


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
            out, lse = cpu_flash(
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
            dq[:, :, rows], dk_b, dv_b = cpu_flash_backward(
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
        if dw is not None and blocks.far is not None:
            _far_gradients(dw, blocks, q, grad_out, out, lse, scale)
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
    k_t, v_t = with_column(k, 1.0).transpose(-2, -1), with_column(v, 1.0).transpose(-2, -1)
    row_terms = (grad_out * out).sum(-1)
    at_once = SCORE_BLOCK // (q.shape[0] * q.shape[1] * n_keys)
    if blocks.far is not None:  # 2·far rows at a time: a window of 4·far keys
        at_once = min(2 * blocks.far, SCORE_BLOCK // (q.shape[0] * q.shape[1] * 4 * blocks.far))
    for part in _blocks(rows, max(1, at_once)):
        keys = slice(0, n_keys) if blocks.far is None else blocks.band(part, n_keys, blocks.far)
        p = torch.matmul(with_column(q[:, :, part] * scale, -lse[:, :, part]), k_t[..., keys])
        p = p.add_(blocks.term(part, n_keys, keys)).exp_()
        dp = torch.matmul(with_column(grad_out[:, :, part], -row_terms[:, :, part]), v_t[..., keys])
        sums = antidiagonal_sums(p.mul_(dp).sum(0))
        start = blocks.start(part, n_keys) + keys.start
        dw[:, start : start + sums.shape[1]] += sums


def _far_gradients(
    dw: Tensor, blocks: _Blocks, q: Tensor, grad_out: Tensor, out: Tensor, lse: Tensor,
    scale: float,
) -> None:  # fmt: skip
    """Replace dw's sums at distances of at least `far` (read on the band's edges only) by
    the whole gradient of each far side, lumped at distances far and −far (u is one value on
    each side, so what it comes from gets the same gradient). Each row of dS sums to zero
    (Σ_j P_ij dP_ij = dO_i·O_i), so the two sides together are minus the sum below far; the
    side after the query (none in a causal stack) is Σ_i m_i (dO_i·Ō_i − dO_i·O_i), from one
    causal pass of the kernel over queries and keys reversed, where m_i is the weight of the
    far keys after query i and Ō_i their weighted mean of v."""
    far, span = blocks.far, blocks.span
    r = dw.shape[-1]
    distance = span.d_min + r - 1 - torch.arange(r, device=dw.device)  # of each entry of w
    dw[:, distance.abs() >= far] = 0.0
    below = dw.sum(-1)
    after = torch.zeros_like(below)
    if not blocks.causal:
        after = _far_after(blocks, q, grad_out, out, lse, scale, r - 1 - (far - span.d_min))
    dw[:, r - 1 - (far - span.d_min)] = after
    dw[:, r - 1 - (-far - span.d_min)] = -below - after


def _far_after(
    blocks: _Blocks, q: Tensor, grad_out: Tensor, out: Tensor, lse: Tensor, scale: float,
    index: int,
) -> Tensor:  # fmt: skip
    """[H] Σ_b Σ_i Σ_{d_ij ≥ far} dS_ij. Reversed, query i' sees the far keys j' ≤ i' + t,
    t = Lk − Lq − far − (q0 − k0) ≤ 0: the kernel's causal mask over queries from −t on."""
    span, far = blocks.span, blocks.far
    t = span.lk - span.lq - far - (span.q0 - span.k0)
    mask = None
    if blocks.mask is not None:  # keys alone: [B, 1, 1, Lk] reversed
        mask = torch.zeros(blocks.mask.shape, dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(~blocks.mask, float("-inf"))
    o_far, lse_far = cpu_flash(
        q.flip(2)[:, :, -t:], blocks.k, blocks.v, is_causal=True, attn_mask=mask, scale=scale
    )
    n = o_far.shape[2]  # row r of the pass is query i = n − 1 − r: queries 0 … n − 1
    rows = slice(0, n)
    seen = torch.ones(n, dtype=torch.bool, device=q.device)
    if blocks.mask is not None:  # a row whose far keys are all padding gets lse 0, not −inf
        seen = blocks.mask[:, :, 0].cumsum(-1)[..., :n] > 0  # [B, 1, n]
    weight = (lse_far.flip(2) + blocks.w[:, index, None] - lse[:, :, rows]).exp()
    weight = weight * seen.flip(-1)
    g, o = grad_out[:, :, rows], out[:, :, rows]
    return (weight * ((g * o_far.flip(2)).sum(-1) - (g * o).sum(-1))).sum((0, 2))


def with_column(x: Tensor, column: Tensor | float) -> Tensor:
    """x [..., L, d] with one more column [..., L, d + 1]: `column` [..., L] or a constant."""
    extra = (
        x.new_full((*x.shape[:-1], 1), column) if isinstance(column, float) else column[..., None]
    )
    return torch.cat((x, extra.to(x.dtype)), -1)


class DistanceScores(NamedTuple):
    """A score term of j − i alone: u [H, R] over the distances of `span`; `far`, where given:
    u is one value at every distance ≥ far and one at every distance ≤ −far (T5's last
    buckets), and what it comes from gets one gradient for each."""

    term: Tensor
    span: Span
    far: int | None = None

    def expanded(self) -> Tensor:
        """The [H, Lq, Lk] term, differentiable in u (`toeplitz`)."""
        return toeplitz(self.term, self.span.offset(0), self.span.lq, self.span.lk)


def distance_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scores: DistanceScores,
    mask: Tensor | None,
    causal: bool,
    scale: float,
    chunk: int | None,
) -> Tensor:
    """softmax(scale·q·kᵀ + T(u), masked) v by the fused CPU kernel, [B, H, Lq, d_v]: q, k, v
    [B, H, L, d]; `scores` the term over the distances of its span; mask boolean, broadcastable to
    [B, H, Lq, Lk]; `causal`: the mask is exactly causal, and is then carried by u itself
    (−inf at distances above 0) with each block's keys past its last query skipped; at most
    `chunk` queries a block. The keys are reversed inside, so that each block's term is a
    Hankel view of u reversed: no [Lq, Lk] tensor is copied unless a mask must be applied."""
    u, span, far = scores
    if causal:
        u = u.masked_fill(span.distances(u.device) > 0, float("-inf"))
    w = u.flip(-1).contiguous()
    return _DistanceAttention.apply(q, k, v, w, Layout(span, mask, causal, chunk, far), scale)
