"""Permutation symmetries of attention, measured: `python -m attnlab.studies.permutation`.

Attention without positions treats its keys as a set. For one layer with output
o_i = Σ_j w(s_i·)_j v_j, s_ij = q_i·k_j/√d (Vaswani et al. 2017):

- keys: permuting keys and values together leaves every o_i unchanged, whatever the
  normalizer, since each normalizer acts on a row's scores as a set;
- queries: permuting the queries permutes the outputs (each row depends on its query alone);
- stack: a whole encoder without PE is permutation equivariant, since LayerNorm, the FFN
  and the residuals act per token;
- query bias: q_i + b adds b·k_j/√d to the score of key j in every row, a term that differs
  from key to key, so it changes the weights under every normalizer (the claim's "the query
  bias has no effect" does not hold); only a synthesizer that reads no query ignores it;
- key bias: k_j + b adds q_i·b/√d to every score of row i, a per-row shift. Normalizers
  invariant to it (softmax, and exp-L2, whose row norm absorbs e^shift) ignore it, and its
  gradient is exactly zero; relu², sigmoid, exp and L2 of SiLU change with it;
- value bias: v_j + b adds (Σ_j w_ij)·b to o_i, the constant b only where rows sum to 1
  (softmax).

A causal mask, a PE acting inside attention (rotate, score terms, reweighting, value terms)
and a synthesizer whose logits are indexed by key position (random, dense, factorized,
their mixtures) break the key symmetry; position-indexed rows (random) and the PEs break
the query symmetry; an absolute PE added to the input breaks the stack's. Each property is
measured in float64 on random inputs as the largest absolute deviation; below 1e-10 it
holds. The prediction comes from the variants' declared capabilities (and, for synthesizers,
whether a row's logits come from its own query token alone), never from the measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from attnlab.attention.core import AttentionParts, Compute, attend
from attnlab.config.groups import VARIANTS
from attnlab.config.options import causal_only, options, shrink, variant
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import Stack, attention_mask
from attnlab.shape import StackShape

EXACT = 1e-10  # float64 deviations below this are rounding: the property holds
LENGTH, BATCH = 8, 2
SHAPE = StackShape(d_model=16, n_heads=2, head_dim=8, value_dim=8, n_layers=2, causal=False)
PROPERTIES = ("keys", "queries", "stack", "query bias", "key bias", "value bias")


def configurations() -> list[tuple[str, dict[str, str], bool]]:
    """(label, choice of pe/norm/synthesizer, causal): each changes one thing from
    none/softmax/dot, bidirectional (a pe or norm defined for causal stacks only: causal)."""
    base = {"pe": "none", "norm": "softmax", "synthesizer": "dot"}
    rows = [
        (f"norm={n}", {**base, "norm": n}, bool(causal_only(n, "norm"))) for n in options("norm")
    ]
    rows.append(("causal mask", base, True))
    rows += [
        (f"pe={p}", {**base, "pe": p}, bool(causal_only(p))) for p in options("pe") if p != "none"
    ]
    rows += [
        (f"synthesizer={s}", {**base, "synthesizer": s}, False)
        for s in options("synthesizer")
        if s != "dot"
    ]
    return rows


def build_parts(choice: dict[str, str], causal: bool) -> AttentionParts:
    """The parts in float64, their parameters moved off their initial values (URPE starts
    at C = 1, which changes nothing)."""
    torch.manual_seed(0)
    shape = replace(SHAPE, causal=causal)
    nodes = [shrink(variant(group, choice[group]), LENGTH) for group in VARIANTS]
    parts = AttentionParts.from_config(*nodes, shape).double()
    with torch.no_grad():
        for parameter in parts.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    return parts


def random_inputs(seed: int = 1) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    h, d = SHAPE.n_heads, SHAPE.head_dim
    draw = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = draw(BATCH, LENGTH, SHAPE.d_model)
    return x, draw(BATCH, h, LENGTH, d), draw(BATCH, h, LENGTH, d), draw(BATCH, h, LENGTH, d)


def layer(parts: AttentionParts, causal: bool, x, q, k, v) -> Tensor:
    """One attention layer after the projections: q and k rotated at their slots' positions
    (RoPE), then scores, weights and output."""
    pos = torch.arange(LENGTH)
    mask = attention_mask(pos, pos, None, causal)
    q, k = parts.pe.rotate(q, pos), parts.pe.rotate_key(k, pos)
    return attend(parts, 1, x, q, k, v, pos, pos, mask, Compute(fast=False))


def deviation(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


def measure(choice: dict[str, str], causal: bool) -> dict[str, float | None]:
    """The largest deviation from each property; the bias properties only without a PE,
    the setting of their claim."""
    parts = build_parts(choice, causal)
    x, q, k, v = random_inputs()
    perm = torch.randperm(LENGTH, generator=torch.Generator().manual_seed(2))
    out = layer(parts, causal, x, q, k, v)
    keys = layer(parts, causal, x, q, k[:, :, perm], v[:, :, perm])
    queries = layer(parts, causal, x[:, perm], q[:, :, perm], k, v)
    symmetries = {
        "keys": deviation(keys, out),
        "queries": deviation(queries, out[:, :, perm]),
        "stack": stack_deviation(choice, causal, perm),
    }
    if choice["pe"] != "none":
        return {**symmetries, "query bias": None, "key bias": None, "value bias": None}
    return {**symmetries, **bias_deviations(parts, causal, x, q, k, v, out)}


def bias_deviations(parts: AttentionParts, causal: bool, x, q, k, v, out) -> dict[str, float]:
    """Query and key bias: the change of the output and the largest gradient of the bias.
    Value bias: the distance from out + b."""
    query_biased, query_gradient = biased(lambda b: layer(parts, causal, x, q + b, k, v))
    key_biased, key_gradient = biased(lambda b: layer(parts, causal, x, q, k + b, v))
    b_v = torch.randn(1, SHAPE.n_heads, 1, SHAPE.head_dim, dtype=torch.float64)
    value_biased = layer(parts, causal, x, q, k, v + b_v)
    return {
        "query bias": max(deviation(query_biased, out), query_gradient),
        "key bias": max(deviation(key_biased, out), key_gradient),
        "value bias": deviation(value_biased, out + b_v),
    }


def biased(attend_with: Callable[[Tensor], Tensor]) -> tuple[Tensor, float]:
    """The output with a random per-head bias `b`, and the largest gradient of b (0 where
    nothing reaches the output from b)."""
    b = torch.randn(1, SHAPE.n_heads, 1, SHAPE.head_dim, dtype=torch.float64, requires_grad=True)
    out = attend_with(b)
    gradient = None
    if out.requires_grad:  # else nothing trainable, b included, reaches the output
        (gradient,) = torch.autograd.grad(out.square().sum(), b, allow_unused=True)
    return out, 0.0 if gradient is None else gradient.abs().max().item()


def stack_deviation(choice: dict[str, str], causal: bool, perm: Tensor) -> float:
    """How far a 2-layer stack (pre-LN, FFN) is from permutation equivariance."""
    torch.manual_seed(0)
    attention = AttentionConfig(*(shrink(variant(g, choice[g]), LENGTH) for g in VARIANTS))
    cfg = ModelConfig(Standard(), d_model=SHAPE.d_model, n_heads=SHAPE.n_heads, n_layers=2,
                      d_ff=32, dropout=0.0, init_std=0.3)  # fmt: skip
    stack = Stack(cfg, attention, cfg.n_layers, causal=causal).double().eval()
    x = random_inputs(3)[0]
    return deviation(stack(x[:, perm], None), stack(x, None)[:, perm])


def predict(choice: dict[str, str], causal: bool) -> dict[str, bool]:
    """Whether each property should hold, from what the variants declare they do."""
    parts = build_parts(choice, causal)
    pe, synthesizer, norm = parts.pe, parts.synthesizer, parts.norm  # bias claims: without a PE
    position_free = not causal and not pe.acts_in_attention and not norm.reads_order
    reads_no_position = not (synthesizer.key_positions or synthesizer.query_positions)
    return {
        "keys": position_free and not synthesizer.key_positions,
        "queries": position_free and not synthesizer.query_positions,
        "stack": position_free and not pe.embeds and reads_no_position,
        "query bias": not synthesizer.needs_query,
        "key bias": not synthesizer.needs_key or norm.shift_invariant,
        "value bias": norm.rows_sum_to_one,
    }


Row = tuple[str, dict[str, float | None], dict[str, bool]]


def study() -> list[Row]:
    return [
        (label, measure(choice, causal), predict(choice, causal))
        for label, choice, causal in configurations()
    ]


def cell(measured: float | None, predicted: bool) -> str:
    if measured is None:
        return "—"
    holds = measured < EXACT
    text = f"{'holds' if holds else 'breaks'} ({measured:.0e})"
    return (
        text
        if holds == predicted
        else f"**{text}, predicted {'holds' if predicted else 'breaks'}**"
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| configuration | " + " | ".join(PROPERTIES) + " |",
        "|---" * (1 + len(PROPERTIES)) + "|",
    ]
    for label, measured, predicted in rows:
        cells = [cell(measured[p], predicted[p]) for p in PROPERTIES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(study()))
