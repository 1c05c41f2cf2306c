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
