"""Synthesizers (Tay et al. 2021): each variant's formula, its absolute-position indexing,
and its behaviour inside the attention core (masks, fast path, the position probe)."""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch
from helpers import SHAPE, make_parts

from attnlab.attention.core import Compute, attend
from attnlab.config.build import build
from attnlab.config.options import options, variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import Stack, StackCache, attention_mask
from attnlab.synthesizer.base import Synthesis, Synthesizer
from attnlab.synthesizer.dot import Dot

MAX_LEN = 24
# Overrides that make each length-bound option small; a = 4, b = 6 have gcd 2, so tiling
# both factors would repeat logits with period lcm = 12 < 24.
SMALL = {
    "dense": ("max_len=24",),
    "random": ("max_len=24",),
    "random_fixed": ("max_len=24",),
    "factorized_dense": ("max_len=24", "a=4", "b=6"),
    "factorized_random": ("max_len=24", "k=3"),
    "mixture": ("components.0.max_len=24", "components.1.max_len=24"),
    "random_vanilla": ("components.0.max_len=24",),
    "dense_vanilla": ("components.0.max_len=24",),
}
SYNTHESIZERS = options("synthesizer")
WITH_DOT = ["random_vanilla", "dense_vanilla"]
MIXTURES = ["mixture", *WITH_DOT]
WITH_LOGITS = [o for o in SYNTHESIZERS if o != "dot"]


@cache
def config(group: str, option: str, overrides: tuple[str, ...] = ()) -> dict:
    """variant(...), composed once per test session (Hydra takes ~0.1 s a call)."""
    return variant(group, option, *overrides)


def node(option: str, *overrides: str) -> dict:
    """The synthesizer option's config node at the small test size, plus overrides."""
    return copy.deepcopy(config("synthesizer", option, (*SMALL.get(option, ()), *overrides)))


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter ~ N(0, 1): nonzero biases and unequal mixture weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def synthesizer(option: str, *overrides: str, seed: int = 0) -> Synthesizer:
    torch.manual_seed(seed)
    return randomize(build(node(option, *overrides), shape=SHAPE).double(), seed)


def tokens(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, SHAPE.d_model, generator=g, dtype=torch.float64)


def attention_inputs(x: torch.Tensor, seed: int = 2):
    """q, k, v [B, H, L, ·] in float64 with requires_grad, for a given x [B, L, d]."""
    g = torch.Generator().manual_seed(seed)
    b, length, _ = x.shape
    h, d, dv = SHAPE.n_heads, SHAPE.head_dim, SHAPE.value_dim
    return [
        torch.randn(b, h, length, width, generator=g, dtype=torch.float64).requires_grad_()
        for width in (d, d, dv)
    ]


def parts_for(option: str, *overrides: str):
    parts = make_parts(config("pe", "none"), config("norm", "softmax"), node(option, *overrides))
    return randomize(parts.double())


# ---------------------------------------------------------------- formulas


@pytest.mark.parametrize("shared_output", [False, True])
def test_dense_is_the_two_layer_formula(shared_output):
    synth = synthesizer("dense", f"shared_output={shared_output}")
    x, layer = tokens(), 1
    k_pos = torch.tensor([3, 0, 5, 23])
    logits = synth(x, torch.arange(x.shape[1]), k_pos, layer).logits
    f = synth.f
    for h in range(SHAPE.n_heads):
        h2 = 0 if shared_output else h
        hidden = torch.relu(x @ f.w1[layer, h] + f.b1[layer, h, 0])
        row = hidden @ f.w2[layer, h2] + f.b2[layer, h2, 0]  # B_i ∈ R^max_len
        torch.testing.assert_close(logits[:, h], row[..., k_pos])
    assert (logits[:, 0] != logits[:, 1]).any()


def test_random_logits_are_R_at_the_query_and_key_positions():
    synth = synthesizer("random")
    q_pos, k_pos = torch.tensor([2, 5, 7]), torch.tensor([0, 4, 7, 9, 23])
    for layer in range(SHAPE.n_layers):
        logits = synth(tokens(), q_pos, k_pos, layer).logits
        assert logits.shape == (1, SHAPE.n_heads, 3, 5)
        for h in range(SHAPE.n_heads):
            for i, qi in enumerate(q_pos):
                for j, kj in enumerate(k_pos):
                    assert logits[0, h, i, j] == synth.r[layer, h, qi, kj]


