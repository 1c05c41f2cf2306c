"""What a positional encoding or synthesizer is told about the stack it serves."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnlab.errors import ConfigError


@dataclass(frozen=True)
class StackShape:
    """Sizes of one attention stack; variants size their parameters from it.

    One PE, normalizer and synthesizer object serves every layer of a stack: parameters a
    paper shares across layers live once, per-layer ones are indexed by `layer` and named
    in the class's `per_layer` (`per_layer_parameters`).
    """

    d_model: int
    n_heads: int
    head_dim: int  # width of q and k in one head
    value_dim: int  # width of v in one head
    n_layers: int
    causal: bool  # keys after the query are masked
    cross: bool = False  # cross-attention: queries and keys come from different sequences
    embedding_rms: float = 1.0  # token embeddings' RMS at init, as added (for absolute PEs)


def check_causal_only(variant: object, shape: StackShape, otherwise: str) -> None:
    """ConfigError where `variant` (a PE or normalizer) is defined for causal self-attention
    only (its `causal_only` says why) and `shape` is a bidirectional stack or cross-attention;
    `otherwise` names what else to do."""
    reason = getattr(variant, "causal_only", None)
    if reason and (shape.cross or not shape.causal):
        where = "cross-attention" if shape.cross else "a bidirectional stack"
        raise ConfigError(
            f"{type(variant).__name__} works in causal self-attention only ({reason}), not in "
            f"{where}: use a decoder-only model (task.causal=true for the probe), {otherwise}"
        )


def per_layer_parameters(module: nn.Module) -> int:
    """The parameters that `module` and the modules inside it hold for each layer of their
    stack, all layers' together: those of the attributes each module's class names in its
    `per_layer` (a list with an entry a layer, or a tensor whose first dimension is the
    layer; None where a term is off; a buffer holds none), each parameter once."""
    held: dict[int, int] = {}
    for inner in module.modules():
        for name in getattr(inner, "per_layer", ()):
            value = getattr(inner, name)
            if isinstance(value, nn.Module):
                held.update((id(p), p.numel()) for p in value.parameters())
            elif isinstance(value, nn.Parameter):
                held[id(value)] = value.numel()
    return sum(held.values())
