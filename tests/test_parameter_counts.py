"""`parameter_counts`: trainable parameters in total and inside the PE, synthesizer and
normalizer of every stack, each shared parameter once, against counts worked out by hand for
the `model=tiny` sizes (d = 32, 2 heads, 2 layers, d_ff = 64, GAU s = 16, e = 64)."""

from __future__ import annotations

import pytest
import torch
from helpers import OPTIM

from attnlab.config.options import causal_only, options, variant
from attnlab.model.architecture import Architecture, AttentionConfig, ModelConfig
from attnlab.model.transformer import EncoderDecoder, Tagger
from attnlab.systems.base import parameter_counts
from attnlab.tasks.probe.system import TaggerSystem

VOCAB, CLASSES = 11, 5
D, HEADS, LAYERS, FF, GAU_S, GAU_E = 32, 2, 2, 64, 16, 64
LAYER_NORM = 2 * D


def linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return (n_in + bias) * n_out


def standard_block(reads_qk: bool = True, cross: bool = False) -> int:
    """Fused q/k/v projection (q and k only when something reads them), output projection,
    FFN and two LayerNorms; a decoder block adds cross-attention (q, k, v, out and a LN)."""
    qkv = linear(D, (2 * D if reads_qk else 0) + D)
    own = qkv + linear(D, D) + linear(D, FF) + linear(FF, D) + 2 * LAYER_NORM
    return own + (4 * linear(D, D) + LAYER_NORM if cross else 0)


def gau_block() -> int:
    """U and V, the shared Z, γ and β for q and k, the output projection and one LayerNorm."""
    return linear(D, 2 * GAU_E) + linear(D, GAU_S) + 4 * GAU_S + linear(GAU_E, D) + LAYER_NORM


def tagger_total(block: int, extra: int = 0) -> int:
    """Token embedding, LAYERS blocks, the final LayerNorm, the classifier head, plus extra."""
    return VOCAB * D + LAYERS * block + LAYER_NORM + linear(D, CLASSES) + extra


def config(block: str = "standard", **changes) -> ModelConfig:
    block_node = variant("block", block, *([f"qk_dim={GAU_S}"] if block == "gau" else []))
    return ModelConfig.from_config({**variant("model", "tiny"), **changes}, block_node)


def attention(pe: str = "none", synthesizer: str = "dot", *overrides: str, norm="softmax"):
    """overrides: "pe.<option>=..." or "synthesizer.<option>=..."."""
    nodes = {"pe": (pe, []), "synthesizer": (synthesizer, [])}
    for override in overrides:
        group, option = override.split(".", 1)
        nodes[group][1].append(option)
    return AttentionConfig(
        variant("pe", pe, *nodes["pe"][1]),
        variant("norm", norm),
        variant("synthesizer", synthesizer, *nodes["synthesizer"][1]),
    )


def tagger(attention_config: AttentionConfig, causal: bool = False, **changes) -> Tagger:
    torch.manual_seed(0)
    return Tagger(config(**changes), attention_config, VOCAB, CLASSES, causal=causal)


def encoder_decoder(attention_config: AttentionConfig, **changes) -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(config(**changes), attention_config, VOCAB, VOCAB)


def test_the_tiny_sizes_are_the_ones_counted_here():
    cfg = config()
    gau = config(block="gau").block
    sizes = (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, gau.qk_dim)
    assert (*sizes, gau.expansion * cfg.d_model) == (D, HEADS, LAYERS, FF, GAU_S, GAU_E)
    assert (cfg.qkv_bias, cfg.norm_first, cfg.tie_embeddings) == (True, True, True)


def test_a_plain_tagger_has_no_part_parameters():
    assert tagger_total(standard_block()) == 17_669
    counts = parameter_counts(tagger(attention()))
    assert counts == {"total": 17_669, "pe": 0, "synthesizer": 0, "norm": 0}