def test_fixed_random_has_no_trainable_parameters_but_is_in_the_state_dict():
    assert node("random_fixed") == {
        **node("random", "trainable=false"),
        "name": "random_fixed",
        "description": node("random_fixed")["description"],
    }
    fixed = build(node("random_fixed"), shape=SHAPE)
    assert list(fixed.parameters()) == []
    assert set(fixed.state_dict()) == {"r"}
    other = build(node("random", "trainable=false"), shape=SHAPE)
    pos, x = torch.arange(5), tokens().float()
    assert not torch.equal(fixed(x, pos, pos, 0).logits, other(x, pos, pos, 0).logits)
    other.load_state_dict(fixed.state_dict())
    assert torch.equal(fixed(x, pos, pos, 0).logits, other(x, pos, pos, 0).logits)
    trainable = build(node("random"), shape=SHAPE)
    assert [name for name, _ in trainable.named_parameters()] == ["r"]


def test_factorized_dense_is_vec_of_A_Bt_with_every_product_distinct():
    synth = synthesizer("factorized_dense")
    x, layer, a, b = tokens(), 0, 4, 6
    pos = torch.arange(x.shape[1])
    logits = synth(x, pos, torch.arange(MAX_LEN), layer).logits
    big_a = synth.f_a(x, layer, torch.arange(a))  # [B, H, L, a]
    big_b = synth.f_b(x, layer, torch.arange(b))
    expected = (big_a[..., :, None] * big_b[..., None, :]).flatten(-2)  # vec(A Bᵀ), row-major
    torch.testing.assert_close(logits, expected)
    rows = logits.reshape(-1, MAX_LEN)
    assert all(row.unique().numel() == a * b for row in rows)


def test_factorized_random_is_R1_R2t_of_rank_k():
    synth = synthesizer("factorized_random")
    layer, k = 1, 3
    full = (synth.r1[layer] @ synth.r2[layer].transpose(-2, -1))[None]  # [1, H, ℓ, ℓ]
    every = torch.arange(MAX_LEN)
    torch.testing.assert_close(synth(tokens(), every, every, layer).logits, full)
    assert torch.linalg.matrix_rank(full[0]).tolist() == [k] * SHAPE.n_heads
    q_pos, k_pos = torch.tensor([4, 1]), torch.tensor([0, 9, 2])
    torch.testing.assert_close(
        synth(tokens(), q_pos, k_pos, layer).logits, full[..., q_pos[:, None], k_pos]
    )


@pytest.mark.parametrize("option", MIXTURES)
def test_a_mixture_is_the_alpha_weighted_sum_of_its_components(option):
    synth = synthesizer(option)
    x, layer = tokens(), 1
    pos = torch.arange(x.shape[1])
    alpha = torch.softmax(synth.w[layer], -1)
    assert not torch.allclose(alpha, alpha.mean().expand_as(alpha)), "test needs unequal α"
    out = synth(x, pos, pos, layer)
    parts = [(a, c(x, pos, pos, layer)) for a, c in zip(alpha, synth.components, strict=True)]
    logits = sum(a * part.logits for a, part in parts if part.logits is not None)
    torch.testing.assert_close(out.logits, logits)
    if option == "mixture":
        assert out.dot is None
    else:
        torch.testing.assert_close(out.dot, sum(a * part.dot for a, part in parts if part.dot))


@pytest.mark.parametrize("option", MIXTURES)
def test_mixture_weights_start_equal_sum_to_one_and_learn(option):
    synth = build(node(option), shape=SHAPE).double()
    for layer in range(SHAPE.n_layers):
        alpha = synth.alpha(layer)
        torch.testing.assert_close(alpha, torch.full_like(alpha, 1 / len(synth.components)))
    parts = make_parts(config("pe", "none"), config("norm", "softmax"), node(option)).double()
    randomize(parts.synthesizer.components)
    x = tokens()
    q, k, v = attention_inputs(x)
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, None, causal=True)
    for fast in (True, False):
        out = attend(parts, 1, x, q, k, v, pos, pos, mask, Compute(fast=fast))
        (grad,) = torch.autograd.grad(out.square().sum(), [parts.synthesizer.w])
        assert grad[1].abs().min() > 0, "every mixing weight of the layer used gets a gradient"
        assert torch.equal(grad[0], torch.zeros_like(grad[0])), "other layers' weights do not"


def test_dot_gives_the_dot_product_and_no_logits():
    pos = torch.arange(7)
    assert synthesizer("dot")(tokens(), pos, pos, 1) == Synthesis(dot=1.0, logits=None)


@pytest.mark.parametrize("option", WITH_LOGITS)
def test_every_layer_has_its_own_logits(option):
    synth = synthesizer(option)
    x = tokens()
    pos = torch.arange(x.shape[1])
    assert not torch.allclose(synth(x, pos, pos, 0).logits, synth(x, pos, pos, 1).logits)


