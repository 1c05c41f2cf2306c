"""pe=fox (forgetting attention, Lin et al. 2025): a layer's output against the definition in
float64 with a naive loop over i and j, fixed gates equal to ALiBi-like slopes, every path
(SDPA with the term as its mask, the plain path, blocks of queries) the same, cached decoding
one token at a time equal to the full pass, both blocks, and the refusal outside causal
self-attention."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, decoded_one_at_a_time
from test_combinations import attention, tiny, tokens

from attnlab.attention.core import AttentionParts, Compute
from attnlab.attention.layer import Attention
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.gau import GAU
from attnlab.model.transformer import DecoderLM

CAUSAL = replace(SHAPE, causal=True)
LENGTH = 7


def fox_layer(compute: Compute | None = None) -> tuple[Attention, AttentionParts]:
    torch.manual_seed(0)
    parts = AttentionParts.from_config(
        variant("pe", "fox"), variant("norm", "softmax"), variant("synthesizer", "dot"), CAUSAL
    )
    compute = compute or Compute()
    layer = Attention(CAUSAL, 1, True, True, init_std=0.3, compute=compute, data_width=1)
    return layer.double(), parts


def causal_mask(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()[None, None]


def naive_fox(layer: Attention, x: torch.Tensor) -> torch.Tensor:
    """softmax_j(q_i·k_j/√d + Σ_{l=j+1..i} log σ(w_h·x_l + b_h)) v_j, loop by loop."""
    h, d = CAUSAL.n_heads, CAUSAL.head_dim
    q, k, v = layer.qkv_proj(x).split(layer.widths, -1)
    gate = layer.data_proj(x)  # [B, L, H]
    out = torch.zeros_like(v)
    for b in range(x.shape[0]):
        for head in range(h):
            cols = slice(head * d, (head + 1) * d)
            for i in range(x.shape[1]):
                scores = []
                for j in range(i + 1):
                    between = range(j + 1, i + 1)
                    decay = sum(math.log(torch.sigmoid(gate[b, t, head])) for t in between)
                    dot = float((q[b, i, cols] @ k[b, j, cols]).detach()) / math.sqrt(d)
                    scores.append(dot + decay)
                weights = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
                out[b, i, cols] = weights @ v[b, : i + 1, cols]
    return layer.out_proj(out)


def test_a_layer_is_the_definition_computed_loop_by_loop():
    layer, parts = fox_layer()
    x = torch.randn(2, LENGTH, CAUSAL.d_model, dtype=torch.float64)
    pos = torch.arange(LENGTH)
    got = layer(x, parts, pos, pos, causal_mask(LENGTH), is_causal=True)
    torch.testing.assert_close(got, naive_fox(layer, x))


def test_fixed_gates_are_a_linear_bias_in_the_distance():
    """With w_f = 0 every gate is σ(b_h): the term is (i − j)·log σ(b_h), ALiBi's form with
    slope −log σ(b_h)."""
    layer, parts = fox_layer()
    with torch.no_grad():
        layer.data_proj.weight.zero_()
        layer.data_proj.bias.copy_(torch.tensor([0.5, -2.0]))
    x = torch.randn(1, LENGTH, CAUSAL.d_model, dtype=torch.float64)
    data = layer.project(x, parts, torch.arange(LENGTH), torch.arange(LENGTH)).data
    pos = torch.arange(LENGTH)
    term = parts.pe.data_term(None, None, data, pos, pos, 1)
    slopes = torch.nn.functional.logsigmoid(torch.tensor([0.5, -2.0], dtype=torch.float64))
    distance = (pos[:, None] - pos[None, :]).double()
    torch.testing.assert_close(term[0], slopes[:, None, None] * distance)


# the other paths, and the blocks and norms decoded, for every data-dependent PE (fox, path)
COMPUTES = pytest.mark.parametrize(
    "compute",
    [Compute(fast=False), Compute(chunk=3), Compute(fast=False, chunk=2)],
    ids=["plain", "blocks", "plain blocks"],
)
BLOCKS = pytest.mark.parametrize("block", ["standard", "gau"])
NORMS = pytest.mark.parametrize("norm", ["softmax", "stick_breaking", "selective"])


def check_every_path(make_layer: Callable[..., tuple[Attention, AttentionParts]], compute):
    """The layer `make_layer(compute)` gives the output and input gradient of `make_layer()`
    (the default, fast computation), in a causal stack."""
    fast, parts = make_layer()
    other, _ = make_layer(compute)
    x = torch.randn(2, LENGTH, CAUSAL.d_model, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(LENGTH)
    expected = fast(x, parts, pos, pos, causal_mask(LENGTH), is_causal=True)
    got = other(x, parts, pos, pos, causal_mask(LENGTH), is_causal=True)
    torch.testing.assert_close(got, expected)
    (grad,) = torch.autograd.grad(got.sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(grad, expected_grad)


def check_decoding(pe: str, block: str, norm: str) -> None:
    """A decoder-only model with `pe`, decoding one token at a time, gives the full pass."""
    torch.manual_seed(0)
    blocks = {"block": GAU(qk_dim=8, expansion=2), "n_heads": 1} if block == "gau" else {}
    model = DecoderLM(tiny(init_std=0.3, **blocks), attention(pe, norm, "dot"), 11)
    model = model.double().eval()
    x = tokens()
    torch.testing.assert_close(decoded_one_at_a_time(model, x, prefix=2), model(x))


@COMPUTES
def test_every_path_computes_the_same(compute):
    check_every_path(fox_layer, compute)


@BLOCKS
@NORMS
def test_decoding_one_token_at_a_time_is_the_full_pass(block, norm):
    check_decoding("fox", block, norm)


def test_the_gates_learn():
    torch.manual_seed(0)
    model = DecoderLM(tiny(), attention("fox", "softmax", "dot"), 11)
    x = tokens()
    model(x).logsumexp(-1).mean().backward()
    gates = [m.data_proj for m in model.modules() if isinstance(m, Attention)]
    assert len(gates) == 2 and all(g.weight.grad.abs().sum() > 0 for g in gates)
    assert all(g.bias.grad.abs().sum() > 0 for g in gates)


@pytest.mark.parametrize(
    "shape", [SHAPE, replace(CAUSAL, cross=True)], ids=["bidirectional", "cross-attention"]
)
def test_outside_causal_self_attention_it_is_one_sentence(shape):
    with pytest.raises(ConfigError, match="causal self-attention only"):
        build(variant("pe", "fox"), shape=shape)