def test_without_biases_a_tagger_keeps_only_its_heads_bias():
    """qkv_bias=false and bias=false (nanoGPT's bias=False): every projection, FFN layer and
    LayerNorm of the stack is bias-free; the classifier head keeps its own."""
    model = tagger(attention(), qkv_bias=False, bias=False)
    qkv, ffn, norm = linear(D, 3 * D, False), linear(D, FF, False) + linear(FF, D, False), D
    block = qkv + linear(D, D, False) + ffn + 2 * norm
    assert parameter_counts(model)["total"] == VOCAB * D + LAYERS * block + norm + linear(
        D, CLASSES
    )
    biases = [name for name, _ in model.named_parameters() if name.endswith("bias")]
    assert biases == ["head.bias"]


@pytest.mark.parametrize(
    "spec,pe",
    [
        (attention("learned"), 512 * D),
        (attention("learned", "dot", "pe.max_len=40"), 40 * D),
        (attention("t5"), 32 * HEADS),
        (attention("t5", "dot", "pe.num_buckets=8"), 8 * HEADS),
        (attention("shaw"), LAYERS * 2 * 41 * (D // HEADS)),
        (attention("sinusoidal"), 0),
        (attention("rope"), 0),
        (attention("alibi"), 0),
    ],
    ids=["learned", "learned-40", "t5", "t5-8", "shaw", "sinusoidal", "rope", "alibi"],
)
def test_a_tagger_counts_its_one_pe(spec, pe):
    counts = parameter_counts(tagger(spec))
    assert counts == {
        "total": tagger_total(standard_block(), pe),
        "pe": pe,
        "synthesizer": 0,
        "norm": 0,
    }


def test_a_gau_tagger_has_one_t5_table_with_one_head():
    counts = parameter_counts(tagger(attention("t5"), block="gau", n_heads=1))
    assert counts["pe"] == 32
    assert counts["total"] == tagger_total(gau_block(), 32) == 14_533


@pytest.mark.parametrize(
    "synthesizer,overrides,synth,reads_qk",
    [
        ("random", ["max_len=16"], LAYERS * HEADS * 16 * 16, False),
        ("random", ["max_len=16", "trainable=false"], 0, False),
        ("factorized_random", ["max_len=16", "k=3"], 2 * LAYERS * HEADS * 16 * 3, False),
        # Random R, Dense W₁ [d, d_h], b₁, W₂ [d_h, ℓ], b₂ per layer and head, one w per layer
        # and component: each component once although the mixture holds it too.
        (
            "mixture",
            ["components.0.max_len=16", "components.1.max_len=16"],
            LAYERS * HEADS * (16 * 16 + D * 16 + 16 + 16 * 16 + 16) + LAYERS * 2,
            False,
        ),
        (
            "random_vanilla",
            ["components.0.max_len=16"],
            LAYERS * HEADS * 16 * 16 + LAYERS * 2,
            True,
        ),
    ],
    ids=["random", "fixed-random", "factorized-random", "mixture", "random-vanilla"],
)
def test_a_tagger_counts_its_synthesizer(synthesizer, overrides, synth, reads_qk):
    spec = attention("none", synthesizer, *(f"synthesizer.{o}" for o in overrides))
    counts = parameter_counts(tagger(spec))
    expected = {
        "total": tagger_total(standard_block(reads_qk), synth),
        "pe": 0,
        "synthesizer": synth,
        "norm": 0,
    }
    assert counts == expected


def test_fixed_random_is_excluded_from_the_total_although_it_is_in_the_state_dict():
    spec = attention("none", "random", "synthesizer.max_len=16", "synthesizer.trainable=false")
    model = tagger(spec)
    assert sum(t.numel() for t in model.state_dict().values()) > parameter_counts(model)["total"]
    assert (
        parameter_counts(model)["total"] == tagger_total(standard_block(reads_qk=False)) == 13_445
    )


# per layer: one learned number per head (the sink logit b, SSMax's scale s), or
# differential attention's four λ vectors of the q/k head width and its RMSNorm's gain over
# a pair of heads' outputs
LEARNED_PER_LAYER = {"sink": HEADS, "ssmax": HEADS, "differential": 4 * D // HEADS + 2 * D // HEADS}


@pytest.mark.parametrize("norm", options("norm"))
def test_normalizers_learn_their_papers_parameters_per_layer_or_none(norm):
    counts = parameter_counts(tagger(attention(norm=norm), bool(causal_only(norm, "norm"))))
    own = LAYERS * LEARNED_PER_LAYER.get(norm, 0)
    assert counts == {
        "total": tagger_total(standard_block(), own), "pe": 0, "synthesizer": 0, "norm": own,
    }  # fmt: skip


def test_an_output_gate_adds_one_projection_without_bias_per_layer():
    for gate, width in (("headwise", HEADS), ("elementwise", D)):
        counts = parameter_counts(tagger(attention(), output_gate=gate))
        assert counts["total"] == tagger_total(standard_block(), LAYERS * D * width)


def encoder_decoder_total(block: int = standard_block(), extra: int = 0) -> int:
    """One tied embedding (no output layer), LAYERS encoder and decoder blocks, a final
    LayerNorm per stack."""
    decoder_block = block + standard_block(cross=True) - standard_block()
    return VOCAB * D + LAYERS * (block + decoder_block) + 2 * LAYER_NORM + extra


@pytest.mark.parametrize(
    "spec,changes,pe",
    [
        (attention(), {}, 0),
        (attention("learned"), {}, 2 * 512 * D),
        (attention("t5"), {}, 2 * 32 * HEADS),
        (attention("t5"), {"cross_pe": True}, 3 * 32 * HEADS),
        (attention("xl"), {}, 2 * 2 * HEADS * (D // HEADS) + 2 * LAYERS * linear(D, D, False)),
    ],
    ids=["none", "learned", "t5", "t5-cross", "xl"],
)
def test_an_encoder_decoder_counts_one_pe_per_stack_and_cross_attention(spec, changes, pe):
    counts = parameter_counts(encoder_decoder(spec, **changes))
    assert counts == {
        "total": encoder_decoder_total(extra=pe),
        "pe": pe,
        "synthesizer": 0,
        "norm": 0,
    }
    assert encoder_decoder_total() == 43_232


def test_random_synthesizers_of_the_encoder_and_decoder_are_counted_separately():
    spec = attention("none", "random", "synthesizer.max_len=16")
    synth = 2 * LAYERS * HEADS * 16 * 16
    counts = parameter_counts(encoder_decoder(spec))
    assert counts["synthesizer"] == synth
    assert counts["total"] == encoder_decoder_total(standard_block(reads_qk=False), synth)


def test_shared_parameters_are_counted_once():
    tied = parameter_counts(encoder_decoder(attention("learned")))
    untied = parameter_counts(encoder_decoder(attention("learned"), tie_embeddings=False))
    assert untied["total"] - tied["total"] == VOCAB * D + linear(D, VOCAB, bias=False)
    model = tagger(attention("t5"))
    twice = torch.nn.ModuleList([model, model.stack, model.stack.parts])
    assert parameter_counts(twice) == parameter_counts(model)


def test_a_system_counts_its_network_and_nothing_else():
    system = TaggerSystem(
        architecture=Architecture.from_config(
            {
                "model": variant("model", "tiny"),
                "block": variant("block", "standard"),
                "pe": variant("pe", "learned"),
                "norm": variant("norm", "softmax"),
                "synthesizer": variant("synthesizer", "dot"),
            }
        ),
        optim=OPTIM,
        vocab_size=VOCAB,
        num_classes=CLASSES,
        causal=False,
    )
    assert system.parameter_counts() == parameter_counts(system.net)
    assert system.parameter_counts()["total"] == tagger_total(standard_block(), 512 * D)
