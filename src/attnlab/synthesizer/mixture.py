"""Mixture of synthesizers (Tay et al., "Synthesizer", arXiv 2005.00743, ICML 2021), §3.3.

    B = Σ_c α_c B_c,    α = softmax(w_ℓ) per layer ℓ,  Σ_c α_c = 1,  w_ℓ initialized to 0

over any list of component synthesizers (`components`: config nodes with `_target_`, each
built with the stack's shape). The mixture returns the weighted dot-product weight
dot = Σ_c α_c·dot_c over the components that compute q·k (None if none do) and the
weighted logits Σ_c α_c·logits_c, so the core forms dot·scale·q·kᵀ + logits: for the
paper's Random + Vanilla, (α_V/√d_h)·q·kᵀ + α_R·R. The dot weight reaches the SDPA fast
path through q (the core scales q by it), so α_V gets gradients on both paths.

Conventions:
- One weight per component and layer, shared by the heads, as in the released mesh-tf code
  (`random_plus_alpha`, `dense_plus_alpha`). Its two-component form (1 − σ(w))·QK + σ(w)·R
  with w = 0 at init is this softmax over (0, w): equal weights at the start.
- Every component keeps its own parameters (per layer inside it). The mixture reads q, k
  if any component does, and its length bound is the smallest of its components'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config.build import build
from attnlab.errors import ConfigError
from attnlab.shape import StackShape
from attnlab.synthesizer.base import Synthesis, Synthesizer


def weighted_sum(alpha: Tensor, terms: Sequence[float | Tensor | None]) -> Tensor | None:
    """Σ_c α_c·term_c over the terms that are not None; None when all are."""
    present = [a * term for a, term in zip(alpha, terms, strict=True) if term is not None]
    return sum(present[1:], present[0]) if present else None


def build_component(node: Any, index: int, shape: StackShape) -> Synthesizer:
    if not isinstance(node, Mapping):
        raise ConfigError(
            f"synthesizer.components[{index}]={node!r} is not a config node: write each "
            "component as a mapping with _target_ and its options (see "
            "conf/synthesizer/mixture.yaml)"
        )
    component = build(node, shape=shape)
    if not isinstance(component, Synthesizer):
        raise ConfigError(
            f"synthesizer.components[{index}] builds {type(component).__name__}, which is not "
            "a Synthesizer: point its _target_ at a class in attnlab.synthesizer"
        )
    return component


class Mixture(Synthesizer):
    per_layer = ("w",)  # its components name their own

    def __init__(self, shape: StackShape, components: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(shape)
        if not components:
            raise ConfigError(
                "synthesizer.components is empty: list at least one synthesizer config node"
            )
        self.components = nn.ModuleList(
            build_component(node, i, shape) for i, node in enumerate(components)
        )
        self.needs_query = any(c.needs_query for c in self.components)
        self.needs_key = any(c.needs_key for c in self.components)
        self.key_positions = any(c.key_positions for c in self.components)
        self.query_positions = any(c.query_positions for c in self.components)
        bounds = [(c.max_len, i) for i, c in enumerate(self.components) if c.max_len is not None]
        if bounds:
            self.max_len, i = min(bounds)
            self.max_len_option = f"components.{i}.{self.components[i].max_len_option}"
        self.w = nn.Parameter(torch.zeros(shape.n_layers, len(self.components)))

    def alpha(self, layer: int) -> Tensor:
        """Mixing weights of one layer, [n_components], summing to 1."""
        return torch.softmax(self.w[layer], -1)

    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Synthesis:
        alpha = self.alpha(layer)
        parts = [c(x, q_pos, k_pos, layer) for c in self.components]
        return Synthesis(
            dot=weighted_sum(alpha, [p.dot for p in parts]),
            logits=weighted_sum(alpha, [p.logits for p in parts]),
        )
