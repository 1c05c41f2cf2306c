"""Absolute positions added to the token embeddings (design notes §2, §3): the paper's
sinusoid table, and BERT's learned table E_pos[p] with ids from 0, drawn on the scale of
the token embeddings as added."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.transformer import Stack, Tagger

D = SHAPE.d_model

STANDARD = variant("block", "standard")


def pe(option: str, *overrides: str, shape=SHAPE):
    return build(variant("pe", option, *overrides), shape=shape)


def paper_table(positions: list[int], dim: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p·ω_i), PE[p, 2i+1] = cos(p·ω_i), ω_i = 10000^(−2i/d), in float64."""
    table = torch.empty(len(positions), dim, dtype=torch.float64)
    for row, p in enumerate(positions):
        for i in range(dim // 2):
            omega = 10000 ** (-2 * i / dim)
            table[row, 2 * i] = math.sin(p * omega)
            table[row, 2 * i + 1] = math.cos(p * omega)
    return table


def sinusoid_rows(positions: list[int], dim: int = D) -> torch.Tensor:
    """The rows the module adds, read back by embedding zeros."""
    x = torch.zeros(1, len(positions), dim, dtype=torch.float64)
    return pe("sinusoidal", shape=replace(SHAPE, d_model=dim)).embed(x, torch.tensor(positions))[0]


def tokens(length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, length, D, generator=g, dtype=torch.float64)


def tiny_config() -> ModelConfig:
    return ModelConfig.from_config({**variant("model", "tiny"), "dropout": 0.0}, STANDARD)


def attention(pe_option: str, *overrides: str) -> AttentionConfig:
    return AttentionConfig(
        variant("pe", pe_option, *overrides),
        variant("norm", "softmax"),
        variant("synthesizer", "dot"),
    )


# ---------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize("dim", [D, 64])
def test_the_sinusoid_table_is_the_papers_formula(dim):
    positions = [*range(40), 511, 4096, 100_000]
    torch.testing.assert_close(sinusoid_rows(positions, dim), paper_table(positions, dim))


@settings(max_examples=30, deadline=None)
@given(p=st.integers(0, 10_000), q=st.integers(0, 10_000), shift=st.integers(0, 10_000))
def test_sinusoid_dot_products_depend_only_on_the_offset(p, q, shift):
    rows = sinusoid_rows([p, q, p + shift, q + shift])
    omegas = torch.tensor([10000 ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    expected = torch.cos((p - q) * omegas).sum()
    torch.testing.assert_close(rows[0] @ rows[1], expected)
    torch.testing.assert_close(rows[2] @ rows[3], expected)
    torch.testing.assert_close(rows.square().sum(-1), torch.full((4,), D / 2, dtype=torch.float64))


@settings(max_examples=20, deadline=None)
@given(p=st.integers(0, 10_000), k=st.integers(0, 1000))
def test_a_shift_by_k_is_one_block_rotation_for_every_position(p, k):
    m_k = torch.zeros(D, D, dtype=torch.float64)
    for i in range(D // 2):
        angle = k * 10000 ** (-2 * i / D)
        c, s = math.cos(angle), math.sin(angle)
        m_k[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    rows = sinusoid_rows([p, p + k])
    torch.testing.assert_close(rows[1], m_k @ rows[0])


def test_sinusoidal_embed_adds_the_table_and_has_no_parameters():
    module = pe("sinusoidal")
    x = tokens(6)
    for positions in (list(range(6)), list(range(9, 15))):
        out = module.embed(x, torch.tensor(positions))
        torch.testing.assert_close(out - x, paper_table(positions, D).expand_as(x))
    assert list(module.parameters()) == []
    assert not module.acts_in_attention


# ---------------------------------------------------------------- learned


def test_learned_embed_adds_table_row_p_at_position_p():
    torch.manual_seed(0)
    module = pe("learned", "max_len=32").double()
    x = tokens(5)
    table = module.table.weight
    assert not torch.allclose(table[0], table[1])
    for start in (0, 3, 27):
        pos = torch.arange(start, start + 5)
        torch.testing.assert_close(module.embed(x, pos), x + table[start : start + 5])
    assert not module.acts_in_attention


def test_the_learned_table_gets_gradients_only_at_the_positions_used():
    torch.manual_seed(0)
    module = pe("learned", "max_len=32").double()
    assert [name for name, p in module.named_parameters() if p.requires_grad] == ["table.weight"]
    module.embed(tokens(4), torch.arange(2, 6)).sum().backward()
    grad = module.table.weight.grad
    assert (grad[2:6] == 2.0).all(), "each used row gets one gradient per batch element"
    assert (grad[:2] == 0).all() and (grad[6:] == 0).all()


@pytest.mark.parametrize(
    "embedding_rms,overrides,std",
    [(1.0, (), 1.0), (0.02, (), 0.02), (1.0, ("init_std=0.5",), 0.5)],
)
def test_the_learned_table_starts_normal_on_the_token_scale_or_with_init_std(
    embedding_rms, overrides, std
):
    torch.manual_seed(0)
    shape = replace(SHAPE, embedding_rms=embedding_rms)
    table = pe("learned", *overrides, shape=shape).table.weight.detach()
    assert table.shape == (512, D)
    assert table.std().item() == pytest.approx(std, rel=0.05)
    assert abs(table.mean().item()) < 0.05 * std


@pytest.mark.parametrize("init_std", ["-1", "0", "abc"])
def test_a_learned_init_std_that_is_not_a_positive_number_is_one_sentence(init_std):
    # "abc" is refused by its type before the class sees it: "'learned' option init_std=…"
    with pytest.raises(ConfigError, match=r"init_std=.* must be a (positive )?number,? or null"):
        pe("learned", f"init_std={init_std}")


def rms(t: torch.Tensor) -> float:
    return t.detach().square().mean().sqrt().item()


@pytest.mark.parametrize("block", ["standard", "gau"])
@pytest.mark.parametrize("embed_scale", [True, False])
def test_learned_positions_start_on_the_scale_of_the_token_embeddings_as_added(embed_scale, block):
    torch.manual_seed(0)
    node = {**variant("model", "tiny"), "embed_scale": embed_scale}
    cfg = ModelConfig.from_config(node, variant("block", block))
    tagger = Tagger(cfg, attention("learned"), vocab_size=1000, num_classes=2, causal=False)
    tokens = tagger.embed(torch.arange(1000))  # every token's embedding, scaled as added
    positions = tagger.stack.parts.pe.embed(torch.zeros(512, cfg.d_model), torch.arange(512))
    assert rms(positions) / rms(tokens) == pytest.approx(1.0, rel=0.1)


def test_a_sequence_longer_than_the_learned_table_raises():
    stack = Stack(tiny_config(), attention("learned", "max_len=8"), 2, causal=False)
    stack(torch.randn(1, 8, stack.parts.pe.shape.d_model))
    with pytest.raises(ConfigError, match=r"9 positions .* at most 8 \(pe.max_len\)"):
        stack(torch.randn(1, 9, stack.parts.pe.shape.d_model))


# ---------------------------------------------------------------- in a stack


@pytest.mark.parametrize("option", ["sinusoidal", "learned"])
def test_absolute_positions_break_the_permutation_equivariance_of_a_bidirectional_stack(option):
    cfg = ModelConfig.from_config(
        {**variant("model", "tiny"), "dropout": 0.0, "init_std": 0.2}, STANDARD
    )
    x = torch.randn(
        2, 7, cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    for pe_option, equivariant in (("none", True), (option, False)):
        torch.manual_seed(0)
        stack = Stack(cfg, attention(pe_option), 2, causal=False).double().eval()
        permuted_out, out_permuted = stack(x[:, perm]), stack(x)[:, perm]
        assert torch.allclose(permuted_out, out_permuted) == equivariant, pe_option
