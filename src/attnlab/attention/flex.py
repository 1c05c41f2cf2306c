"""FlexAttention (Dong et al. 2024, arXiv 2412.05496): softmax attention with a score term
inside one fused kernel.

    o_i = Σ_j softmax_j(scale · q_i·k_j + score_mod(i, j)) v_j   over the keys the mask allows

The PE's score term (t5's bucket table, alibi's slopes, shaw's q·w^K) is read per (i, j)
from positions and small tables, and the boolean mask becomes a `BlockMask` whose fully
masked blocks are skipped (a causal stack computes about half the blocks). No [Lq, Lk]
tensor is formed, forward or backward. A row with no visible key gives zeros, as the
plain path does. FlexAttention has no dropout and, on the CPU, no backward pass: the core
takes this path on CUDA with model.flex_attention=true (opt-in until `benchmarks/gpu.py
check` has passed on a GPU) and without attention dropout only (`attnlab.attention.core`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from attnlab.pe.base import ScoreMod


@functools.cache
def compiled_flex_attention() -> Callable[..., Tensor]:
    """flex_attention compiled once per process: uncompiled it runs an unfused reference.
    Static shapes: once a recompile makes them dynamic, torch 2.11's inductor fails to lower
    a score_mod that captures an int (shaw's clip distance), seen on an H100."""
    return torch.compile(flex_attention, dynamic=False)


def block_mask(mask: Tensor, q_len: int, k_len: int) -> BlockMask:
    """The BlockMask of a boolean mask broadcastable to [B, 1, Lq, Lk]."""
    batch = mask.shape[0]
    full = mask.expand(batch, 1, q_len, k_len)
    return create_block_mask(
        lambda b, h, i, j: full[b, 0, i, j],
        batch if batch > 1 else None,
        None,
        q_len,
        k_len,
        device=mask.device,
    )


class BlockMasks:
    """The BlockMask of the last mask seen. Every layer of a stack attends with the same
    mask tensor in one forward pass, so it is built once per pass."""

    def __init__(self) -> None:
        self.mask: Tensor | None = None
        self.block: BlockMask | None = None

    def __call__(self, mask: Tensor, q_len: int, k_len: int) -> BlockMask:
        if mask is not self.mask:
            self.mask, self.block = mask, block_mask(mask, q_len, k_len)
        assert self.block is not None
        return self.block


def flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: ScoreMod,
    mask: BlockMask | None,
    scale: float,
    compiled: bool = True,
) -> Tensor:
    """[B, H, Lq, d_v]; `compiled=False` runs FlexAttention's reference (for CPU tests)."""
    attend = compiled_flex_attention() if compiled else flex_attention
    return attend(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
