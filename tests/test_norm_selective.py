"""norm=selective (Leviathan et al. 2024) beyond the generic formula test of test_norm.py:
what a token selects away fades for the tokens after it and for no one else, in every head;
the selecting head is an option; a layer gives the same on every path, queries never split
into blocks; cached decoding (one token a step, a prompt then steps, beam reordering)
equals the full pass in standard and GAU decoders; refused outside causal self-attention.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, decoded_one_at_a_time
from test_combinations import attention, tiny, tokens
from test_pe_fox import BLOCKS, COMPUTES, check_decoding, check_every_path

from attnlab.attention.core import AttentionParts, Compute
from attnlab.attention.layer import Attention
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import DecoderLM, StackCache

CAUSAL = replace(SHAPE, causal=True)
LENGTH = 6


def selective(*overrides: str):
    return build(variant("norm", "selective", *overrides), shape=CAUSAL)


def causal() -> torch.Tensor:
    return torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()[None, None]


def test_a_key_selected_away_fades_for_later_queries_only_in_every_head():
    scores = torch.zeros(1, CAUSAL.n_heads, LENGTH, LENGTH, dtype=torch.float64)
    scores[0, 0, 3, 1] = 2.0  # query 3 selects key 1 (head 0 selects for every head)
    scores[0, 0, 4, 2] = -5.0  # a negative score selects nothing (ReLU)
    weights = selective()(scores, causal(), 0)
    plain = build(variant("norm", "softmax"), shape=CAUSAL)(scores, causal(), 0)
    torch.testing.assert_close(weights[..., :4, :], plain[..., :4, :])  # up to the selector
    for i in (4, 5):
        expected = torch.zeros(i + 1, dtype=torch.float64)
        expected[1] = -2.0
        for h in range(CAUSAL.n_heads):
            row = scores[0, h, i, : i + 1] + expected
            torch.testing.assert_close(weights[0, h, i, : i + 1], torch.softmax(row, -1))


def test_the_first_key_and_a_querys_own_are_never_selected():
    scores = torch.zeros(1, CAUSAL.n_heads, LENGTH, LENGTH, dtype=torch.float64)
    scores[0, 0, :, 0] = 9.0  # every query selects the first key: no effect
    scores[0, 0, 2, 2] = 9.0  # query 2 selects its own key: no effect
    torch.testing.assert_close(
        selective()(scores, causal(), 0),
        build(variant("norm", "softmax"), shape=CAUSAL)(scores, causal(), 0),
    )


def test_the_head_option_chooses_the_selecting_head_and_names_a_head_that_exists():
    scores = torch.zeros(1, CAUSAL.n_heads, LENGTH, LENGTH, dtype=torch.float64)
    scores[0, 1, 2, 1] = 4.0
    uniform = torch.full((2, 6), 1 / 6, dtype=torch.float64)
    torch.testing.assert_close(selective()(scores, causal(), 0)[0, :, 5], uniform)
    assert (selective("head=1")(scores, causal(), 0)[0, :, 5, 1] < 1 / 6).all()
    with pytest.raises(ConfigError, match=r"norm.head=2 names no head of 2: set it between"):
        selective("head=2")
    with pytest.raises(ConfigError, match=r"'selective' option head=0.5 must be an integer"):
        selective("head=0.5")


def selective_layer(compute: Compute | None = None) -> tuple[Attention, AttentionParts]:
    torch.manual_seed(0)
    parts = AttentionParts.from_config(
        variant("pe", "rope"), variant("norm", "selective"), variant("synthesizer", "dot"), CAUSAL
    )
    compute = compute or Compute()
    layer = Attention(CAUSAL, 1, True, True, init_std=0.5, compute=compute)
    return layer.double(), parts


@COMPUTES
def test_every_path_computes_the_same_and_queries_are_never_split(compute):
    check_every_path(selective_layer, compute)


@BLOCKS
@pytest.mark.parametrize("pe", ["none", "alibi", "fox"])
def test_decoding_one_token_at_a_time_is_the_full_pass(block, pe):
    check_decoding(pe, block, "selective")


def test_a_prompt_then_steps_and_a_reordered_beam_decode_as_the_full_pass():
    torch.manual_seed(0)
    model = DecoderLM(tiny(init_std=0.5), attention("none", "selective", "dot"), 11)
    model = model.double().eval()
    x = tokens()
    torch.testing.assert_close(decoded_one_at_a_time(model, x, prefix=4), model(x))
    order = torch.tensor([2, 0, 1])
    cache = StackCache.empty(model.stack.n_layers)
    model(x[:, :5], cache)
    cache.reorder(order)
    torch.testing.assert_close(model(x[order, 5:], cache), model(x[order])[:, 5:])


@pytest.mark.parametrize(
    "shape", [SHAPE, replace(CAUSAL, cross=True)], ids=["bidirectional", "cross-attention"]
)
def test_outside_causal_self_attention_it_is_one_sentence(shape):
    with pytest.raises(ConfigError, match="works in causal self-attention only"):
        build(variant("norm", "selective"), shape=shape)
