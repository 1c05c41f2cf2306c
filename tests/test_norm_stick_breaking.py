"""norm=stick_breaking (Tan et al. 2025) beyond the generic formula tests of test_norm.py:
its recency (equal scores give geometric weights), the attend_current variant, cached
decoding one token at a time equal to the full pass in a decoder, and the refusal
outside causal self-attention."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE
from test_combinations import attention, check_decoder_lm_cache, tiny

from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import DecoderLM

CAUSAL = replace(SHAPE, causal=True)


def stick_breaking(*overrides: str):
    return build(variant("norm", "stick_breaking", *overrides), shape=CAUSAL)


def test_equal_scores_give_geometric_weights_toward_the_past():
    length, score = 6, 0.3
    scores = torch.full((1, 1, length, length), score, dtype=torch.float64)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    weights = stick_breaking()(scores, causal, 0)[0, 0]
    beta = torch.sigmoid(torch.tensor(score, dtype=torch.float64))
    for i in range(length):
        for j in range(length):
            expected = beta * (1 - beta) ** (i - 1 - j) if j < i else 0.0
            assert float(weights[i, j]) == pytest.approx(float(expected), rel=1e-12, abs=1e-15)
    assert weights[0].eq(0).all(), "the first position has no key before it"


def test_attend_current_lets_the_querys_own_key_break_the_stick_first():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    weights = stick_breaking("attend_current=true")(scores, causal, 0)
    beta = torch.sigmoid(scores)
    for i in range(5):
        for j in range(i + 1):
            rest = torch.prod(1 - beta[..., i, j + 1 : i + 1], -1)
            torch.testing.assert_close(weights[..., i, j], beta[..., i, j] * rest)


@pytest.mark.parametrize("pe", ["none", "rope", "alibi"])
def test_decoding_one_token_at_a_time_is_the_full_pass(pe):
    torch.manual_seed(0)
    check_decoder_lm_cache(
        DecoderLM(tiny(init_std=0.3), attention(pe, "stick_breaking", "dot"), 11)
    )


@pytest.mark.parametrize(
    "shape", [SHAPE, replace(CAUSAL, cross=True)], ids=["bidirectional", "cross-attention"]
)
def test_outside_causal_self_attention_it_is_one_sentence(shape):
    with pytest.raises(ConfigError, match="works in causal self-attention only"):
        build(variant("norm", "stick_breaking"), shape=shape)
