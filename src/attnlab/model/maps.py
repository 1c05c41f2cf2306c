"""The attention weights of every layer and head for one forward pass, for looking at them.

Each attention layer (`Attention`, `GatedAttentionUnit`) can recompute the weights that its
forward pass applies to v (`weights`, by the plain path: the fused path never forms them).
`attention_maps` records them through forward hooks, so the model's code is unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.attention.layer import Attention
from attnlab.model.gau import GatedAttentionUnit

LAYERS = (Attention, GatedAttentionUnit)


def attention_maps(model: nn.Module, forward: Callable[[], object]) -> dict[str, Tensor]:
    """Call `forward()`, a forward pass of `model`, and return the weights [B, H, Lq, Lk] of
    every attention layer it ran, keyed by the layer's module name, in the order they ran."""
    maps: dict[str, Tensor] = {}

    def record(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> None:
            bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
            bound.pop("cache", None)
            bound.pop("is_causal", None)  # a hint for SDPA; the plain path reads the mask
            maps[name] = module.weights(**bound).detach()

        return hook

    handles = [
        module.register_forward_hook(record(name), with_kwargs=True)
        for name, module in model.named_modules()
        if isinstance(module, LAYERS)
    ]
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return maps