@pytest.mark.parametrize("option", MIXTURES)
def test_every_layer_of_a_mixture_has_its_own_weights_and_component_parameters(option):
    synth = synthesizer(option)
    x = tokens()
    pos = torch.arange(x.shape[1])
    assert synth.w.shape == (SHAPE.n_layers, len(synth.components))
    assert not torch.allclose(synth.alpha(0), synth.alpha(1))
    synthesizing = [c for c in synth.components if not isinstance(c, Dot)]
    assert len(synthesizing) == len(synth.components) - (option in WITH_DOT)
    for component in synthesizing:
        first, second = component(x, pos, pos, 0), component(x, pos, pos, 1)
        assert not torch.allclose(first.logits, second.logits), type(component).__name__
    if option in WITH_DOT:
        vanilla = next(i for i, c in enumerate(synth.components) if isinstance(c, Dot))
        dots = [synth(x, pos, pos, layer).dot for layer in (0, 1)]
        torch.testing.assert_close(dots, [synth.alpha(layer)[vanilla] for layer in (0, 1)])
        assert not torch.allclose(dots[0], dots[1])


# ---------------------------------------------------------------- positions and length


@pytest.mark.parametrize("option", WITH_LOGITS)
def test_a_cached_row_is_the_row_of_the_full_matrix(option):
    synth = synthesizer(option)
    x, layer = tokens(length=9), 1
    full = synth(x, torch.arange(9), torch.arange(9), layer)
    for t in (0, 4, 8):
        row = synth(x[:, t : t + 1], torch.tensor([t]), torch.arange(t + 1), layer)
        expected = full.logits[:, :, t : t + 1, : t + 1]
        torch.testing.assert_close(row.logits, expected.expand_as(row.logits))
        torch.testing.assert_close(row.dot, full.dot)


def small_stack(option: str, causal: bool) -> Stack:
    cfg = ModelConfig(
        Standard(), d_model=SHAPE.d_model, n_heads=SHAPE.n_heads, n_layers=2, d_ff=32, dropout=0.0
    )
    attention = AttentionConfig.from_config(
        config("pe", "none"), config("norm", "softmax"), node(option)
    )
    return randomize(Stack(cfg, attention, cfg.n_layers, causal).double()).eval()


@pytest.mark.parametrize("option", SYNTHESIZERS)
def test_incremental_decoding_equals_the_full_causal_forward(option):
    stack = small_stack(option, causal=True)
    x = tokens(length=6) * 0.3
    full = stack(x)
    cache_ = StackCache.empty(2)
    steps = [stack(x[:, t : t + 1], cache=cache_) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full)


def bounded() -> list[str]:
    """The options whose synthesizer declares a bound on positions (max_len) at its defaults."""
    return [o for o in SYNTHESIZERS if build(config("synthesizer", o), shape=SHAPE).max_len]


def test_every_bounded_synthesizer_has_its_small_settings():
    assert set(bounded()) == set(SMALL), "give a bounded synthesizer's max_len=24 in SMALL"


@pytest.mark.parametrize("option", bounded())
def test_a_sequence_beyond_max_len_raises(option):
    stack = small_stack(option, causal=False)
    stack(tokens(length=MAX_LEN))
    with pytest.raises(ConfigError, match=rf"{MAX_LEN + 1} positions .* at most {MAX_LEN}"):
        stack(tokens(length=MAX_LEN + 1))


def test_a_mixture_is_bound_by_its_shortest_component():
    synth = build(node("mixture", "components.1.max_len=10"), shape=SHAPE)
    assert synth.max_len == 10
    assert build(node("dot"), shape=SHAPE).max_len is None
    assert build(node("random_vanilla"), shape=SHAPE).max_len == MAX_LEN


# ---------------------------------------------------------------- bad options


def test_factors_whose_product_is_not_max_len_raise_a_config_error():
    with pytest.raises(
        ConfigError,
        match=r"4·5 = 20 must equal synthesizer.max_len=24: .* synthesizer.a=4 synthesizer.b=6",
    ):
        build(node("factorized_dense", "b=5"), shape=SHAPE)


@pytest.mark.parametrize(
    "option,override,message",
    [
        ("random", "max_len=0", "synthesizer.max_len=0 must be a positive integer"),
        ("factorized_random", "k=0", "synthesizer.k=0 must be a positive integer"),
        ("mixture", "components=[]", "synthesizer.components is empty"),
        ("mixture", "components=[random]", r"components\[0\]='random' is not a config node"),
    ],
)
def test_bad_options_raise_a_config_error(option, override, message):
    with pytest.raises(ConfigError, match=message):
        build(variant("synthesizer", option, override), shape=SHAPE)


