"""Model hyperparameters (the `model` config group) and the attention choices of a run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from attnlab.attention.core import Compute
from attnlab.attention.shape import StackShape
from attnlab.config import METADATA, ConfigError, is_number, require_counts, to_dict

ACTIVATIONS = ("relu", "gelu")
BLOCKS = ("standard", "gau")


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 3
    n_decoder_layers: int | None = None  # encoder-decoder only; default n_layers
    d_ff: int = 1024
    dropout: float = 0.1
    attn_dropout: float = 0.0
    activation: str = "gelu"
    norm_first: bool = True  # pre-LN; False: post-LN as in Vaswani et al.
    qkv_bias: bool = True
    block: str = "standard"  # standard: attention + FFN; gau: gated attention unit
    gau_qk_dim: int = 128  # GAU's s
    gau_expansion: int = 2  # GAU's e = expansion·d_model
    init_std: float = 0.02
    embed_scale: bool = True  # Vaswani: token embeddings ~ N(0, 1/d), multiplied by √d
    tie_embeddings: bool = True  # share input and output embeddings where vocabularies match
    cross_pe: bool = False  # apply the PE to cross-attention too (T5 does not)
    fast_attention: bool = True  # use F.scaled_dot_product_attention where it applies
    attention_chunk: int | None = 512  # training attends in recomputed blocks of this many queries
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        sizes = ("d_model", "n_heads", "n_layers", "d_ff", "gau_qk_dim", "gau_expansion")
        require_counts("model", **{name: getattr(self, name) for name in sizes})
        if self.n_decoder_layers is not None:
            require_counts("model", n_decoder_layers=self.n_decoder_layers)
        for name in ("dropout", "attn_dropout"):
            value = getattr(self, name)
            if not (is_number(value) and 0 <= value < 1):
                raise ConfigError(f"model.{name}={value!r} must be a probability in [0, 1)")
        for name in ("init_std", "layer_norm_eps"):
            value = getattr(self, name)
            if not (is_number(value) and value > 0):
                raise ConfigError(f"model.{name}={value!r} must be a positive number")
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ConfigError(f"model.{f.name}={getattr(self, f.name)!r} must be true or false")
        if self.block not in BLOCKS:
            raise ConfigError(f"model.block={self.block!r} is not one of: {', '.join(BLOCKS)}")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"model.activation={self.activation!r} is not one of: {', '.join(ACTIVATIONS)}"
            )
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}: "
                "choose d_model as a multiple of n_heads"
            )
        if self.attention_chunk is not None and self.attention_chunk < 1:
            raise ConfigError(
                f"model.attention_chunk={self.attention_chunk} must be a positive number of "
                "queries, or null to attend to whole sequences at once"
            )
        if (self.d_model // self.n_heads) % 2 or self.gau_qk_dim % 2:
            raise ConfigError(
                f"the head width d_model/n_heads={self.d_model // self.n_heads} and "
                f"gau_qk_dim={self.gau_qk_dim} must be even (rotary PEs rotate pairs)"
            )

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> ModelConfig:
        params = {k: v for k, v in to_dict(node).items() if k not in METADATA}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError(
                f"model has no option {', '.join(unknown)}; its options are: {', '.join(sorted(known))}"
            )
        return cls(**params)

    @property
    def compute(self) -> Compute:
        return Compute(self.attn_dropout, self.fast_attention, self.attention_chunk)

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    def self_attention_shape(self, n_layers: int, causal: bool) -> StackShape:
        if self.block == "gau":
            e = self.gau_expansion * self.d_model
            return StackShape(self.d_model, 1, self.gau_qk_dim, e, n_layers, causal)
        return self.multi_head_shape(n_layers, causal, cross=False)

    def multi_head_shape(self, n_layers: int, causal: bool, cross: bool) -> StackShape:
        d_h = self.d_model // self.n_heads
        return StackShape(self.d_model, self.n_heads, d_h, d_h, n_layers, causal, cross)


@dataclass(frozen=True)
class AttentionConfig:
    """The `pe`, `norm` and `synthesizer` config nodes of a run, as plain dicts."""

    pe: dict[str, Any]
    norm: dict[str, Any]
    synthesizer: dict[str, Any]

    @classmethod
    def from_config(cls, pe: Mapping, norm: Mapping, synthesizer: Mapping) -> AttentionConfig:
        return cls(to_dict(pe), to_dict(norm), to_dict(synthesizer))
