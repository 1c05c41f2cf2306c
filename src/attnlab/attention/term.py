"""Score terms that read q or k, and value terms, on the CPU's fused attention kernel.

    O = softmax(scale·q·kᵀ + T, masked) v + V(P)

T [B, H, Lq, Lk] is a PE's score term (`score_bias`: Shaw's key term, Transformer-XL, DeBERTa,
CoPE, or a term over positions that are not consecutive, as randomized draws them) and V a
value term read from the weights P (`value_term`: Shaw's a^V). Without this path, a term
that needs a gradient sends SDPA to its math kernel, which forms and saves the scores, the
weights and their gradients for each block of `chunk` queries, and the block's recomputation
runs the whole forward pass twice (XL at L = 4,096: 5.5× pe=none).

Here each block holds at most `TERM_BLOCK` scores and `chunk` queries (512 at L = 4,096). Its T
is the PE's own hook on the block's queries and keys, handed to PyTorch's fused CPU kernel as
its float mask; only q, k, v, O and the log-sum-exp are saved. The backward pass recomputes
each block's T with its graph, takes dq, dk, dv from the kernel's backward, and T's gradient
from the saved log-sum-exp:

    P = exp(S − lse),   dS = P ∘ (dO·vᵀ + Z − rowsum(dO ∘ O)),   Z = ∂⟨dO, V(P)⟩/∂P

which autograd carries through the hook to q, k and the PE's parameters. With a value term
the forward pass recomputes the block's P to add V(P); the kernel's backward, given the O
that includes it, misses only P ∘ Z in dS, whose products with k and q are added. Exact:
the same arithmetic as the plain path, in another order (tested in float64).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.autograd import Function

from attnlab.attention.distance import cpu_flash, cpu_flash_backward, with_column

TERM_BLOCK = 1 << 25
"""Scores per kernel call (32 Mi, 512 queries at L = 4,096, batch 4, 4 heads). On a 2-core
AVX-512 CPU, the kernel's forward and backward with a float mask at L = 4,096 took 1.96× as
long in blocks of 64 queries as on the whole sequence, 1.25× in blocks of 256 and 1.08× in
blocks of 1,024; whole training steps took 8-16% longer with blocks of 128 queries than of
512 (shaw, xl)."""

if TYPE_CHECKING:
    from attnlab.pe.base import PositionalEncoding


@dataclass(frozen=True)
class TermPlan:
    """What the blocks share: the PE and its layer, positions [Lq], [Lk], the mask (None, or
    boolean and broadcastable to [B, H, Lq, Lk]), whether it is exactly causal (then each
    block sees the keys up to its last query), the scale of q·k, and the most queries a
    block may hold (`model.attention_chunk`: a term's intermediates grow with the block)."""

    pe: PositionalEncoding
    layer: int
    q_pos: Tensor
    k_pos: Tensor
    mask: Tensor | None
    causal: bool
    scale: float
    chunk: int | None

    @property
    def value(self) -> bool:
        return self.pe.post_normalization

    def blocks(self, q: Tensor, n_keys: int) -> list[tuple[slice, int]]:
        """Each block's query rows and how many keys (from the first) it sees."""
        b, h, lq, _ = q.shape
        size = max(1, min(TERM_BLOCK // (b * h * n_keys), self.chunk or lq))
        starts = range(0, lq, size)
        rows = [slice(start, min(start + size, lq)) for start in starts]
        return [(r, r.stop if self.causal else n_keys) for r in rows]

    def term(self, q: Tensor, k: Tensor, rows: slice, n_keys: int) -> Tensor | None:
        """The PE's score term [1 or B, H, rows, n_keys] of the block's queries and keys."""
        return self.pe.score_bias(q, k, self.q_pos[rows], self.k_pos[:n_keys], self.layer)

    def value_term(self, weights: Tensor, rows: slice, n_keys: int) -> Tensor | None:
        return self.pe.value_term(weights, self.q_pos[rows], self.k_pos[:n_keys], self.layer)

    def kernel_mask(
        self, term: Tensor | None, rows: slice, n_keys: int, like: Tensor
    ) -> Tensor | None:
        """The kernel's float mask [.., rows, n_keys]: the term (or 0) where a query may
        attend, −inf elsewhere; None when there is neither term nor mask."""
        keep = None
        if self.causal:
            keys = torch.arange(n_keys, device=like.device)
            keep = keys <= torch.arange(rows.start, rows.stop, device=like.device)[:, None]
        elif self.mask is not None:
            keep = self.mask if self.mask.shape[-2] == 1 else self.mask[..., rows, :]
            keep = keep[..., :n_keys]
        if keep is None:
            return None if term is None else term.to(like.dtype)
        value = like.new_zeros(()) if term is None else term.to(like.dtype)
        mask = torch.where(keep, value, float("-inf"))
        return mask.view((1,) * (4 - mask.dim()) + mask.shape)


def probabilities(q: Tensor, k_t: Tensor, mask: Tensor | None, lse: Tensor, scale: float) -> Tensor:
    """P = exp(scale·q·kᵀ + mask − lse) [B, H, Lq, Lk] from k_t = [k, 1]ᵀ [B, H, d + 1, Lk],
    lse riding in the product as one more column ([scale·q, −lse]·[k, 1]ᵀ); 0 where the mask
    is −inf."""
    p = torch.matmul(with_column(q * scale, -lse), k_t)
    return (p if mask is None else p.add_(mask)).exp_()


class _TermAttention(Function):
    @staticmethod
    def forward(
        ctx: Any, plan: TermPlan, q: Tensor, k: Tensor, v: Tensor, *params: Tensor
    ) -> Tensor:
        outs, lses = [], []
        for rows, n in plan.blocks(q, k.shape[2]):
            q_b, k_b, v_b = q[:, :, rows], k[:, :, :n], v[:, :, :n]
            mask = plan.kernel_mask(plan.term(q_b, k_b, rows, n), rows, n, q)
            o, lse = cpu_flash(q_b, k_b, v_b, attn_mask=mask, scale=plan.scale)
            if plan.value:
                p = probabilities(q_b, with_column(k_b, 1.0).mT, mask, lse, plan.scale)
                o = o + plan.value_term(p, rows, n)
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, 2), torch.cat(lses, 2)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, *params = ctx.saved_tensors
        plan: TermPlan = ctx.plan
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        d_params: list[Tensor | None] = [None] * len(params)  # None: not read in this layer
        row_terms = (grad_out * out).sum(-1)
        k_t, v_t = with_column(k, 1.0).mT, with_column(v, 1.0).mT  # [B, H, d + 1, Lk]
        for rows, n in plan.blocks(q, k.shape[2]):
            q_b, k_b, v_b, g = q[:, :, rows], k[:, :, :n], v[:, :, :n], grad_out[:, :, rows]
            with torch.enable_grad():
                q_g, k_g = q_b.detach().requires_grad_(), k_b.detach().requires_grad_()
                term = plan.term(q_g, k_g, rows, n)
            mask = plan.kernel_mask(None if term is None else term.detach(), rows, n, q)
            dq_b, dk_b, dv_b = cpu_flash_backward(
                g, q_b, k_b, v_b, out[:, :, rows], lse[:, :, rows], 0.0, False,
                attn_mask=mask, scale=plan.scale,
            )  # fmt: skip
            dv[:, :, :n] += dv_b
            p = probabilities(q_b, k_t[..., :n], mask, lse[:, :, rows], plan.scale)
            dp = torch.matmul(with_column(g, -row_terms[:, :, rows]), v_t[..., :n])
            if plan.value:
                z = _value_gradient(plan, p, g, rows, n, params, d_params)
                extra = p * z  # P ∘ Z, the part of dS the kernel's backward did not see
                dq_b += plan.scale * torch.matmul(extra, k_b)
                dk_b += plan.scale * torch.matmul(extra.mT, q_b)
                dp += z
            if term is not None:
                ds = p.mul_(dp).sum_to_size(term.shape)
                grads = torch.autograd.grad(term, (q_g, k_g, *params), ds, allow_unused=True)
                dq_b, dk_b = _plus(dq_b, grads[0]), _plus(dk_b, grads[1])
                _accumulate(d_params, grads[2:])
            dq[:, :, rows] += dq_b
            dk[:, :, :n] += dk_b
        return None, dq, dk, dv, *d_params


def _value_gradient(
    plan: TermPlan, p: Tensor, grad_out: Tensor, rows: slice, n_keys: int,
    params: Sequence[Tensor], d_params: list[Tensor | None],
) -> Tensor:  # fmt: skip
    """Z = ∂⟨dO, V(P)⟩/∂P of the block, adding V's gradients in the PE's parameters."""
    with torch.enable_grad():
        p_g = p.detach().requires_grad_()
        value = plan.value_term(p_g, rows, n_keys)
        assert value is not None, "a PE that declares post_normalization gives a value term"
        grads = torch.autograd.grad(value, (p_g, *params), grad_out, allow_unused=True)
    _accumulate(d_params, grads[1:])
    assert grads[0] is not None
    return grads[0]


def _plus(a: Tensor, b: Tensor | None) -> Tensor:
    return a if b is None else a + b


def _accumulate(totals: list[Tensor | None], grads: Sequence[Tensor | None]) -> None:
    for i, grad in enumerate(grads):
        totals[i] = _plus(grad, totals[i]) if grad is not None else totals[i]


def term_attention(
    pe: PositionalEncoding,
    layer: int,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Tensor | None,
    causal: bool,
    chunk: int | None,
) -> Tensor:
    """softmax(scale·q·kᵀ + T, masked) v + V(P) [B, H, Lq, d_v] by the fused CPU kernel, T and
    V the PE's `score_bias` and `value_term` (not `reweight`): q, k, v [B, H, L, d]; mask
    boolean, broadcastable to [B, H, Lq, Lk]; `causal`: the mask is exactly causal; at most
    `chunk` queries a block."""
    plan = TermPlan(pe, layer, q_pos, k_pos, mask, causal, pe.scale(q.shape[-1]), chunk)
    params = [p for p in pe.parameters() if p.requires_grad]
    return _TermAttention.apply(plan, q, k, v, *params)
