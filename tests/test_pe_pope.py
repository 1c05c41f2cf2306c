"""PoPE (Gopalakrishnan et al. 2025) against its definition: a_ij = Σ_c softplus(q_ic)
softplus(k_jc) cos((j − i)·θ_c + δ_c), θ_c = base^(−c/d) for c < d, δ_c clamped to [−2π, 0],
by a naive float64 loop over i, j and c; scores of i − j only; 1/√d of the head's own width;
q and k twice as wide, v not; the fused, plain, chunked and cached paths agree, in a layer and
in whole models, with padding."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pe_xpos import scores  # q̃ k̃ᵀ from rotate and rotate_key

from attnlab.attention.core import Compute
from attnlab.attention.layer import Attention, KVCache
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import DecoderLM, EncoderDecoder, Tagger, attention_mask
from attnlab.pe.pope import PoPE
from attnlab.tensors import split_heads

D, H = SHAPE.head_dim, SHAPE.n_heads
CAUSAL = replace(SHAPE, causal=True)


def pope(*overrides: str, shape=SHAPE) -> PoPE:
    return build(variant("pe", "pope", *overrides), shape=shape).double()


def moved(pe: PoPE, seed: int = 0) -> PoPE:
    """`pe` with δ drawn across and beyond [−2π, 0], so that the clamp acts on some."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        pe.delta.copy_(torch.rand(H, D, generator=g, dtype=torch.float64) * 9 - 8)
    return pe


