"""URPE against its definition: C is a per-head Toeplitz matrix, C ≡ 1 is exactly the base PE,
rows of A ⊙ C no longer sum to 1, so identical tokens get position-dependent outputs."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import SHAPE, compose_config, make_parts

from attnlab.attention.core import Compute, attend
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import Stack, attention_mask


@functools.cache
def node(group: str, option: str, *overrides: str) -> dict:
    return variant(group, option, *overrides)


def urpe(base: str, **options) -> dict:
    """The urpe YAML around another PE option, as `pe=urpe pe@pe.base=<base>` composes it."""
    return {**node("pe", "urpe"), "base": node("pe", base), **options}


def random_table(pe, seed: int = 0, low: float = 0.2, high: float = 2.0) -> None:
    """Move c away from its all-ones init, as training does."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        pe.table.copy_(low + (high - low) * torch.rand(pe.table.shape, generator=g))


def qkv(n_queries: int, n_keys: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    make = lambda n: torch.randn(3, SHAPE.n_heads, n, SHAPE.head_dim, generator=g).double()  # noqa: E731
    return (
        torch.zeros(3, n_queries, SHAPE.d_model).double(),
        make(n_queries),
        make(n_keys),
        make(n_keys),
    )


def test_the_default_base_is_t5_and_the_documented_override_picks_another(tmp_path):
    assert node("pe", "urpe")["base"]["name"] == "t5"
    cfg = compose_config(["pe=urpe", "pe@pe.base=rope", "pe.base.base=500"], tmp_path)
    pe = build(cfg.pe, shape=SHAPE)
    assert type(pe.base).__name__ == "RoPE" and pe.base.base == 500


def test_c_is_toeplitz_per_head_with_one_entry_per_distance():
    pe = make_parts(urpe("none", max_len=6)).pe.double()
    random_table(pe)
    pos = torch.arange(6)
    c = pe.toeplitz(pos, pos)
    assert c.shape == (SHAPE.n_heads, 6, 6)
    for h in range(SHAPE.n_heads):
        for i in range(6):
            for j in range(6):
                assert c[h, i, j] == pe.table[j - i + 5, h]
    assert len(set(c[0].flatten().tolist())) == 11  # 2·max_len − 1 distinct distances
    # cached decoding: the query at position 4 sees row 4 of the full matrix
    assert torch.equal(pe.toeplitz(pos[4:5], pos[:5]), c[:, 4:5, :5])
    weights = torch.rand(2, SHAPE.n_heads, 6, 6, dtype=torch.float64)
    for layer in range(SHAPE.n_layers):  # one C for every layer
        assert torch.equal(pe.reweight(weights, pos, pos, layer), weights * c)


@pytest.mark.parametrize("norm", ["softmax", "relu2"])
@pytest.mark.parametrize("base", ["none", "rope", "t5", "alibi", "deberta"])
def test_c_equal_to_one_reproduces_the_base_attention_exactly(base, norm):
    torch.manual_seed(0)
    with_urpe = make_parts(urpe(base), node("norm", norm), node("synthesizer", "dot")).double()
    plain = make_parts(node("pe", base), node("norm", norm), node("synthesizer", "dot")).double()
    plain.pe.load_state_dict(with_urpe.pe.base.state_dict())
    assert not with_urpe.fast()
    assert (with_urpe.pe.needs_query, with_urpe.pe.needs_key) == (
        plain.pe.needs_query,
        plain.pe.needs_key,
    )
    x, q, k, v = qkv(7, 7)
    pos = torch.arange(7)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, -2:] = True
    mask = attention_mask(pos, pos, padding, causal=True)
    q_rot, k_rot = with_urpe.pe.rotate(q, pos), with_urpe.pe.rotate(k, pos)
    out = attend(with_urpe, 1, x, q_rot, k_rot, v, pos, pos, mask, Compute(fast=False))
    expected = attend(
        plain,
        1,
        x,
        plain.pe.rotate(q, pos),
        plain.pe.rotate(k, pos),
        v,
        pos,
        pos,
        mask,
        Compute(fast=False),
    )
    assert torch.equal(out, expected)


