"""What a positional encoding or synthesizer is told about the stack it serves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StackShape:
    """Sizes of one attention stack; variants size their parameters from it.

    One PE, normalizer and synthesizer object serves every layer of a stack: parameters a
    paper shares across layers live once, per-layer ones are indexed by `layer`.
    """

    d_model: int
    n_heads: int
    head_dim: int  # width of q and k in one head
    value_dim: int  # width of v in one head
    n_layers: int
    causal: bool  # keys after the query are masked
    cross: bool = False  # cross-attention: queries and keys come from different sequences
    embedding_rms: float = 1.0  # token embeddings' RMS at init, as added (for absolute PEs)
