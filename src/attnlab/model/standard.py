"""The standard block (Vaswani et al. 2017, arXiv 1706.03762): multi-head self-attention, then
(in a decoder) cross-attention, then a position-wise feed-forward network, each a residual
sublayer, pre-LN (`model.norm_first`, the default) or post-LN as in the paper.
`conf/block/standard.yaml`; the sizes (d_model, n_heads, d_ff, activation) are the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.core import AttentionParts
from attnlab.attention.layer import Attention
from attnlab.model.architecture import ModelConfig
from attnlab.model.block import CrossAttentionSublayer, LayerCache, StackInputs, out_std, residual
from attnlab.shape import StackShape
from attnlab.tensors import linear


@dataclass(frozen=True)
class Standard:
    """The block type (attnlab.model.architecture.BlockType): d_model/n_heads-wide heads."""

    def self_attention_shape(self, cfg: ModelConfig, n_layers: int, causal: bool) -> StackShape:
        return cfg.multi_head_shape(n_layers, causal, cross=False)

    def layer(
        self, cfg: ModelConfig, shape: StackShape, index: int, parts: AttentionParts, cross: bool
    ) -> TransformerBlock:
        return TransformerBlock(cfg, shape, index, parts, cross)


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and a feed-forward network."""

    def __init__(
        self, cfg: ModelConfig, shape: StackShape, layer: int, parts: AttentionParts, cross: bool
    ) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm_first = cfg.norm_first
        self.self_attn = Attention(
            shape,
            layer,
            parts.needs_query,
            parts.needs_key,
            bias=cfg.qkv_bias,
            init_std=cfg.init_std,
            out_std=out_std(cfg, shape.n_layers),
            compute=cfg.compute,
            output_gate=cfg.output_gate,
            data_width=parts.pe.data_width,
            qk_norm=cfg.qk_norm,
            norm_eps=cfg.layer_norm_eps,
        )
        self.cross = CrossAttentionSublayer(cfg, layer) if cross else None
        self.ff_in = linear(d, cfg.d_ff, cfg.bias, cfg.init_std)
        self.ff_out = linear(cfg.d_ff, d, cfg.bias, out_std(cfg, shape.n_layers))
        self.activation = F.gelu if cfg.activation == "gelu" else F.relu
        self.norm1 = cfg.layer_norm()
        self.norm2 = cfg.layer_norm()
        self.drop = nn.Dropout(cfg.dropout)

    def feed_forward(self, x: Tensor) -> Tensor:
        return self.ff_out(self.drop(self.activation(self.ff_in(x))))

    def forward(self, x: Tensor, inputs: StackInputs, cache: LayerCache) -> Tensor:
        x = residual(
            x,
            self.norm1,
            self.drop,
            self.norm_first,
            lambda h: self.self_attn(
                h,
                inputs.parts,
                inputs.q_pos,
                inputs.k_pos,
                inputs.mask,
                cache=cache.self_kv,
                is_causal=inputs.is_causal,
            ),
        )
        if self.cross is not None:
            x = self.cross(x, inputs, cache.cross_kv)
        return residual(x, self.norm2, self.drop, self.norm_first, self.feed_forward)
