"""Every pe × norm × synthesizer under bf16 autocast, against the float64 path.

The bound: rounding the inputs and every parameter to bf16 and computing the rest exactly
(in float64) already moves the output by a relative error e_in (about 0.2% here, the unit
roundoff 2^-8 spread over many terms). bf16 autocast rounds again at each matmul's output
(q, k, v, the scores and the attention output), so its error is a small multiple of e_in;
with every normalizer computing in float32 the largest ratio measured is 2.3, and 3·e_in is
the bound asserted. Before normalizers computed in float32, sigmoid reached 3.5·e_in.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from helpers import (
    dot_replaced_in_a_mixture,
    every_combination,
    make_parts,
    refused_unless,
    small_variant,
)

from attnlab.attention.layer import Attention
from attnlab.config.options import causal_only, options
from attnlab.model.transformer import attention_mask
from attnlab.shape import StackShape

SHAPE = StackShape(d_model=32, n_heads=2, head_dim=16, value_dim=16, n_layers=2, causal=False)
LENGTH = 16
BOUND = 3.0  # times the error from rounding inputs and parameters alone


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.double() - reference).norm() / reference.norm()).item()


def rounded(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy whose parameters hold bf16 values."""
    copy_ = copy.deepcopy(module).double()
    with torch.no_grad():
        for parameter in copy_.parameters():
            parameter.copy_(parameter.to(torch.bfloat16))
    return copy_


@pytest.mark.parametrize(
    "pe,norm,synthesizer",
    every_combination(options("pe"), options("norm"), options("synthesizer")),
)
def test_bf16_autocast_is_within_a_few_input_roundings_of_float64(pe, norm, synthesizer):
    torch.manual_seed(0)
    causal = bool(causal_only(pe) or causal_only(norm, "norm"))  # bidirectional where it can be
    shape = replace(SHAPE, causal=causal)
    with refused_unless(True, pe, norm, synthesizer=synthesizer):
        parts = make_parts(
            small_variant("pe", pe), norm, small_variant("synthesizer", synthesizer), shape
        )
    if dot_replaced_in_a_mixture(pe, synthesizer):
        return  # refused, as checked above
    data = parts.pe.data_width  # a data-dependent pe's channels, projected by the layer
    attention = Attention(SHAPE, 1, parts.needs_query, parts.needs_key, data_width=data)
    x = torch.randn(3, LENGTH, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(LENGTH)
    padding = torch.zeros(3, LENGTH, dtype=torch.bool)
    padding[1, -3:] = True
    mask = attention_mask(pos, pos, padding, causal)

    exact = copy.deepcopy(attention).double()(x, copy.deepcopy(parts).double(), pos, pos, mask)
    from_rounded = rounded(attention)(x.to(torch.bfloat16).double(), rounded(parts), pos, pos, mask)
    input_error = relative_error(from_rounded, exact)

    x_float = x.float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(x_float, parts, pos, pos, mask)
    out.float().square().sum().backward()

    assert torch.isfinite(out).all()
    error = relative_error(out, exact)
    assert error <= BOUND * input_error, f"{error:.2e} > {BOUND} × {input_error:.2e}"
    grads = [p.grad for p in [*attention.parameters(), *parts.parameters(), x_float]]
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
