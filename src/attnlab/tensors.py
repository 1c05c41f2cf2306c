"""Tensor helpers shared by the attention core, the blocks and the variants that project."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """[B, L, H·d] -> [B, H, L, d]."""
    b, length, width = x.shape
    return x.view(b, length, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[B, H, L, d] -> [B, L, H·d]."""
    b, h, length, d = x.shape
    return x.transpose(1, 2).reshape(b, length, h * d)


def linear(d_in: int, d_out: int, bias: bool, std: float) -> nn.Linear:
    layer = nn.Linear(d_in, d_out, bias=bias)
    nn.init.normal_(layer.weight, std=std)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def float64_home(device: torch.device) -> torch.device:
    """Where float64 work for `device` runs: the device itself, or the CPU for Apple's MPS,
    which has no float64 (and which `accelerator: auto` picks on a Mac)."""
    return torch.device("cpu") if device.type == "mps" else device


def flush_denormals() -> None:
    """Treat float32 values below 2⁻¹²⁶ (about 1.2e−38) as zero on the CPU, in this thread and
    in the threads of torch's pool, which copy the setting when they start: called first by
    every entry point, before any parallel work. Softmax weights exp(s − max) of scores far
    below a row's maximum (an ALiBi or KERPLE penalty at long range) land there, and x86
    processors take such operands slowly: at L = 2,048 a fused attention kernel with ALiBi's
    term ran 1.25× slower than with a zero term, on par once flushed. Nothing measurable
    changes: such a weight is below 10⁻³⁰ of its row's largest."""
    torch.set_flush_denormal(True)
