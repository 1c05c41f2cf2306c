"""CoPE against its definition (Golovneva et al. 2024, arXiv 2405.18719, §3): contextual
positions p_ij = Σ_{t=j..i} σ(q_i·k_t/√d_h) entry by entry, the interpolated term
q_i·e[p_ij]/√d_h, clipping, causality, cached decoding, and a whole layer in float64."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, make_parts, small_variant

from attnlab.attention.core import AttentionParts, Compute, attend
from attnlab.attention.layer import Attention
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import DecoderLM, attention_mask
from attnlab.pe.cope import interpolate

CAUSAL = replace(SHAPE, causal=True)
LENGTH = 7
SCALE = SHAPE.head_dim**-0.5
COPE = variant("pe", "cope")


def cope(max_pos: int = 16, seed: int = 0) -> AttentionParts:
    """Causal CoPE parts in float64, the zero-initialized tables replaced by random ones."""
    torch.manual_seed(seed)
    parts = make_parts({**COPE, "max_pos": max_pos}, shape=CAUSAL).double()
    with torch.no_grad():
        for table in parts.pe.tables:
            table.normal_()
    return parts


def random_qkv(length: int = LENGTH, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(2, SHAPE.n_heads, length, d, generator=g, dtype=torch.float64)
        for d in (SHAPE.head_dim, SHAPE.head_dim, SHAPE.value_dim)
    )


def loop_positions(q, k, q_pos, k_pos, max_pos):
    """p_ij = min(Σ_{t=j..i} σ(q_i·k_t/√d_h), max_pos) for keys j ≤ i, 0 after i."""
    b, h = q.shape[:2]
    p = torch.zeros(b, h, len(q_pos), len(k_pos), dtype=torch.float64)
    for n, m, a, c in ((n, m, a, c) for n in range(b) for m in range(h)
                       for a in range(len(q_pos)) for c in range(len(k_pos))):  # fmt: skip
        i, j = int(q_pos[a]), int(k_pos[c])
        if j <= i:
            gates = [torch.sigmoid(q[n, m, a] @ k[n, m, t] * SCALE) for t in range(j, i + 1)]
            p[n, m, a, c] = min(float(sum(gates)), max_pos)
    return p


def loop_term(q, table, p):
    """q_i·e[p_ij]/√d_h with e[p] = (1 − f)·e[⌊p⌋] + f·e[⌈p⌉], f = p − ⌊p⌋, entry by entry."""
    term = torch.zeros_like(p)
    for index in itertools.product(*map(range, p.shape)):
        n, m, a, _ = index
        pos = float(p[index])
        low, high = math.floor(pos), math.ceil(pos)
        embedding = (1 - (pos - low)) * table[low] + (pos - low) * table[high]
        term[index] = q[n, m, a] @ embedding * SCALE
    return term


@pytest.mark.parametrize("max_pos", [2, 16])
@pytest.mark.parametrize("n_cached", [0, 4])
def test_positions_and_term_equal_the_entry_by_entry_definition(max_pos, n_cached):
    pe = cope(max_pos).pe
    q, k, _ = random_qkv()
    k_pos = torch.arange(LENGTH)
    q_pos = k_pos[n_cached:]
    q = q[..., n_cached:, :]
    p = loop_positions(q, k, q_pos, k_pos, max_pos)
    torch.testing.assert_close(pe.positions(q, k, q_pos, k_pos), p)
    term = pe.score_bias(q, k, q_pos, k_pos, 1)
    torch.testing.assert_close(term, loop_term(q, pe.tables[1].detach(), p))


def counting_inputs(signs: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """q_i = a_i·u + noise ⟂ u (a_i > 0) and k_t = ±10⁴·u: every gate is exactly 0 or 1 in
    float64, open where the sign is +."""
    g = torch.Generator().manual_seed(seed)
    u = torch.zeros(SHAPE.head_dim, dtype=torch.float64)
    u[0] = 1.0
    n = len(signs)
    noise = torch.randn(1, SHAPE.n_heads, n, SHAPE.head_dim, generator=g, dtype=torch.float64)
    noise[..., 0] = 0.0
    a = 0.5 + torch.rand(1, SHAPE.n_heads, n, 1, generator=g, dtype=torch.float64)
    k = 1e4 * torch.tensor(signs, dtype=torch.float64)[:, None] * u
    return a * u + noise, k.expand(1, SHAPE.n_heads, n, SHAPE.head_dim)


@pytest.mark.parametrize("max_pos", [3, 16])
def test_saturated_gates_count_the_open_keys_and_pick_the_embedding_exactly(max_pos):
    signs = [1, -1, 1, 1, -1, -1, 1, 1, 1, -1, 1]
    q, k = counting_inputs(signs)
    pe = cope(max_pos).pe
    pos = torch.arange(len(signs))
    p = pe.positions(q, k, pos, pos)
    counts = [[min(sum(s > 0 for s in signs[j : i + 1]), max_pos) if j <= i else 0
               for j in pos] for i in pos]  # fmt: skip
    assert torch.equal(p, torch.tensor(counts, dtype=torch.float64).expand_as(p))
    table = pe.tables[0].detach()
    expected = ((q * SCALE) @ table.t()).gather(-1, p.long())  # z_i[p], same rounding
    assert torch.equal(pe.score_bias(q, k, pos, pos, 0), expected)


def test_interpolation_is_exact_at_integers_and_linear_between_neighbours():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, generator=g, dtype=torch.float64)
    integers = torch.tensor([[0.0, 1.0, 4.0, 2.0]] * 3, dtype=torch.float64)
    assert torch.equal(interpolate(z, integers), z.gather(-1, integers.long()))
    f = torch.tensor([0.25, 0.5, 1e-9, 1 - 1e-9], dtype=torch.float64)
    below = torch.tensor([0, 2, 3, 1])
    p = (below + f).expand(3, 4)
    expected = (1 - f) * z[:, below] + f * z[:, below + 1]
    torch.testing.assert_close(interpolate(z, p), expected)


def test_positions_past_max_pos_share_the_last_embedding():
    signs = [1] * 9
    q, k = counting_inputs(signs)
    pe = cope(max_pos=3).pe
    pos = torch.arange(len(signs))
    p = pe.positions(q, k, pos, pos)
    distance = (pos[:, None] - pos[None, :] + 1).clamp_min(0)  # every gate open: i − j + 1
    assert torch.equal(p[0, 0], distance.clamp_max(3).double())
    term = pe.score_bias(q, k, pos, pos, 1)
    far = distance >= 3
    last = (q @ pe.tables[1].detach()[3] * SCALE)[..., None]  # q_i·e[3]/√d_h, per query
    torch.testing.assert_close(term[..., far], last.expand_as(term)[..., far])


def test_future_keys_have_gate_zero_and_do_not_change_earlier_rows():
    pe = cope(max_pos=4).pe
    q, k, _ = random_qkv()
    pos = torch.arange(LENGTH)
    p = pe.positions(q, k, pos, pos)
    assert torch.equal(p.triu(1), torch.zeros_like(p))
    term = pe.score_bias(q, k, pos, pos, 0)
    for i in range(LENGTH - 1):
        changed = k.clone()
        changed[..., i + 1 :, :] = random_qkv(seed=i + 1)[1][..., i + 1 :, :]
        assert torch.equal(
            pe.score_bias(q, changed, pos, pos, 0)[..., : i + 1, :], term[..., : i + 1, :]
        )
    assert not torch.equal(pe.score_bias(q, changed, pos, pos, 0), term)


@pytest.mark.parametrize("n_cached", [LENGTH - 1, 3])
def test_cached_decoding_rows_equal_the_full_rows(n_cached):
    parts = cope(max_pos=4)
    q, k, v = random_qkv()
    pos = torch.arange(LENGTH)
    full_mask = attention_mask(pos, pos, None, causal=True)
    x = torch.zeros(2, LENGTH, SHAPE.d_model, dtype=torch.float64)
    full_term = parts.pe.score_bias(q, k, pos, pos, 1)
    q_pos, rows = pos[n_cached:], slice(n_cached, None)
    torch.testing.assert_close(
        parts.pe.score_bias(q[..., rows, :], k, q_pos, pos, 1),
        full_term[..., rows, :],
        rtol=0,
        atol=1e-12,
    )
    mask = attention_mask(q_pos, pos, None, causal=True)
    for fast in (True, False):
        full = attend(parts, 1, x, q, k, v, pos, pos, full_mask, Compute(fast=fast))
        step = attend(
            parts, 1, x[:, rows], q[..., rows, :], k, v, q_pos, pos, mask, Compute(fast=fast)
        )
        torch.testing.assert_close(step, full[..., rows, :])


def formula_layer_output(attention: Attention, table: torch.Tensor, x: torch.Tensor):
    """A causal multi-head layer with CoPE, from its weights, query by query in float64."""
    h, d = SHAPE.n_heads, SHAPE.head_dim
    qkv = x @ attention.qkv_proj.weight.t() + attention.qkv_proj.bias
    q, k, v = (t.unflatten(-1, (h, -1)) for t in qkv.split(h * d, -1))  # [B, L, H, d]
    out = torch.zeros(x.shape[0], x.shape[1], h, SHAPE.value_dim, dtype=torch.float64)
    for b in range(x.shape[0]):
        for m in range(h):
            for i in range(x.shape[1]):
                gates = [
                    torch.sigmoid(q[b, i, m] @ k[b, t, m] / math.sqrt(d)) for t in range(i + 1)
                ]
                scores = []
                for j in range(i + 1):
                    p = min(sum(gates[j:]), table.shape[0] - 1)
                    f = p - math.floor(p)
                    e = (1 - f) * table[math.floor(p)] + f * table[math.ceil(p)]
                    scores.append(q[b, i, m] @ (k[b, j, m] + e) / math.sqrt(d))
                weights = torch.softmax(torch.stack(scores), 0)
                out[b, i, m] = sum(w * v[b, j, m] for j, w in enumerate(weights))
    return attention.out_proj(out.flatten(-2))


@pytest.mark.parametrize("fast", [True, False])
def test_a_causal_layer_computes_the_papers_attention(fast):
    parts = cope(max_pos=3)
    torch.manual_seed(1)
    attention = Attention(CAUSAL, 1, True, True, init_std=0.5, compute=Compute(fast=fast)).double()
    x = torch.randn(2, LENGTH, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(LENGTH)
    out = attention(x, parts, pos, pos, attention_mask(pos, pos, None, causal=True))
    with torch.no_grad():
        expected = formula_layer_output(attention, parts.pe.tables[1], x)
    torch.testing.assert_close(out, expected)


def test_gradients_reach_the_gates_through_the_interpolation_weight():
    pe = cope(max_pos=16).pe
    q, k, _ = random_qkv(length=4)
    pos = torch.arange(4)
    q, k = q[:1, :1].requires_grad_(), k[:1, :1].requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k: pe.score_bias(q, k, pos, pos, 0), (q, k))
    (k_grad,) = torch.autograd.grad(pe.score_bias(q, k, pos, pos, 0).sum(), k)
    assert k_grad.abs().sum() > 0  # the term reads k only through the gates


@pytest.mark.parametrize(
    "synthesizer,block", [("dot", "standard"), ("random", "standard"), ("mixture", "gau")]
)
def test_a_decoder_lm_is_causal_and_decodes_the_same_with_the_cache(synthesizer, block):
    """With synthesizers with and without q·k (those without still get q and k for the
    gates; every synthesizer runs in tests/test_combinations.py's causal tagger): later
    tokens change no earlier logits, and one token at a time with the cache gives the full
    pass. The combination tests reach cached decoding through an encoder-decoder only,
    whose bidirectional encoder CoPE refuses."""
    torch.manual_seed(0)
    blocks = {"standard": (Standard(), 2), "gau": (build(variant("block", "gau", "qk_dim=8")), 1)}
    kind, heads = blocks[block]
    cfg = ModelConfig(
        kind, d_model=16, n_heads=heads, n_layers=2, d_ff=32, dropout=0.0, init_std=0.2
    )
    spec = AttentionConfig(
        {**COPE, "max_pos": 3},
        small_variant("norm", "softmax"),
        small_variant("synthesizer", synthesizer),
    )
    net = DecoderLM(cfg, spec, 11).double().eval()
    with torch.no_grad():
        for table in net.stack.parts.pe.tables:
            table.normal_()
        tokens = torch.randint(1, 11, (2, 9), generator=torch.Generator().manual_seed(0))
        full = net(tokens)
        changed = tokens.clone()
        changed[:, 5:] = changed[:, 5:] % 10 + 1
        torch.testing.assert_close(net(changed)[:, :5], full[:, :5])
        cache = net.new_cache()
        steps = [net(tokens[:, t : t + 1], cache) for t in range(tokens.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize(
    "shape",
    [replace(SHAPE, causal=False), replace(SHAPE, causal=False, cross=True)],
    ids=["bidirectional", "cross-attention"],
)
def test_non_causal_stacks_and_cross_attention_are_refused(shape):
    with pytest.raises(ConfigError, match="CoPE works in causal self-attention only"):
        make_parts("cope", shape=shape)


def test_a_max_pos_below_one_is_refused():
    with pytest.raises(ConfigError, match=r"pe.max_pos=0 must be at least 1"):
        make_parts({**COPE, "max_pos": 0}, shape=CAUSAL)


def test_tables_start_at_zero_one_per_layer_shared_by_heads():
    pe = make_parts("cope", shape=CAUSAL).pe
    assert [tuple(t.shape) for t in pe.tables] == [(17, SHAPE.head_dim)] * SHAPE.n_layers
    assert all(not t.any() for t in pe.tables)
