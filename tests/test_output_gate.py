"""model.output_gate, gated attention (Qiu et al. 2025): each head's output times σ(x W_g),
headwise or elementwise, against the formula in float64, in a full pass and in cached
decoding; refused where it does not apply."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, compose_config, make_parts

from attnlab.attention.layer import Attention, KVCache
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture
from attnlab.model.transformer import DecoderLM, attention_mask
from attnlab.tensors import split_heads

CAUSAL = replace(SHAPE, causal=True)


def gated(kind: str) -> Attention:
    torch.manual_seed(0)
    return Attention(CAUSAL, 0, True, True, init_std=0.5, out_std=0.5, output_gate=kind).double()


def expected_output(attn: Attention, x: torch.Tensor, kind: str) -> torch.Tensor:
    h, d = SHAPE.n_heads, SHAPE.head_dim
    q, k, v = (split_heads(t, h) for t in attn.qkv_proj(x).split(SHAPE.d_model, -1))
    length = x.shape[1]
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~mask, -math.inf)
    heads = torch.softmax(scores, -1) @ v  # [B, H, L, d]
    gate = torch.sigmoid(x @ attn.gate.weight.T)  # [B, L, H or H·d]
    gate = gate.view(*gate.shape[:2], h, -1).transpose(1, 2)  # [B, H, L, 1 or d]
    assert gate.shape[-1] == (1 if kind == "headwise" else d)
    return attn.out_proj((heads * gate).transpose(1, 2).flatten(-2))


@pytest.mark.parametrize("kind", ["headwise", "elementwise"])
@pytest.mark.parametrize("cached", [False, True], ids=["full", "one-query"])
def test_each_heads_output_is_gated_by_the_sigmoid_of_its_input(kind, cached):
    attn, parts = gated(kind), make_parts("none", shape=CAUSAL).double()
    x = torch.randn(2, 7, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(7)
    expected = expected_output(attn, x, kind)
    if cached:
        cache, prefix = KVCache(), pos[:-1]
        attn(x[:, :-1], parts, prefix, prefix, attention_mask(prefix, prefix, None, True),
             cache=cache)  # fmt: skip
        out = attn(x[:, -1:], parts, pos[-1:], pos, None, cache=cache)
        expected = expected[:, -1:]
    else:
        out = attn(x, parts, pos, pos, attention_mask(pos, pos, None, True), is_causal=True)
    torch.testing.assert_close(out, expected)
    assert attn.gate.bias is None


def test_gate_weights_of_zero_halve_every_head():
    plain = Attention(CAUSAL, 0, True, True, init_std=0.5, out_std=0.5).double()
    attn = gated("elementwise")
    attn.load_state_dict({**plain.state_dict(), "gate.weight": torch.zeros_like(attn.gate.weight)})
    parts = make_parts("none", shape=CAUSAL).double()
    x, pos = torch.randn(1, 5, SHAPE.d_model, dtype=torch.float64), torch.arange(5)
    mask = attention_mask(pos, pos, None, True)
    bias = plain.out_proj.bias
    torch.testing.assert_close(
        attn(x, parts, pos, pos, mask) - bias, (plain(x, parts, pos, pos, mask) - bias) / 2
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.output_gate=sigmoid"], "model.output_gate='sigmoid' is not one of"),
        (["block=gau", "model.output_gate=headwise"], "block=gau gates its output already"),
    ],
)
def test_a_gate_that_does_not_apply_is_one_sentence(overrides, message, tmp_path):
    cfg = compose_config(["task=lm", "model=tiny", *overrides], tmp_path)
    with pytest.raises(ConfigError, match=message):
        arch = Architecture.from_config(cfg)
        DecoderLM(arch.model, arch.attention, 20)
