"""Every pe × norm × synthesizer combination, in every model form.

Each combination trains one step as an encoder, a causal decoder and an encoder-decoder;
in the decoder, changing future tokens never changes earlier outputs, and cached
step-by-step decoding equals the full forward pass. `make test` trains and checks
causality on a pairwise cover of the combinations (every two choices meet at least once)
and checks the cache on each choice once; `make test-all` runs all of them.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    decoded_one_at_a_time,
    every_combination,
    pairwise_cover,
    refused_unless,
    small_variant,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config.build import build
from attnlab.config.options import causal_only, options, variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import DecoderLM, EncoderDecoder, Tagger

COMBINATIONS = every_combination(options("pe"), options("norm"), options("synthesizer"))
# decoding twice (with and without the cache) costs more: `make test` meets every value once
EACH_VALUE = every_combination(options("pe"), options("norm"), options("synthesizer"), strength=1)
VOCAB, LENGTH = 11, 9
EMBEDDING_ONLY = ("none", "learned", "sinusoidal")  # no hook inside attention

BLOCKS = {"standard": Standard(), "gau": build(variant("block", "gau", "qk_dim=8"))}


def attention(pe: str, norm: str, synthesizer: str) -> AttentionConfig:
    return AttentionConfig(
        small_variant("pe", pe),
        small_variant("norm", norm),
        small_variant("synthesizer", synthesizer),
    )


def tiny(**changes) -> ModelConfig:
    sizes = {"block": Standard(), "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32}
    return ModelConfig(**{**sizes, "dropout": 0.0, **changes})


def tokens(batch: int = 3, length: int = LENGTH, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g)


def train_step(model: torch.nn.Module, loss: torch.Tensor) -> None:
    assert torch.isfinite(loss)
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} gets no gradient (DDP would fail on it)"
        assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
    torch.optim.SGD(model.parameters(), lr=0.1).step()


@pytest.mark.parametrize(
    "pe,norm,synthesizer,block",
    every_combination(options("pe"), options("norm"), options("synthesizer"), list(BLOCKS)),
)
def test_one_training_step_in_every_form(pe, norm, synthesizer, block):
    torch.manual_seed(0)
    spec = attention(pe, norm, synthesizer)
    cfg = tiny(block=BLOCKS[block], n_heads=1 if block == "gau" else 2)
    src, tgt = tokens(), tokens(seed=1)
    padding = torch.zeros_like(src, dtype=torch.bool)
    padding[1, -3:] = True
    for causal in (False, True):
        with refused_unless(causal, pe, norm, cfg.n_heads, synthesizer):
            tagger = Tagger(cfg, spec, VOCAB, 5, causal)
            logits = tagger(src, padding)
            train_step(tagger, F.cross_entropy(logits.flatten(0, 1), (src % 5).flatten()))
    with refused_unless(False, pe, norm, cfg.n_heads, synthesizer):  # the encoder is bidirectional
        model = EncoderDecoder(cfg, spec, VOCAB, VOCAB)
        logits = model(src, padding, tgt[:, :-1])
        train_step(model, F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten()))


def check_causal_with_an_exact_cache(model: EncoderDecoder) -> None:
    """Changing future target tokens changes no earlier output, and decoding one token at a
    time with the cache gives the full forward pass."""
    model = model.double().eval()
    src, tgt = tokens(), tokens(seed=1)
    padding = torch.zeros_like(src, dtype=torch.bool)
    padding[0, -2:] = True
    memory = model.encode(src, padding)
    full = model.decode(tgt, memory, padding)

    changed = tgt.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % VOCAB
    torch.testing.assert_close(model.decode(changed, memory, padding)[:, :5], full[:, :5])

    cache = model.new_cache()
    steps = [model.decode(tgt[:, t : t + 1], memory, padding, cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full)


def check_decoder_lm_cache(model: DecoderLM) -> None:
    """A decoder-only model decoding one token at a time with its cache gives the full pass."""
    model = model.double().eval()
    x = tokens()
    torch.testing.assert_close(decoded_one_at_a_time(model, x), model(x))


@pytest.mark.parametrize("pe,norm,synthesizer", EACH_VALUE)
def test_decoding_is_causal_and_the_cache_changes_nothing(pe, norm, synthesizer):
    torch.manual_seed(0)
    spec = attention(pe, norm, synthesizer)
    with refused_unless(False, pe, norm, synthesizer=synthesizer):
        check_causal_with_an_exact_cache(EncoderDecoder(tiny(init_std=0.2), spec, VOCAB, VOCAB))


@pytest.mark.parametrize(
    "pe,norm,layout",
    every_combination(
        options("pe"), options("norm"), ["gau", "post-LN without qkv bias"], strength=1
    ),
)
def test_gau_and_post_ln_decoders_are_causal_with_an_exact_cache(pe, norm, layout):
    torch.manual_seed(0)
    changes = (
        {"block": BLOCKS["gau"], "n_heads": 1}
        if layout == "gau"
        else {"norm_first": False, "qkv_bias": False}
    )
    cfg = tiny(init_std=0.2, **changes)
    with refused_unless(False, pe, norm, cfg.n_heads):
        check_causal_with_an_exact_cache(
            EncoderDecoder(cfg, attention(pe, norm, "dot"), VOCAB, VOCAB)
        )


@pytest.mark.parametrize(
    "synthesizer,pe,norm",
    every_combination(
        [s for s in options("synthesizer") if s != "dot"],
        options("pe"),
        ["relu2", "softmax"],
        strength=1,
    ),
)
def test_gau_decoders_with_synthesized_scores_are_causal_with_an_exact_cache(synthesizer, pe, norm):
    torch.manual_seed(0)
    cfg = tiny(init_std=0.2, block=BLOCKS["gau"], n_heads=1)
    with refused_unless(False, pe, norm, synthesizer=synthesizer):
        model = EncoderDecoder(cfg, attention(pe, norm, synthesizer), VOCAB, VOCAB)
        check_causal_with_an_exact_cache(model)


@pytest.mark.parametrize("pe,norm,synthesizer", COMBINATIONS)
def test_a_causal_stack_ignores_future_tokens(pe, norm, synthesizer):
    torch.manual_seed(0)
    with refused_unless(True, pe, norm, synthesizer=synthesizer):
        spec = attention(pe, norm, synthesizer)
        tagger = Tagger(tiny(init_std=0.2), spec, VOCAB, 5, causal=True).double().eval()
        x = tokens()
        changed = x.clone()
        changed[:, 4:] = (changed[:, 4:] + 3) % VOCAB
        torch.testing.assert_close(tagger(changed, None)[:, :4], tagger(x, None)[:, :4])


@pytest.mark.parametrize("pe", options("pe"))
def test_a_pe_on_cross_attention_decodes_the_same_with_the_cache(pe):
    torch.manual_seed(0)
    cfg = tiny(init_std=0.2, cross_pe=True)
    spec = attention(pe, "softmax", "dot")
    refused = {
        "xl": "supports self-attention only",
        **{p: "works in causal self-attention only" for p in options("pe") if causal_only(p)},
        "randomized": "drew apart",
        **dict.fromkeys(EMBEDDING_ONLY, "does nothing"),
    }
    if pe in refused:
        with pytest.raises(ConfigError, match=refused[pe]):
            EncoderDecoder(cfg, spec, VOCAB, VOCAB)
        return
    model = EncoderDecoder(cfg, spec, VOCAB, VOCAB).double()
    src, tgt = tokens(), tokens(seed=1)
    padding = torch.zeros_like(src, dtype=torch.bool)
    memory = model.encode(src, padding)
    full = model.decode(tgt, memory, padding)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t : t + 1], memory, padding, cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full)
    full.square().sum().backward()
    cross_pe = model.decoder.cross_parts.pe
    assert all(p.grad is not None for p in cross_pe.parameters())


@settings(deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5))
def test_the_pairwise_cover_meets_every_two_values_of_any_two_groups(sizes):
    groups = [[f"{g}.{v}" for v in range(size)] for g, size in enumerate(sizes)]
    cover = pairwise_cover(groups)
    assert cover == pairwise_cover(groups), "the cover is deterministic"
    for a, b in itertools.combinations(range(len(groups)), 2):
        met = {(case[a], case[b]) for case in cover}
        assert met == set(itertools.product(groups[a], groups[b]))
    assert {value for case in cover for value in case} == {v for group in groups for v in group}
