"""The attention weights drawn in heat maps are the ones the model applies."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, every_combination, make_parts, refused_unless, small_variant

from attnlab.attention.core import Compute, attend, attention_weights
from attnlab.config.build import build
from attnlab.config.options import options, variant
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.maps import attention_maps
from attnlab.model.standard import Standard
from attnlab.model.transformer import EncoderDecoder, Tagger


@pytest.mark.parametrize(
    "pe,norm,synthesizer,causal",
    every_combination(options("pe"), options("norm"), options("synthesizer"), [False, True]),
)
def test_the_weights_times_v_are_the_attention_output(pe, norm, synthesizer, causal):
    with refused_unless(causal, pe, norm, synthesizer=synthesizer):
        torch.manual_seed(0)
        shape = replace(SHAPE, causal=causal)
        nodes = [
            small_variant(g, o)
            for g, o in (("pe", pe), ("norm", norm), ("synthesizer", synthesizer))
        ]
        parts = make_parts(*nodes, shape=shape).double()
        b, h, n, d = 2, shape.n_heads, 7, shape.head_dim
        x = torch.randn(b, n, shape.d_model, dtype=torch.float64)
        q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3))
        pos = torch.arange(n)
        mask = torch.ones(b, 1, n, n, dtype=torch.bool)
        mask[1, ..., -2:] = False
        if causal:
            mask &= torch.ones(n, n, dtype=torch.bool).tril()
        weights = attention_weights(parts, 1, x, q, k, pos, pos, mask)
        expected = weights @ v
        value_term = parts.pe.value_term(weights, pos, pos, 1)
        if value_term is not None:
            expected = expected + value_term
        for fast in (False, True):
            out = attend(parts, 1, x, q, k, v, pos, pos, mask, Compute(fast=fast))
            torch.testing.assert_close(out, expected)
        assert (weights[mask.expand_as(weights).logical_not()] == 0).all(), "masked keys get 0"


def model_config(**changes) -> ModelConfig:
    sizes = {"block": Standard(), "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32}
    return ModelConfig(**{**sizes, "dropout": 0.0, **changes})


def spec(pe: str = "rope", norm: str = "softmax") -> AttentionConfig:
    return AttentionConfig(
        small_variant("pe", pe), small_variant("norm", norm), small_variant("synthesizer", "dot")
    )


@pytest.mark.parametrize(
    "block,heads",
    [(Standard(), 2), (build(variant("block", "gau", "qk_dim=8")), 1)],
    ids=["standard", "gau"],
)
def test_a_causal_stack_has_one_map_per_layer_with_nothing_above_the_diagonal(block, heads):
    model = Tagger(model_config(block=block, n_heads=heads), spec(), 5, 4, causal=True).eval()
    tokens = torch.randint(0, 5, (1, 6))
    maps = attention_maps(model, lambda: model(tokens, None))
    assert len(maps) == 2
    for weights in maps.values():
        assert weights.shape == (1, heads, 6, 6)
        assert (weights.triu(1) == 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(1, heads, 6))
    assert not any(m._forward_hooks for m in model.modules()), "the hooks are removed"


def test_an_encoder_decoder_has_encoder_decoder_and_cross_attention_maps():
    model = EncoderDecoder(model_config(), spec("t5", "l2"), 9, 9).eval()
    src, tgt = torch.randint(1, 9, (1, 5)), torch.randint(1, 9, (1, 3))
    maps = attention_maps(model, lambda: model(src, src == 0, tgt))
    shapes = {name: tuple(weights.shape) for name, weights in maps.items()}
    assert shapes == {
        "encoder.blocks.0.self_attn": (1, 2, 5, 5),
        "encoder.blocks.1.self_attn": (1, 2, 5, 5),
        "decoder.blocks.0.self_attn": (1, 2, 3, 3),
        "decoder.blocks.0.cross.attn": (1, 2, 3, 5),
        "decoder.blocks.1.self_attn": (1, 2, 3, 3),
        "decoder.blocks.1.cross.attn": (1, 2, 3, 5),
    }
    l2_norms = maps["encoder.blocks.0.self_attn"].norm(dim=-1)
    torch.testing.assert_close(l2_norms, torch.ones_like(l2_norms), msg="l2 rows have norm 1")
