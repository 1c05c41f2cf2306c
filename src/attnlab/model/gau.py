"""Gated attention unit (Hua, Dai, Liu, Le 2022, "Transformer Quality in Linear Time", FLASH).

    U = SiLU(X W_u), V = SiLU(X W_v)        [L, e], e = expansion·d
    Z = SiLU(X W_z)                          [L, s], shared by queries and keys
    q = Z ⊙ γ_q + β_q,  k = Z ⊙ γ_k + β_k    per-dimension scale and offset
    O = (U ⊙ A V) W_o,  A = normalize(scores(q, k))

One head; A comes from the same composable attention as the standard block (the stack's
PE, synthesizer and normalizer). `block=gau` (conf/block/gau.yaml) sets s = `qk_dim` and
e = `expansion`·d_model; the `model=gau` preset adds norm=relu2, the paper's choice, and
twice the layers.
γ ~ N(0, 0.02²) and β = 0 as in the paper's pseudocode. In an encoder-decoder, a decoder
GAU block adds a standard multi-head cross-attention sublayer, which the paper has none of.
The GAU replaces both attention and FFN, so a GAU block has no feed-forward sublayer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.core import AttentionParts, attend, attention_weights
from attnlab.attention.layer import KVCache, Projected, rotate_and_cache
from attnlab.config.values import require_counts
from attnlab.errors import ConfigError
from attnlab.model.architecture import ModelConfig
from attnlab.model.block import CrossAttentionSublayer, LayerCache, StackInputs, out_std, residual
from attnlab.shape import StackShape
from attnlab.tensors import linear


@dataclass(frozen=True)
class GAU:
    """The block type (attnlab.model.architecture.BlockType) and its options."""

    qk_dim: int  # s
    expansion: int  # e = expansion·d_model

    def __post_init__(self) -> None:
        require_counts("block", qk_dim=self.qk_dim, expansion=self.expansion)

    def self_attention_shape(self, cfg: ModelConfig, n_layers: int, causal: bool) -> StackShape:
        e = self.expansion * cfg.d_model
        return StackShape(
            cfg.d_model, 1, self.qk_dim, e, n_layers, causal, embedding_rms=cfg.embedding_rms
        )

    def layer(
        self, cfg: ModelConfig, shape: StackShape, index: int, parts: AttentionParts, cross: bool
    ) -> GAUBlock:
        return GAUBlock(cfg, shape, index, parts, cross)


class GatedAttentionUnit(nn.Module):
    """The unit inside the residual connection: X -> (U ⊙ A V) W_o."""

    def __init__(self, cfg: ModelConfig, shape: StackShape, layer: int, parts: AttentionParts):
        super().__init__()
        d, s, e = cfg.d_model, shape.head_dim, shape.value_dim
        self.layer, self.compute = layer, cfg.compute
        self.uv = linear(d, 2 * e, True, cfg.init_std)
        self.needs_query, self.needs_key = parts.needs_query, parts.needs_key
        self.z = linear(d, s, True, cfg.init_std) if self.needs_query or self.needs_key else None
        self.gamma = nn.ParameterDict()
        self.beta = nn.ParameterDict()
        for name in ("q",) * self.needs_query + ("k",) * self.needs_key:
            self.gamma[name] = nn.Parameter(torch.randn(s) * 0.02)
            self.beta[name] = nn.Parameter(torch.zeros(s))
        width = parts.pe.data_width  # a data-dependent PE's channels, as in attention's
        self.data = linear(d, width, True, cfg.init_std) if width else None
        self.out = linear(e, d, True, out_std(cfg, shape.n_layers))

    def project(
        self, x: Tensor, inputs: StackInputs, cache: KVCache | None = None
    ) -> tuple[Tensor, Projected]:
        """u [B, L, e] and one head of q, k (rotated by the PE), v and the PE's data
        channels, with the cache's."""
        u, v = F.silu(self.uv(x)).chunk(2, -1)
        z = F.silu(self.z(x))[:, None] if self.z is not None else None  # one head
        q = z * self.gamma["q"] + self.beta["q"] if self.needs_query else None
        k = z * self.gamma["k"] + self.beta["k"] if self.needs_key else None
        data = None if self.data is None else self.data(x)[:, None]
        new = Projected(q, k, v[:, None], data)
        return u, rotate_and_cache(inputs.parts.pe, new, inputs.q_pos, cache)

    def forward(self, x: Tensor, inputs: StackInputs, cache: KVCache | None = None) -> Tensor:
        u, (q, k, v, data) = self.project(x, inputs, cache)
        compute = self.compute.at(self.training)
        parts, q_pos, k_pos, mask = inputs.parts, inputs.q_pos, inputs.k_pos, inputs.mask
        state = None if cache is None else cache.norm_state
        args = (q_pos, k_pos, mask, compute, inputs.is_causal, data, state)
        a = attend(parts, self.layer, x, q, k, v, *args)
        return self.out(u * a[:, 0])

    def weights(self, x: Tensor, inputs: StackInputs) -> Tensor:
        """The attention weights A [B, 1, Lq, Lk] of `forward` with the same inputs, no cache."""
        _, (q, k, _, data) = self.project(x, inputs)
        parts, q_pos, k_pos = inputs.parts, inputs.q_pos, inputs.k_pos
        return attention_weights(parts, self.layer, x, q, k, q_pos, k_pos, inputs.mask, data)


class GAUBlock(nn.Module):
    def __init__(
        self, cfg: ModelConfig, shape: StackShape, layer: int, parts: AttentionParts, cross: bool
    ) -> None:
        super().__init__()
        if cfg.output_gate is not None:
            raise ConfigError(
                f"model.output_gate={cfg.output_gate} gates block=standard's attention; "
                "block=gau gates its output already (U ⊙ AV): drop model.output_gate"
            )
        if cfg.qk_norm:
            raise ConfigError(
                "model.qk_norm=true normalizes block=standard's heads; block=gau scales its "
                "one shared q and k per dimension already (γ, β): drop model.qk_norm"
            )
        self.norm_first = cfg.norm_first
        self.unit = GatedAttentionUnit(cfg, shape, layer, parts)
        self.norm = cfg.layer_norm()
        self.drop = nn.Dropout(cfg.dropout)
        self.cross = CrossAttentionSublayer(cfg, layer) if cross else None

    def forward(self, x: Tensor, inputs: StackInputs, cache: LayerCache) -> Tensor:
        x = residual(
            x, self.norm, self.drop, self.norm_first, lambda h: self.unit(h, inputs, cache.self_kv)
        )
        if self.cross is not None:
            x = self.cross(x, inputs, cache.cross_kv)
        return x