def test_weights_are_the_base_weights_times_c_and_rows_no_longer_sum_to_one():
    parts = make_parts(urpe("t5")).double()
    random_table(parts.pe)
    x, q, k, v = qkv(5, 8)
    k_pos = torch.arange(3, 11)
    q_pos = k_pos[3:]
    mask = attention_mask(q_pos, k_pos, None, causal=True)
    scores = q @ k.transpose(-2, -1) / SHAPE.head_dim**0.5 + parts.pe.score_bias(
        q, k, q_pos, k_pos, 0
    )
    base_weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    table, offset = parts.pe.table.tolist(), parts.pe.max_len - 1
    c = torch.tensor(
        [
            [[table[j - i + offset][h] for j in k_pos.tolist()] for i in q_pos.tolist()]
            for h in range(SHAPE.n_heads)
        ],
        dtype=torch.float64,
    )
    weights = base_weights * c
    torch.testing.assert_close(attend(parts, 0, x, q, k, v, q_pos, k_pos, mask), weights @ v)
    assert (weights.sum(-1) - 1).abs().min() > 1e-3


def test_training_moves_c_and_the_rows_stop_summing_to_one():
    torch.manual_seed(0)
    parts = make_parts(urpe("rope", max_len=16)).double()
    x, q, k, v = qkv(6, 6)
    pos = torch.arange(6)
    target = torch.randn(3, SHAPE.n_heads, 6, SHAPE.head_dim).double()
    optimizer = torch.optim.SGD([parts.pe.table], lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        loss = (attend(parts, 0, x, q, k, v, pos, pos, None) - target).square().mean()
        loss.backward()
        optimizer.step()
    assert not torch.equal(parts.pe.table, torch.ones_like(parts.pe.table))
    weights = parts.pe.reweight(torch.full((1, SHAPE.n_heads, 6, 6), 1 / 6).double(), pos, pos, 0)
    assert (weights.sum(-1) - 1).abs().max() > 1e-4


def test_identical_tokens_get_outputs_that_depend_on_position():
    """The probe: o_i = (Σ_j a_ij c[j − i]) v varies with i; the base alone gives o_i = v."""
    parts = make_parts(urpe("t5")).double()
    _, q, k, v = qkv(1, 1)
    length = 9
    x = torch.zeros(3, length, SHAPE.d_model).double()
    q, k, v = (t.expand(-1, -1, length, -1) for t in (q, k, v))
    pos = torch.arange(length)
    out = attend(parts, 0, x, q, k, v, pos, pos, None)
    torch.testing.assert_close(out, v)  # C = 1: the base's row-stochastic attention
    random_table(parts.pe)
    out = attend(parts, 0, x, q, k, v, pos, pos, None)
    scores = q @ k.transpose(-2, -1) / SHAPE.head_dim**0.5 + parts.pe.score_bias(q, k, pos, pos, 0)
    row_sums = (torch.softmax(scores, -1) * parts.pe.toeplitz(pos, pos)).sum(-1, keepdim=True)
    torch.testing.assert_close(out, row_sums * v)
    assert (out[:, :, 1:] - out[:, :, :1]).abs().amax(dim=(0, 1, 3)).min() > 1e-3


def test_positions_beyond_max_len_raise_and_the_base_bound_counts():
    bounded_base = urpe("learned", max_len=16) | {"base": {**node("pe", "learned"), "max_len": 4}}
    assert build(bounded_base, shape=SHAPE).max_len == 4
    model = ModelConfig(
        Standard(), d_model=SHAPE.d_model, n_heads=SHAPE.n_heads, n_layers=1, d_ff=32
    )
    attention = AttentionConfig(
        urpe("rope", max_len=8), node("norm", "softmax"), node("synthesizer", "dot")
    )
    stack = Stack(model, attention, n_layers=1, causal=False)
    assert torch.isfinite(stack(torch.randn(2, 8, SHAPE.d_model))).all()
    with pytest.raises(ConfigError, match=r"9 positions .* at most 8 \(pe.max_len\)"):
        stack(torch.randn(2, 9, SHAPE.d_model))


@pytest.mark.parametrize(
    "config,message",
    [
        (lambda: urpe("none", max_len=0), "max_len=0 must be at least 1"),
        (lambda: {**urpe("none"), "base": urpe("none")}, "already acts after the normalizer"),
    ],
)
def test_bad_options_say_what_to_change(config, message):
    with pytest.raises(ConfigError, match=message):
        build(config(), shape=SHAPE)
