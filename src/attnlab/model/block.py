"""What every block of a stack shares: its inputs and cache, the residual wrapper, the scaled
init of projections into the residual stream, and the cross-attention sublayer. A block
takes (x, StackInputs, LayerCache) and returns x; its type is a `BlockType`
(attnlab.model.architecture), named by `conf/block/<name>.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from attnlab.attention.core import AttentionParts
from attnlab.attention.layer import Attention, KVCache
from attnlab.model.architecture import ModelConfig


@dataclass
class StackInputs:
    """What every block of one stack forward needs besides its hidden states."""

    parts: AttentionParts
    q_pos: Tensor  # positions of the new tokens
    k_pos: Tensor  # positions of all keys, cached ones included
    mask: Tensor | None
    is_causal: bool = False  # mask is exactly causal (attnlab.model.transformer.exactly_causal)
    cross_parts: AttentionParts | None = None
    memory: Tensor | None = None
    memory_pos: Tensor | None = None
    memory_mask: Tensor | None = None


@dataclass
class LayerCache:
    self_kv: KVCache | None = None
    cross_kv: KVCache | None = None


def residual(x: Tensor, norm: nn.Module, drop: nn.Module, norm_first: bool, sublayer) -> Tensor:
    """Pre-LN x + f(LN(x)), or post-LN LN(x + f(x))."""
    if norm_first:
        return x + drop(sublayer(norm(x)))
    return norm(x + drop(sublayer(x)))


def out_std(cfg: ModelConfig, n_layers: int) -> float:
    """GPT-2's scaled init for projections that write into the residual stream."""
    return cfg.init_std / (2 * n_layers) ** 0.5


class CrossAttentionSublayer(nn.Module):
    """Residual cross-attention to the encoder output (dot product; PE only if model.cross_pe)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        shape = cfg.multi_head_shape(cfg.decoder_layers, causal=False, cross=True)
        self.attn = Attention(
            shape,
            layer,
            True,
            True,
            cross=True,
            bias=cfg.qkv_bias,
            init_std=cfg.init_std,
            out_std=out_std(cfg, cfg.decoder_layers),
            compute=cfg.compute,
            qk_norm=cfg.qk_norm,
            norm_eps=cfg.layer_norm_eps,
        )
        self.norm = cfg.layer_norm()
        self.drop = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x: Tensor, inputs: StackInputs, cache: KVCache | None) -> Tensor:
        def cross_attend(h: Tensor) -> Tensor:
            assert inputs.cross_parts is not None and inputs.memory_pos is not None
            return self.attn(
                h,
                inputs.cross_parts,
                inputs.q_pos,
                inputs.memory_pos,
                inputs.memory_mask,
                memory=inputs.memory,
                cache=cache,
            )

        return residual(x, self.norm, self.drop, self.norm_first, cross_attend)