def test_a_mixture_component_that_is_no_synthesizer_raises_a_config_error():
    node = {**variant("synthesizer", "mixture"), "components": [variant("pe", "rope")]}
    with pytest.raises(
        ConfigError, match=r"components\[0\] builds RoPE, which is not a Synthesizer"
    ):
        build(node, shape=SHAPE)


# ---------------------------------------------------------------- inside the attention core


def attention_weights(parts, x, mask, fast: bool) -> torch.Tensor:
    """The normalized attention matrix, read out through one-hot values v = I."""
    b, length, _ = x.shape
    q, k, _ = attention_inputs(x)
    eye = torch.eye(length, dtype=torch.float64).expand(b, SHAPE.n_heads, length, length)
    pos = torch.arange(length)
    return attend(parts, 1, x, q, k, eye, pos, pos, mask, Compute(fast=fast))


@pytest.mark.parametrize("option", SYNTHESIZERS)
def test_causal_masking_applies_to_synthesized_logits(option):
    parts = parts_for(option)
    x = tokens()
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, None, causal=True)
    for fast in (True, False):
        weights = attention_weights(parts, x, mask, fast)
        assert torch.equal(weights.triu(1), torch.zeros_like(weights)), "weight on a future key"
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]))
        visible = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        assert (weights[..., visible] > 0).all()


@pytest.mark.parametrize("option", SYNTHESIZERS)
def test_changing_future_tokens_never_changes_earlier_outputs(option):
    parts = parts_for(option)
    x = tokens()
    q, k, v = attention_inputs(x)
    t = 3
    changed = [a.detach().clone() for a in (x, q, k, v)]
    changed[0][:, t + 1 :] = tokens(seed=9)[:, t + 1 :]
    for a in changed[1:]:
        a[:, :, t + 1 :] = torch.randn_like(a[:, :, t + 1 :])
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, None, causal=True)
    out = attend(parts, 0, x, q, k, v, pos, pos, mask)
    out_changed = attend(parts, 0, *changed, pos, pos, mask)
    torch.testing.assert_close(out[:, :, : t + 1], out_changed[:, :, : t + 1])
    assert not torch.allclose(out[:, :, t + 1 :], out_changed[:, :, t + 1 :])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("option", WITH_DOT)
def test_fast_path_equals_plain_path_with_unequal_mixing_weights(option, causal):
    parts = parts_for(option)
    x = tokens(batch=3).requires_grad_()
    q, k, v = attention_inputs(x)
    padding = torch.zeros(3, x.shape[1], dtype=torch.bool)
    padding[1, -2:] = True
    pos = torch.arange(x.shape[1])
    mask = attention_mask(pos, pos, padding, causal)
    results = []
    for fast in (True, False):
        out = attend(parts, 1, x, q, k, v, pos, pos, mask, Compute(fast=fast))
        wrt = [x, q, k, v, *parts.parameters()]
        grads = torch.autograd.grad(out.square().sum(), wrt, allow_unused=True)
        results.append((out, grads))
    (fast_out, fast_grads), (plain_out, plain_grads) = results
    torch.testing.assert_close(fast_out, plain_out)
    for fast_grad, plain_grad in zip(fast_grads, plain_grads, strict=True):
        torch.testing.assert_close(fast_grad, plain_grad)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("option", SYNTHESIZERS)
def test_identical_inputs_give_identical_outputs_at_every_position(option, causal):
    """Su's probe (design notes §13): synthesizers only change pre-softmax logits, rows stay
    stochastic, so identical tokens stay identical however the logits depend on position."""
    parts = parts_for(option)
    length = 9
    x = tokens(batch=1, length=1).expand(2, length, -1)
    q, k, v = (a[:, :, :1].expand(-1, -1, length, -1) for a in attention_inputs(tokens(length=1)))
    pos = torch.arange(length)
    mask = attention_mask(pos, pos, None, causal)
    for fast in (True, False):
        out = attend(parts, 0, x, q, k, v, pos, pos, mask, Compute(fast=fast))
        torch.testing.assert_close(out, v)


def test_only_dot_product_attention_says_it_is_the_plain_dot_product():
    plain = [
        o for o in options("synthesizer") if build(variant("synthesizer", o), shape=SHAPE).plain_dot
    ]
    assert plain == ["dot"]
