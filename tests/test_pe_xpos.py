"""xPos against its definition (design notes §1): q̃_i·k̃_j = Σ_k ζ_k^{(i−j)/B} · [RoPE's term
of pair k], ζ_k = (2k/d + 0.4)/1.4, B = scale_base; the query scaled by ζ^{+n/B}, the key by
ζ^{−m/B} (`rotate_key`), causal stacks only, positions bounded where the scales stay in range."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import SHAPE, make_parts, small_variant
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.layer import Attention, KVCache
from attnlab.config.build import build
from attnlab.config.options import options, variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import (
    DecoderLM,
    EncoderDecoder,
    Tagger,
    attention_mask,
    check_length,
)
from attnlab.pe.xpos import XPos, decay, zeta
from attnlab.tensors import split_heads

CAUSAL = replace(SHAPE, causal=True)
D = SHAPE.head_dim
LAYOUTS = ["interleaved", "half"]


@functools.cache
def xpos(*overrides: str, shape=CAUSAL) -> XPos:
    """Built once per options (it has no parameters and no state): composing is slow."""
    return build(variant("pe", "xpos", *overrides), shape=shape)


def vectors(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def pair_indices(dim: int, layout: str) -> list[tuple[int, int]]:
    if layout == "interleaved":
        return [(2 * k, 2 * k + 1) for k in range(dim // 2)]
    return [(k, k + dim // 2) for k in range(dim // 2)]


def closed_form(
    q: list[float], k: list[float], i: int, j: int, layout: str, scale_base: float = 512.0
) -> float:
    """Σ_k ζ_k^{(i−j)/B} · (q_pair R_{(j−i)θ_k} k_pair), in Python floats (float64)."""
    d, total = len(q), 0.0
    for p, (a, b) in enumerate(pair_indices(d, layout)):
        angle = (j - i) * 10000.0 ** (-2 * p / d)
        c, s = math.cos(angle), math.sin(angle)
        rope_term = c * (q[a] * k[a] + q[b] * k[b]) + s * (q[b] * k[a] - q[a] * k[b])
        total += ((2 * p / d + 0.4) / 1.4) ** ((i - j) / scale_base) * rope_term
    return total


def closed_form_scores(
    q: torch.Tensor, k: torch.Tensor, q_pos: list[int], k_pos: list[int], layout: str
) -> torch.Tensor:
    """[..., Lq, Lk] entry by entry, for q [..., Lq, d] and k [..., Lk, d]."""
    lead = q.shape[:-2]
    qs, ks = q.reshape(-1, *q.shape[-2:]).tolist(), k.reshape(-1, *k.shape[-2:]).tolist()
    rows = [
        [[closed_form(qb[r], kb[c], i, j, layout) for c, j in enumerate(k_pos)]
         for r, i in enumerate(q_pos)]
        for qb, kb in zip(qs, ks, strict=True)
    ]  # fmt: skip
    return torch.tensor(rows, dtype=torch.float64).reshape(*lead, len(q_pos), len(k_pos))


def scores(pe: XPos, q: torch.Tensor, k: torch.Tensor, q_pos, k_pos) -> torch.Tensor:
    q_pos, k_pos = torch.as_tensor(q_pos), torch.as_tensor(k_pos)
    return pe.rotate(q, q_pos) @ pe.rotate_key(k, k_pos).transpose(-2, -1)


@settings(max_examples=40, deadline=None)
@given(
    q_pos=st.lists(st.integers(0, 18_130), min_size=1, max_size=4),
    k_pos=st.lists(st.integers(0, 18_130), min_size=1, max_size=4),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_scores_are_the_closed_form_for_any_positions(q_pos, k_pos, layout, seed):
    pe = xpos(f"layout={layout}")
    q, k = vectors(len(q_pos), D, seed=seed), vectors(len(k_pos), D, seed=seed + 1)
    expected = closed_form_scores(q, k, q_pos, k_pos, layout)
    torch.testing.assert_close(scores(pe, q, k, q_pos, k_pos), expected, rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    i=st.integers(0, 9000),
    j=st.integers(0, 9000),
    shift=st.integers(0, 9000),
    layout=st.sampled_from(LAYOUTS),
)
def test_scores_depend_on_i_minus_j_only_so_the_centre_cancels(i, j, shift, layout):
    pe = xpos(f"layout={layout}")
    q, k = vectors(2, 1, D)
    torch.testing.assert_close(
        scores(pe, q, k, [i + shift], [j + shift]), scores(pe, q, k, [i], [j]), rtol=1e-9, atol=0
    )


def test_the_centre_cancels_for_any_centre():
    """Scaling by ζ^{(n−c)/B} and ζ^{−(m−c)/B} instead of c = 0 gives the same scores."""
    pe = xpos()
    q, k = vectors(2, SHAPE.n_heads, 12, D)
    pos = torch.arange(100, 112)
    for c in (-5000, 7, 106, 20_000):
        back = decay(torch.tensor([c]), D, 512.0).repeat_interleave(2, -1)  # ζ^{c/B} per dim
        shifted = (pe.rotate(q, pos) / back) @ (pe.rotate_key(k, pos) * back).transpose(-2, -1)
        torch.testing.assert_close(shifted, scores(pe, q, k, pos, pos), rtol=1e-12, atol=0)


def test_zeta_runs_from_two_sevenths_to_just_below_one():
    assert zeta(8).tolist() == pytest.approx([0.4 / 1.4, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4])
    assert zeta(8)[0].item() == pytest.approx(0.2857142857142857, rel=1e-15)
    assert zeta(64)[-1].item() == pytest.approx(0.97767857, rel=1e-7)  # (62/64 + 0.4)/1.4
    assert zeta(64)[0].item() == zeta(8)[0].item()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_pair_of_q_is_scaled_by_zeta_to_the_n_over_b_and_of_k_by_its_inverse(layout):
    pe = xpos(f"layout={layout}", "scale_base=100")
    x = vectors(3, 4, D)
    positions = [0, 1, 250, 1000]
    q_rot, k_rot = pe.rotate(x, torch.tensor(positions)), pe.rotate_key(x, torch.tensor(positions))
    for row, n in enumerate(positions):
        for p, (a, b) in enumerate(pair_indices(D, layout)):
            norm = x[:, row, [a, b]].norm(dim=-1)
            factor = ((2 * p / D + 0.4) / 1.4) ** (n / 100)
            torch.testing.assert_close(q_rot[:, row, [a, b]].norm(dim=-1), norm * factor)
            torch.testing.assert_close(k_rot[:, row, [a, b]].norm(dim=-1), norm / factor)
    assert torch.equal(q_rot[:, 0], x[:, 0]) and torch.equal(k_rot[:, 0], x[:, 0])


@pytest.mark.parametrize("cached", [False, True], ids=["full", "cached"])
def test_a_causal_layer_attends_with_the_closed_form_scores_also_when_decoding(cached):
    torch.manual_seed(0)
    parts = make_parts("xpos", shape=CAUSAL).double()
    attn = Attention(CAUSAL, 0, True, True, init_std=0.5, out_std=0.5).double()
    length = 8
    x = vectors(2, length, SHAPE.d_model)
    pos = torch.arange(length)
    q, k, v = (split_heads(t, SHAPE.n_heads) for t in attn.qkv_proj(x).split(SHAPE.d_model, -1))
    expected_scores = closed_form_scores(q, k, pos.tolist(), pos.tolist(), "interleaved") / D**0.5
    mask = attention_mask(pos, pos, None, causal=True)
    weights = torch.softmax(expected_scores.masked_fill(~mask, -math.inf), -1)
    expected = attn.out_proj((weights @ v).transpose(1, 2).flatten(-2))
    if not cached:
        torch.testing.assert_close(attn(x, parts, pos, pos, mask), expected)
        return
    cache, steps = KVCache(), []
    for t in range(length):
        steps.append(attn(x[:, t : t + 1], parts, pos[t : t + 1], pos[: t + 1], None, cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), expected)


def tiny(block: str = "standard", pe: dict | None = None) -> tuple[ModelConfig, AttentionConfig]:
    heads = {"block": Standard(), "n_heads": 2} if block == "standard" else {
        "block": build(variant("block", "gau", "qk_dim=8")), "n_heads": 1}  # fmt: skip
    cfg = ModelConfig(d_model=16, n_layers=2, d_ff=32, dropout=0.0, init_std=0.2, **heads)
    pe = small_variant("pe", "xpos") if pe is None else pe
    return cfg, AttentionConfig(pe, variant("norm", "softmax"), variant("synthesizer", "dot"))


@pytest.mark.parametrize("block", ["standard", "gau"])
def test_a_language_model_ignores_future_tokens_and_decodes_the_same_with_the_cache(block):
    torch.manual_seed(0)
    model = DecoderLM(*tiny(block), vocab_size=11).double().eval()
    tokens = torch.randint(1, 11, (2, 9), generator=torch.Generator().manual_seed(0))
    full = model(tokens)
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    torch.testing.assert_close(model(changed)[:, :5], full[:, :5])
    cache = model.new_cache()
    steps = [model(tokens[:, :4], cache)] + [
        model(tokens[:, t : t + 1], cache) for t in range(4, 9)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_rotate_key_differs_from_rotate_for_xpos_only():
    """(and pope, whose keys also take their phase bias δ: tests/test_pe_pope.py)"""
    x, pos = vectors(2, SHAPE.n_heads, 6, D), torch.arange(3, 9)
    pe = xpos()
    assert not torch.allclose(pe.rotate_key(x, pos), pe.rotate(x, pos))
    others = [name for name in options("pe") if name not in ("xpos", "pope")]
    assert others, "no other PE to compare with"
    for name in others:
        torch.manual_seed(0)
        other = build(small_variant("pe", name), shape=CAUSAL).double()
        with torch.no_grad():
            for parameter in other.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.1)
        assert torch.equal(other.rotate_key(x, pos), other.rotate(x, pos)), name


def test_urpe_of_xpos_scales_its_keys_as_xpos_does():
    urpe = build({**variant("pe", "urpe"), "base": variant("pe", "xpos")}, shape=CAUSAL)
    x, pos = vectors(2, SHAPE.n_heads, 6, D), torch.arange(3, 9)
    assert torch.equal(urpe.rotate_key(x, pos), xpos().rotate_key(x, pos))
    assert torch.equal(urpe.rotate(x, pos), xpos().rotate(x, pos))


def test_bidirectional_stacks_and_cross_attention_are_refused():
    bidirectional = r"XPos works in causal self-attention only \(its factor .* grows .*\), not in a bidirectional stack"
    with pytest.raises(ConfigError, match=bidirectional):
        xpos(shape=replace(SHAPE, causal=False))
    with pytest.raises(ConfigError, match=r"not in cross-attention: .*without model.cross_pe"):
        xpos(shape=replace(SHAPE, causal=True, cross=True))
    cfg, spec = tiny()
    with pytest.raises(ConfigError, match=bidirectional):
        Tagger(cfg, spec, 11, 5, causal=False)
    with pytest.raises(ConfigError, match=bidirectional):
        EncoderDecoder(cfg, spec, 11, 11)  # its encoder is bidirectional


def test_positions_are_bounded_where_the_scales_stay_within_two_to_the_64():
    assert xpos().max_len == 18_131  # ⌊64·512·ln 2/ln 3.5⌋ + 1
    assert xpos("scale_base=1024").max_len == 36_261
    last = torch.tensor([xpos().max_len - 1])
    scales = decay(last, D, 512.0)
    assert scales.min().item() >= 2.0**-64 and (1 / scales).max().item() <= 2.0**64
    assert (1 / decay(last + 1, D, 512.0)).max().item() > 2.0**64
    parts = make_parts("xpos", shape=CAUSAL)
    check_length(parts, 18_131, "the task")
    with pytest.raises(ConfigError, match=r"18132 positions .* at most 18131 \(pe.scale_base\)"):
        check_length(parts, 18_132, "the task")


def test_a_float32_model_at_its_length_bound_trains_with_finite_values():
    torch.manual_seed(0)
    tagger = Tagger(*tiny(pe=variant("pe", "xpos", "scale_base=1")), 11, 5, causal=True)
    bound = tagger.stack.parts.max_len
    assert bound == 36  # ⌊64·ln 2/ln 3.5⌋ + 1: the scales reach 3.5^±35
    tokens = torch.randint(1, 11, (2, bound), generator=torch.Generator().manual_seed(1))
    loss = F.cross_entropy(tagger(tokens, None).flatten(0, 1), (tokens % 5).flatten())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in tagger.parameters())
    with pytest.raises(ConfigError, match=r"pe.scale_base"):
        tagger(torch.ones(1, bound + 1, dtype=torch.long), None)


def test_scales_are_computed_in_float64_and_cast_to_bf16():
    pe = xpos()
    x = vectors(2, SHAPE.n_heads, 4, D)
    pos = torch.tensor([10_001, 10_003, 15_007, 18_000])  # not representable in bf16
    for hook in (pe.rotate, pe.rotate_key):
        exact = hook(x, pos)
        rounded = hook(x.to(torch.bfloat16), pos)
        assert rounded.dtype == torch.bfloat16
        error = ((rounded.double() - exact).norm(dim=-1) / exact.norm(dim=-1)).max().item()
        assert error < 2**-6  # a few bf16 roundings; scales from bf16 positions are off by %s


@pytest.mark.parametrize(
    "overrides,shape,message",
    [
        (["scale_base=0"], CAUSAL, r"pe.scale_base=0 must be positive"),
        (["scale_base=-512"], CAUSAL, r"pe.scale_base=-512 must be positive"),
        (
            ["layout=rotate_half"],
            CAUSAL,
            r"pe.layout='rotate_half' is not one of: interleaved, half",
        ),
        ([], replace(CAUSAL, head_dim=7), r"the head width 7 must be even"),
    ],
)
def test_bad_options_are_refused(overrides, shape, message):
    with pytest.raises(ConfigError, match=message):
        xpos(*overrides, shape=shape)


def test_the_yaml_defaults_are_torchscales():
    pe = xpos()
    assert (pe.scale_base, pe.layout) == (512.0, "interleaved")
    assert pe.rotates and not (pe.adds_score_terms or pe.post_normalization or pe.embeds)
    assert list(pe.parameters()) == []


@pytest.mark.parametrize("length", [9, 300])
def test_it_matches_x_transformers_rotary_xpos_with_the_rotary_dim_the_head_dim(length):
    """x-transformers centres the scales at c = max position // 2: scores are the same, and
    its q̃ is ours times ζ^{−c/B} (its k̃ ours times ζ^{+c/B})."""
    xt = pytest.importorskip(
        "x_transformers.x_transformers", reason="x-transformers (the dev extra) is not installed"
    )
    rotary = xt.RotaryEmbedding(D, use_xpos=True, scale_base=512)
    pos = torch.arange(length)
    freqs, scale = rotary(pos)
    q, k = vectors(2, 1, SHAPE.n_heads, length, D)
    theirs_q = xt.apply_rotary_pos_emb(q.float(), freqs, scale).double()
    theirs_k = xt.apply_rotary_pos_emb(k.float(), freqs, scale**-1).double()
    pe = xpos()
    ours_q, ours_k = pe.rotate(q, pos), pe.rotate_key(k, pos)
    centre = decay(torch.tensor([length // 2]), D, 512.0).repeat_interleave(2, -1)
    tolerance = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(theirs_q, ours_q / centre, **tolerance)
    torch.testing.assert_close(theirs_k, ours_k * centre, **tolerance)
    torch.testing.assert_close(
        theirs_q @ theirs_k.transpose(-2, -1), ours_q @ ours_k.transpose(-2, -1), **tolerance
    )
