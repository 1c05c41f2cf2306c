"""Model hyperparameters (the `model` and `block` config groups) and the attention choices
of a run."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from torch import nn

from attnlab.attention.core import AttentionParts, Compute
from attnlab.attention.layer import OUTPUT_GATES
from attnlab.config.build import build, to_dict
from attnlab.config.groups import ARCHITECTURE, METADATA
from attnlab.config.values import is_number, require_counts
from attnlab.errors import ConfigError
from attnlab.model.schedule import Schedule
from attnlab.shape import StackShape

ACTIVATIONS = ("relu", "gelu")
# the parts of an encoder-decoder's cross-attention besides the run's norm (conf/model/small.yaml)
CROSS_ATTENTION = {
    "pe": {"_target_": "attnlab.pe.none.NoPE"},  # while cross_pe is false
    "synthesizer": {"_target_": "attnlab.synthesizer.dot.Dot"},
}


class BlockType(Protocol):
    """A block type, the `block` group (`conf/block/*.yaml` names one, e.g.
    `attnlab.model.gau.GAU`): a frozen dataclass of the block's own options that gives the
    shape of a stack's self-attention and builds layer `index` of a stack."""

    def self_attention_shape(self, cfg: ModelConfig, n_layers: int, causal: bool) -> StackShape: ...

    def layer(
        self, cfg: ModelConfig, shape: StackShape, index: int, parts: AttentionParts, cross: bool
    ) -> nn.Module: ...


@dataclass(frozen=True)
class ModelConfig:
    block: BlockType  # the `block` group: Standard (attention + FFN) or GAU
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
    bias: bool = True  # the feed-forward layers' and LayerNorms' biases (nanoGPT: bias=False)
    init_std: float = 0.02
    embed_scale: bool = True  # Vaswani: token embeddings ~ N(0, 1/d), multiplied by √d
    tie_embeddings: bool = True  # share input and output embeddings where vocabularies match
    cross_pe: bool = False  # apply the PE to cross-attention too (T5 does not)
    cross_attention: Mapping[str, Any] = field(default_factory=lambda: dict(CROSS_ATTENTION))
    fast_attention: bool = True  # use F.scaled_dot_product_attention where it applies
    flex_attention: bool = False  # on CUDA, FlexAttention for softmax with t5/alibi/shaw terms
    attention_chunk: int | None = 512  # queries attended at once (recomputed in training)
    output_gate: str | None = None  # self-attention's output gated: headwise | elementwise
    qk_norm: bool = False  # RMSNorm of each head's q and k, learned scale (block=standard)
    schedule: Mapping[str, Any] | None = None  # hybrid stacks (model/schedule.py); None: uniform
    layer_norm_eps: float = 1e-5
    compile: bool = False  # torch.compile the network's forward (training and validation loss)

    def __post_init__(self) -> None:
        sizes = ("d_model", "n_heads", "n_layers", "d_ff")
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
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"model.activation={self.activation!r} is not one of: {', '.join(ACTIVATIONS)}"
            )
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}: "
                "choose d_model as a multiple of n_heads"
            )
        if self.output_gate not in OUTPUT_GATES:
            raise ConfigError(
                f"model.output_gate={self.output_gate!r} is not one of: null, headwise, elementwise"
            )
        self.layer_schedule  # noqa: B018 (checks model.schedule once, at build)
        if self.attention_chunk is not None and self.attention_chunk < 1:
            raise ConfigError(
                f"model.attention_chunk={self.attention_chunk} must be a positive number of "
                "queries, or null to attend to whole sequences at once"
            )

    @classmethod
    def from_config(cls, node: Mapping[str, Any], block: Mapping[str, Any]) -> ModelConfig:
        """From the `model` and `block` config nodes."""
        params = {k: v for k, v in to_dict(node).items() if k not in METADATA}
        known = {f.name for f in fields(cls)} - {"block"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError(
                f"model has no option {', '.join(unknown)}; its options are: {', '.join(sorted(known))}"
            )
        return cls(**params, block=build(block))

    @property
    def compute(self) -> Compute:
        return Compute(
            self.attn_dropout, self.fast_attention, self.attention_chunk, self.flex_attention
        )

    @property
    def layer_schedule(self) -> Schedule | None:
        """model.schedule read: each layer's encoding and span; None for a uniform stack."""
        return None if self.schedule is None else Schedule.from_config(self.schedule)

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    @property
    def embedding_rms(self) -> float:
        """RMS of the token embeddings as added, at init (TokenEmbedding): N(0, 1/d)·√d has
        RMS 1, unscaled N(0, init_std²) has RMS init_std."""
        return 1.0 if self.embed_scale else self.init_std

    def layer_norm(self) -> nn.LayerNorm:
        return nn.LayerNorm(self.d_model, eps=self.layer_norm_eps, bias=self.bias)

    def multi_head_shape(self, n_layers: int, causal: bool, cross: bool) -> StackShape:
        d_h = self.d_model // self.n_heads
        return StackShape(
            self.d_model, self.n_heads, d_h, d_h, n_layers, causal, cross, self.embedding_rms
        )


@dataclass(frozen=True)
class AttentionConfig:
    """The `pe`, `norm` and `synthesizer` config nodes of a run, as plain dicts (those given
    are kept, not copied: `build` copies what it takes apart)."""

    pe: dict[str, Any]
    norm: dict[str, Any]
    synthesizer: dict[str, Any]

    @classmethod
    def from_config(cls, pe: Mapping, norm: Mapping, synthesizer: Mapping) -> AttentionConfig:
        return cls(
            *(node if isinstance(node, dict) else to_dict(node) for node in (pe, norm, synthesizer))
        )


@dataclass(frozen=True)
class Architecture:
    """A network's configuration: the model's sizes and block, and its attention parts."""

    model: ModelConfig
    attention: AttentionConfig
    nodes: dict[str, dict[str, Any]] = field(compare=False, repr=False)  # what it was built from

    @classmethod
    def from_config(cls, nodes: Mapping[str, Mapping]) -> Architecture:
        """From the config nodes named in ARCHITECTURE."""
        missing = [group for group in ARCHITECTURE if group not in nodes]
        if missing:
            raise ConfigError(f"the architecture has no {', '.join(missing)} config node")
        plain = {group: copy.deepcopy(to_dict(nodes[group])) for group in ARCHITECTURE}
        return cls(
            ModelConfig.from_config(plain["model"], plain["block"]),
            AttentionConfig.from_config(plain["pe"], plain["norm"], plain["synthesizer"]),
            plain,
        )

    def as_data(self) -> dict[str, dict[str, Any]]:
        """The config nodes it was built from, as a checkpoint holds them."""
        return copy.deepcopy(self.nodes)