def vectors(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def definition(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: list[int],
    k_pos: list[int],
    delta: torch.Tensor | None,
    base: float = 10000.0,
) -> torch.Tensor:
    """[B, H, Lq, Lk] Σ_c softplus(q_ic) softplus(k_jc) cos((j − i)θ_c + δ_hc), one entry at a
    time in float64 (δ clamped to [−2π, 0]; None: δ = 0)."""
    b, h, _, d = q.shape
    out = torch.zeros(b, h, len(q_pos), len(k_pos), dtype=torch.float64)
    for n, head, (row, i), (col, j) in (
        (n, head, r, c)
        for n in range(b)
        for head in range(h)
        for r in enumerate(q_pos)
        for c in enumerate(k_pos)
    ):
        total = 0.0
        for c in range(d):
            theta = base ** (-c / d)
            bias = 0.0 if delta is None else min(max(delta[head, c].item(), -2 * math.pi), 0.0)
            mu_q = math.log1p(math.exp(q[n, head, row, c].item()))
            mu_k = math.log1p(math.exp(k[n, head, col, c].item()))
            total += mu_q * mu_k * math.cos((j - i) * theta + bias)
        out[n, head, row, col] = total
    return out


@settings(max_examples=15, deadline=None)
@given(
    q_pos=st.lists(st.integers(0, 50_000), min_size=1, max_size=4),
    k_pos=st.lists(st.integers(0, 50_000), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_scores_are_the_definition_at_any_positions(q_pos, k_pos, seed):
    pe = moved(pope(), seed)
    q, k = vectors(2, H, len(q_pos), D, seed=seed), vectors(2, H, len(k_pos), D, seed=seed + 1)
    expected = definition(q, k, q_pos, k_pos, pe.delta.detach())
    torch.testing.assert_close(scores(pe, q, k, q_pos, k_pos), expected)


@pytest.mark.parametrize("options", [("phase_bias=false",), ("base=500.0",)])
def test_without_a_phase_bias_and_with_another_base(options):
    pe = pope(*options)
    base = 500.0 if "base=500.0" in options else 10000.0
    q_pos, k_pos = [0, 2, 9, 31, 400], [1, 5, 9, 77]
    q, k = vectors(1, H, 5, D), vectors(1, H, 4, D, seed=1)
    delta = None if pe.delta is None else pe.delta.detach()
    torch.testing.assert_close(
        scores(pe, q, k, q_pos, k_pos), definition(q, k, q_pos, k_pos, delta, base)
    )


@settings(max_examples=25, deadline=None)
@given(i=st.integers(0, 5000), j=st.integers(0, 5000), shift=st.integers(0, 90_000))
def test_scores_depend_on_i_minus_j_only(i, j, shift):
    pe = moved(pope())
    q, k = vectors(1, H, 1, D), vectors(1, H, 1, D, seed=1)
    torch.testing.assert_close(
        scores(pe, q, k, [i + shift], [j + shift]), scores(pe, q, k, [i], [j])
    )


def test_scores_of_fixed_vectors_are_toeplitz_and_change_along_the_diagonals():
    pe = moved(pope())
    length = 9
    q, k = (v.expand(1, H, length, D) for v in vectors(2, D))
    s = scores(pe, q, k, list(range(length)), list(range(length)))[0, 0]
    for offset in range(-length + 1, length):
        diagonal = s.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    assert not torch.allclose(s.diagonal(0)[0], s.diagonal(1)[0])


def test_the_magnitudes_are_the_content_and_the_phases_the_position_alone():
    """Each complex component has modulus softplus(x_c) at every position and phase t·θ_c
    whatever the content: at position 0 the sine half is zero."""
    pe = pope()
    x = vectors(2, H, 4, D)
    pos = torch.tensor([0, 1, 60, 7000])
    out = pe.rotate(x, pos)
    assert out.shape == (2, H, 4, 2 * D)
    modulus = torch.complex(out[..., :D], out[..., D:]).abs()
    torch.testing.assert_close(modulus, F.softplus(x))
    assert torch.equal(out[..., 0, D:], torch.zeros_like(out[..., 0, D:]))
    phase = torch.atan2(out[..., 1, D:], out[..., 1, :D])
    theta = 10000.0 ** (-torch.arange(D, dtype=torch.float64) / D)
    torch.testing.assert_close(phase, theta.expand_as(phase))  # t = 1, every θ_c < π


def test_delta_is_one_parameter_per_head_and_frequency_clamped_and_learned():
    pe = pope()
    assert [p.shape for p in pe.parameters()] == [(H, D)]
    assert torch.equal(pe.delta, torch.zeros(H, D, dtype=torch.float64))  # bias_init: zero
    x, pos = vectors(1, H, 3, D), torch.tensor([2, 5, 11])
    assert torch.equal(pe.rotate_key(x, pos), pe.rotate(x, pos))  # δ = 0
    moved(pe)
    assert not torch.allclose(pe.rotate_key(x, pos), pe.rotate(x, pos))
    inside = (pe.delta > -2 * math.pi) & (pe.delta < 0)
    assert inside.any() and not inside.all()
    (pe.rotate_key(x, pos) * vectors(1, H, 3, 2 * D, seed=2)).sum().backward()  # not a norm
    assert (pe.delta.grad[inside] != 0).all() and (pe.delta.grad[~inside] == 0).all()
    with torch.no_grad():
        clamped = pe.delta.clamp(-2 * math.pi, 0.0)
        before = pe.rotate_key(x, pos)
        pe.delta.copy_(clamped)
        torch.testing.assert_close(pe.rotate_key(x, pos), before)


def test_uniform_init_draws_delta_in_its_range_and_no_bias_has_no_parameter():
    torch.manual_seed(0)
    delta = pope("bias_init=uniform").delta
    assert ((delta >= -2 * math.pi) & (delta <= 0)).all() and delta.std() > 1
    assert list(pope("phase_bias=false").parameters()) == []


@pytest.mark.parametrize("wrapper", [None, "urpe", "randomized"])
def test_without_a_dot_product_delta_is_dropped_so_that_no_parameter_lacks_a_gradient(wrapper):
    node = variant("pe", "pope")
    if wrapper is not None:
        node = {**variant("pe", wrapper), "base": node}
    with_dot = make_parts(node, synthesizer="dot")
    assert "delta" in " ".join(name for name, _ in with_dot.pe.named_parameters())
    for synthesizer in ("dense", "random"):
        parts = make_parts(node, synthesizer=synthesizer)
        assert "delta" not in " ".join(name for name, _ in parts.pe.named_parameters())


def test_the_scale_is_one_over_root_d_of_the_head_not_of_the_doubled_width():
    pe = pope()
    assert pe.scale(2 * D) == D**-0.5 == pe.scale(D)


def layer_inputs(length: int = 8):
    torch.manual_seed(0)
    parts = make_parts("pope", shape=CAUSAL).double()
    moved(parts.pe)
    attn = Attention(CAUSAL, 0, True, True, init_std=0.5, out_std=0.5).double()
    x = vectors(2, length, SHAPE.d_model)
    return parts, attn, x, torch.arange(length)


def expected_layer(parts, attn, x, pos, padding=None) -> torch.Tensor:
    """The layer's output from the definition's scores, softmax(a/√d) v."""
    q, k, v = (split_heads(t, H) for t in attn.qkv_proj(x).split(SHAPE.d_model, -1))
    a = definition(q, k, pos.tolist(), pos.tolist(), parts.pe.delta.detach()) / D**0.5
    mask = attention_mask(pos, pos, padding, causal=True)
    weights = torch.softmax(a.masked_fill(~mask, -math.inf), -1)
    return attn.out_proj((weights @ v).transpose(1, 2).flatten(-2))


@pytest.mark.parametrize(
    "compute",
    [Compute(), Compute(fast=False), Compute(chunk=3), Compute(fast=False, chunk=3)],
    ids=["sdpa", "plain", "sdpa-chunked", "plain-chunked"],
)
def test_a_layer_attends_with_the_definitions_scores_on_every_path(compute):
    parts, attn, x, pos = layer_inputs()
    attn.compute = compute
    padding = torch.zeros(2, len(pos), dtype=torch.bool)
    padding[1, -3:] = True
    mask = attention_mask(pos, pos, padding, causal=True)
    with torch.no_grad():
        expected = expected_layer(parts, attn, x, pos, padding)
        out = attn(x, parts, pos, pos, mask)
    torch.testing.assert_close(out[0], expected[0])
    torch.testing.assert_close(out[1, :-3], expected[1, :-3])  # padded queries: any output


def test_the_fused_and_plain_paths_give_the_same_gradients_delta_included():
    grads = []
    for fast in (True, False):
        parts, attn, x, pos = layer_inputs()
        attn.compute = Compute(fast=fast)
        out = attn(x, parts, pos, pos, attention_mask(pos, pos, None, True), is_causal=True)
        grads.append(torch.autograd.grad(out.square().sum(), [parts.pe.delta, *attn.parameters()]))
    for fused, plain in zip(*grads, strict=True):
        torch.testing.assert_close(fused, plain)


def test_a_layer_decoding_one_query_at_a_time_with_the_cache_gives_the_full_pass():
    parts, attn, x, pos = layer_inputs()
    with torch.no_grad():
        expected = expected_layer(parts, attn, x, pos)
        cache, steps = KVCache(), []
        for t in range(len(pos)):
            steps.append(
                attn(x[:, t : t + 1], parts, pos[t : t + 1], pos[: t + 1], None, cache=cache)
            )
    assert cache.k.shape[-1] == 2 * D and cache.v.shape[-1] == SHAPE.value_dim
    torch.testing.assert_close(torch.cat(steps, 1), expected)


def model_config(**changes) -> ModelConfig:
    sizes = {"block": Standard(), "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32}
    return ModelConfig(**{**sizes, "dropout": 0.0, "init_std": 0.2, **changes})


def spec() -> AttentionConfig:
    return AttentionConfig(variant("pe", "pope"), variant("norm", "softmax"), variant("synthesizer", "dot"))  # fmt: skip


def move_deltas(model: torch.nn.Module) -> None:
    for seed, module in enumerate(m for m in model.modules() if isinstance(m, PoPE)):
        moved(module, seed)


def tokens(batch: int = 2, length: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 11, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_a_language_model_decoding_token_by_token_with_the_cache_gives_the_full_pass():
    torch.manual_seed(0)
    model = DecoderLM(model_config(), spec(), vocab_size=11).double().eval()
    move_deltas(model)
    ids = tokens()
    with torch.no_grad():
        full = model(ids)
        changed = ids.clone()
        changed[:, 5:] = changed[:, 5:] % 10 + 1
        torch.testing.assert_close(model(changed)[:, :5], full[:, :5])
        cache = model.new_cache()
        steps = [model(ids[:, t : t + 1], cache) for t in range(ids.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize("cross_pe", [False, True], ids=["cross-nope", "cross-pope"])
def test_an_encoder_decoder_respects_padding_and_decodes_the_same_with_the_cache(cross_pe):
    torch.manual_seed(0)
    model = EncoderDecoder(model_config(cross_pe=cross_pe), spec(), 11, 11).double().eval()
    move_deltas(model)
    src, tgt = tokens(), tokens(length=7, seed=1)
    padding = torch.zeros_like(src, dtype=torch.bool)
    padding[0, -3:] = True
    with torch.no_grad():
        memory = model.encode(src, padding)
        full = model.decode(tgt, memory, padding)
        other = src.clone()
        other[0, -3:] = other[0, -3:] % 10 + 1  # only padded tokens change
        torch.testing.assert_close(model(other, padding, tgt), full)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, padding, cache) for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize("causal", [False, True])
def test_a_tagger_ignores_padded_tokens(causal):
    torch.manual_seed(0)
    model = Tagger(model_config(), spec(), 11, 5, causal).double().eval()
    move_deltas(model)
    ids = tokens()
    padding = torch.zeros_like(ids, dtype=torch.bool)
    padding[1, -4:] = True
    other = ids.clone()
    other[1, -4:] = other[1, -4:] % 10 + 1
    with torch.no_grad():
        torch.testing.assert_close(model(other, padding)[1, :-4], model(ids, padding)[1, :-4])


def test_bf16_activations_give_bf16_outputs_close_to_float32():
    pe = build(variant("pe", "pope"), shape=SHAPE)
    x, pos = vectors(2, H, 5, D).float(), torch.tensor([0, 4, 90, 3000, 60_000])
    with torch.no_grad():
        moved(pe.double())
        pe.float()
        low = pe.rotate_key(x.bfloat16(), pos)
        assert low.dtype == torch.bfloat16
        torch.testing.assert_close(low.float(), pe.rotate_key(x, pos), atol=0.02, rtol=0.02)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["base=0"], r"pe.base=0 must be positive"),
        (["bias_init=normal"], r"pe.bias_init='normal' is not one of: zero, uniform"),
    ],
)
def test_bad_options_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        pope(*overrides)


def test_the_yaml_defaults_are_x_transformers():
    pe = pope()
    assert pe.base == 10000.0 and pe.delta is not None and pe.rotates
    assert not (pe.adds_score_terms or pe.post_normalization or pe.embeds or pe.causal_only)
