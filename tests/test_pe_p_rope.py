"""p-RoPE (Barbero et al. 2025) against its definition: RoPE's own frequencies, the highest
⌊p·d/2⌋ kept and the rest not rotated, by explicit 2×2 rotations in float64; p = 1 is RoPE and
p = 0 no encoding; it differs from RoPE's rotary_dim; as a subclass of RoPE it takes RoPE's
options and refuses others, and eval.py may scale it as it scales RoPE."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import SHAPE
from test_pe_rope import rope, vectors

from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.pe.p_rope import PRoPE
from attnlab.runner.same_model import evaluation_options

D = SHAPE.head_dim  # 8: four pairs


def p_rope(*overrides: str) -> PRoPE:
    return build(variant("pe", "p_rope", *overrides), shape=SHAPE)


def reference(x: torch.Tensor, positions: list[int], kept: int, base: float = 10000.0):
    """x [..., L, d] with pairs (2i, 2i + 1), i < kept, rotated by p·base^(−2i/d)."""
    out = x.clone()
    for row, p in enumerate(positions):
        for i in range(kept):
            angle = p * base ** (-2 * i / D)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[..., row, 2 * i], x[..., row, 2 * i + 1]
            out[..., row, 2 * i], out[..., row, 2 * i + 1] = c * a - s * b, s * a + c * b
    return out


@pytest.mark.parametrize(("fraction", "kept"), [(1.0, 4), (0.75, 3), (0.6, 2), (0.25, 1), (0.0, 0)])
def test_the_highest_frequencies_rotate_and_the_rest_pass_through(fraction, kept):
    x = vectors(2, SHAPE.n_heads, 7, D)
    positions = [0, 1, 5, 17, 300, 4096, 9]
    out = p_rope(f"fraction={fraction}").rotate(x, torch.tensor(positions))
    torch.testing.assert_close(out, reference(x, positions, kept))
    if kept < 4:
        torch.testing.assert_close(out[..., 2 * kept :], x[..., 2 * kept :])


def test_p_one_is_rope_and_p_zero_is_no_encoding():
    x, pos = vectors(1, SHAPE.n_heads, 6, D), torch.arange(6) * 37
    assert torch.equal(p_rope("fraction=1.0").rotate(x, pos), rope().rotate(x, pos))
    assert torch.equal(p_rope("fraction=0.0").rotate(x, pos), x)


def test_it_is_not_rope_over_fewer_dimensions():
    x, pos = vectors(1, SHAPE.n_heads, 4, D), torch.tensor([3, 50, 700, 9000])
    half = p_rope("fraction=0.5").rotate(x, pos)
    partial = rope("rotary_dim=4").rotate(x, pos)  # θ over 4 dimensions: base^(−2i/4)
    torch.testing.assert_close(half[..., 4:], partial[..., 4:])  # both pass these through
    assert not torch.allclose(half[..., :4], partial[..., :4])  # but rotate these differently


def test_scores_depend_only_on_the_offset():
    pe = p_rope()
    q, k = vectors(D), vectors(D, seed=1)
    scores = [pe.rotate(q[None, None], torch.tensor([m]))[0, 0] @ pe.rotate(
        k[None, None], torch.tensor([m + 11]))[0, 0] for m in (0, 7, 1000)]  # fmt: skip
    torch.testing.assert_close(scores[0], scores[1])
    torch.testing.assert_close(scores[0], scores[2])


def test_it_takes_ropes_options_and_refuses_others():
    node = variant("pe", "p_rope", "layout=half", "base=500.0")
    assert build(node, shape=SHAPE).layout == "half"
    with pytest.raises(ConfigError, match="'p_rope' has no option bse; its options are: base"):
        build({**node, "bse": 3}, shape=SHAPE)
    with pytest.raises(ConfigError, match="needs the option fraction"):
        build({k: v for k, v in node.items() if k != "fraction"}, shape=SHAPE)
    with pytest.raises(ConfigError, match=r"pe\.fraction=1\.5 must be between 0"):
        p_rope("fraction=1.5")


def test_eval_may_scale_it_as_it_scales_rope():
    changeable = evaluation_options({"pe": variant("pe", "p_rope")})
    assert set(changeable) == {
        "pe.scaling", "pe.scaling_factor", "pe.original_max_len", "pe.yarn_alpha", "pe.yarn_beta",
    }  # fmt: skip
    scaled = p_rope("scaling=linear", "scaling_factor=4.0", "fraction=0.5")
    torch.testing.assert_close(
        scaled.frequencies, torch.tensor([1.0, 0.1, 0.0, 0.0], dtype=torch.float64) / 4
    )
