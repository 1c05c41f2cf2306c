"""RoPE against its definition (design notes §8): q̃_m = R_m q_m with R_m block-diagonal 2×2
rotations by m·θ_i, θ_i = base^(−2i/d), so q̃_m·k̃_n = q_mᵀ R_{n−m} k_n; v is never rotated."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, make_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.layer import Attention, KVCache
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import attention_mask
from attnlab.pe.rope import RoPE
from attnlab.tensors import float64_home, split_heads

D = SHAPE.head_dim
LAYOUTS = ["interleaved", "half"]


def rope(*overrides: str, shape=SHAPE) -> RoPE:
    return build(variant("pe", "rope", *overrides), shape=shape)


def rotation(position: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """R_p [dim, dim] in float64: 2×2 blocks [[cos, −sin], [sin, cos]] by p·θ_i on (2i, 2i+1)."""
    r = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        angle = position * base ** (-2 * i / dim)
        c, s = math.cos(angle), math.sin(angle)
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = c, -s
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = s, c
    return r


def half_order(dim: int) -> torch.Tensor:
    """x[..., half_order(d)] moves the interleaved pair (2i, 2i + 1) to the half-split pair
    (i, i + d/2); its argsort moves them back."""
    return torch.cat((torch.arange(0, dim, 2), torch.arange(1, dim, 2)))


def reference(
    x: torch.Tensor,
    positions: list[int],
    rotary_dim: int = D,
    base: float = 10000.0,
    layout: str = "interleaved",
) -> torch.Tensor:
    """x [..., L, d] rotated by explicit matrices: block-diag(R_p, I) on the first rotary_dim
    dims, in the layout's order."""
    out = x.clone()
    order = (
        torch.arange(rotary_dim) if layout == "interleaved" else half_order(rotary_dim).argsort()
    )
    for row, p in enumerate(positions):
        paired = x[..., row, :rotary_dim][..., order]
        rotated = paired @ rotation(p, rotary_dim, base).T
        out[..., row, order] = rotated
    return out


def vectors(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def rotated_score(pe: RoPE, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> torch.Tensor:
    q_m = pe.rotate(q[None], torch.tensor([m]))[0]
    k_n = pe.rotate(k[None], torch.tensor([n]))[0]
    return q_m @ k_n


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 5000),
    n=st.integers(0, 5000),
    shift=st.integers(0, 5000),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_rotated_scores_depend_only_on_the_offset(m, n, shift, layout, seed):
    pe = rope(f"layout={layout}")
    q, k = vectors(2, D, seed=seed)
    expected = rotated_score(pe, q, k, m, n)
    torch.testing.assert_close(rotated_score(pe, q, k, m + shift, n + shift), expected)
    torch.testing.assert_close(expected, q @ reference(k[None], [n - m], layout=layout)[0])


def test_rotation_is_the_block_diagonal_matrix_and_scores_are_q_R_n_minus_m_k():
    pe = rope()
    length = 12
    q, k = vectors(2, SHAPE.n_heads, length, D)
    pos = torch.arange(length)
    q_rot, k_rot = pe.rotate(q, pos), pe.rotate(k, pos)
    for p in range(length):
        torch.testing.assert_close(q_rot[..., p, :], q[..., p, :] @ rotation(p, D).T)
    scores = q_rot @ k_rot.transpose(-2, -1)
    for m in range(length):
        for n in range(length):
            expected = (q[..., m, :] * (k[..., n, :] @ rotation(n - m, D).T)).sum(-1)
            torch.testing.assert_close(scores[..., m, n], expected)


def test_scores_of_fixed_vectors_at_every_position_are_toeplitz():
    pe = rope()
    length = 10
    q, k = (v.expand(length, D) for v in vectors(2, D))
    pos = torch.arange(length)
    scores = pe.rotate(q, pos) @ pe.rotate(k, pos).T
    for offset in range(-length + 1, length):
        diagonal = scores.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    assert not torch.allclose(scores.diagonal(0)[0], scores.diagonal(1)[0])


@settings(max_examples=25, deadline=None)
@given(
    positions=st.lists(st.integers(0, 100_000), min_size=1, max_size=6),
    layout=st.sampled_from(LAYOUTS),
    rotary_dim=st.sampled_from([2, 4, D]),
)
def test_rotation_preserves_norms(positions, layout, rotary_dim):
    pe = rope(f"layout={layout}", f"rotary_dim={rotary_dim}")
    x = vectors(3, len(positions), D)
    out = pe.rotate(x, torch.tensor(positions))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_position_zero_is_the_identity(layout):
    x = vectors(2, SHAPE.n_heads, 1, D)
    assert torch.equal(rope(f"layout={layout}").rotate(x, torch.tensor([0])), x)
    assert not torch.allclose(rope(f"layout={layout}").rotate(x, torch.tensor([1])), x)


def test_the_half_layout_is_the_interleaved_one_with_head_dims_permuted():
    interleaved, half = rope("layout=interleaved"), rope("layout=half")
    x = vectors(2, SHAPE.n_heads, 9, D)
    pos = torch.arange(3, 12)
    order = half_order(D)
    torch.testing.assert_close(
        half.rotate(x[..., order], pos), interleaved.rotate(x, pos)[..., order]
    )
    assert not torch.allclose(half.rotate(x, pos), interleaved.rotate(x, pos))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rotary_dim_rotates_only_the_first_dims_with_its_own_theta(layout):
    rotary_dim = 4
    pe = rope(f"rotary_dim={rotary_dim}", f"layout={layout}")
    x = vectors(2, SHAPE.n_heads, 7, D)
    positions = [0, 1, 2, 5, 50, 500, 5000]
    out = pe.rotate(x, torch.tensor(positions))
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
    torch.testing.assert_close(out, reference(x, positions, rotary_dim, layout=layout))
    whole_head_theta = reference(x, positions, D, layout=layout)[..., :rotary_dim]
    assert not torch.allclose(out[..., :rotary_dim], whole_head_theta)


@pytest.mark.parametrize(("fraction", "dims"), [(0.25, 2), (0.5, 4), (1.0, D)])
def test_a_fractional_rotary_dim_is_that_fraction_of_the_head(fraction, dims):
    """GPT-NeoX's rotary_pct (Kazemnejad et al. rotate a quarter): the same rotation as the
    count of dimensions it makes."""
    x, positions = vectors(2, SHAPE.n_heads, 5, D), [0, 1, 3, 40, 900]
    out = rope(f"rotary_dim={fraction}").rotate(x, torch.tensor(positions))
    assert rope(f"rotary_dim={fraction}").rotary_dim == dims
    torch.testing.assert_close(out, reference(x, positions, dims))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_base_option_sets_theta(layout):
    x = vectors(2, SHAPE.n_heads, 6, D)
    positions = [0, 1, 7, 100, 4096, 70_000]
    pos = torch.tensor(positions)
    out = rope("base=500000", f"layout={layout}").rotate(x, pos)
    torch.testing.assert_close(out, reference(x, positions, base=500000.0, layout=layout))
    assert not torch.allclose(out, rope(f"layout={layout}").rotate(x, pos))


def test_the_yaml_defaults_rotate_the_whole_head_interleaved_with_base_10000():
    pe = rope()
    assert (pe.base, pe.rotary_dim, pe.layout) == (10000.0, D, "interleaved")
    assert pe.rotates and not (pe.adds_score_terms or pe.post_normalization)
    assert list(pe.parameters()) == []


@pytest.mark.parametrize("cached", [False, True], ids=["full", "one-query"])
def test_in_a_layer_q_and_k_are_rotated_at_their_positions_and_v_is_not(cached):
    torch.manual_seed(0)
    parts = make_parts("rope", shape=replace(SHAPE, causal=True)).double()
    attn = Attention(SHAPE, 0, True, True, init_std=0.5, out_std=0.5).double()
    length = 8
    x = vectors(2, length, SHAPE.d_model)
    pos = torch.arange(length)
    q, k, v = (split_heads(t, SHAPE.n_heads) for t in attn.qkv_proj(x).split(SHAPE.d_model, -1))
    q, k = reference(q, pos.tolist()), reference(k, pos.tolist())
    mask = attention_mask(pos, pos, None, causal=True)
    scores = (q @ k.transpose(-2, -1) / D**0.5).masked_fill(~mask, -math.inf)
    expected = attn.out_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).flatten(-2))
    if cached:
        cache, prefix = KVCache(), pos[:-1]
        attn(
            x[:, :-1],
            parts,
            prefix,
            prefix,
            attention_mask(prefix, prefix, None, True),
            cache=cache,
        )
        out = attn(x[:, -1:], parts, pos[-1:], pos, None, cache=cache)
        expected = expected[:, -1:]
    else:
        out = attn(x, parts, pos, pos, mask)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["rotary_dim=3"], r"pe.rotary_dim=3 must be even and between 2 and the head width 8"),
        (["rotary_dim=10"], r"pe.rotary_dim=10 must be even and between 2 and the head width 8"),
        (["rotary_dim=0"], r"pe.rotary_dim=0 must be even"),
        (["rotary_dim=0.3"], r"pe.rotary_dim=0.3 is 2.4 of the head's 8 dimensions: give a frac"),
        (["rotary_dim=0.125"], r"pe.rotary_dim=0.125 is 1 of the head's 8 dimensions"),
        (["rotary_dim=1.5"], r"pe.rotary_dim=1.5 is 12 of the head's 8 dimensions"),
        (["rotary_dim=-0.5"], r"pe.rotary_dim=-0.5 is -4 of the head's 8 dimensions"),
        (["layout=rotate_half"], r"pe.layout='rotate_half' is not one of: interleaved, half"),
        (["base=0"], r"pe.base=0 must be positive"),
        (["base=-10000"], r"pe.base=-10000 must be positive"),
    ],
)
def test_bad_options_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        rope(*overrides)


def test_float64_tables_are_built_on_the_cpu_for_apples_mps_which_has_no_float64():
    assert float64_home(torch.device("mps")) == torch.device("cpu")
    assert float64_home(torch.device("cpu")) == torch.device("cpu")
    assert float64_home(torch.device("cuda", 1)) == torch.device("cuda", 1)
