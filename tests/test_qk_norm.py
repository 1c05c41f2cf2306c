"""model.qk_norm: each head's q and k RMS-normalized with a learned scale per head and
dimension before the PE, against the formula in float64, in self- and cross-attention, in
cached decoding, and refused with block=gau."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, compose_config, decoded_one_at_a_time, make_parts
from test_combinations import attention, tiny, tokens

from attnlab.attention.layer import Attention
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture
from attnlab.model.transformer import DecoderLM, EncoderDecoder
from attnlab.tensors import split_heads

CAUSAL = replace(SHAPE, causal=True)
EPS = 1e-5


def normed_layer() -> Attention:
    torch.manual_seed(0)
    attn = Attention(CAUSAL, 0, True, True, init_std=0.5, qk_norm=True, norm_eps=EPS).double()
    with torch.no_grad():  # scales off their initial ones, so that a missing scale shows
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(0.5, 2.0)
    return attn


def rms_normed(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, d] / √(mean over d of x² + ε) · scale [H, 1, d], element by element."""
    out = torch.empty_like(x)
    for b, h, i in torch.cartesian_prod(*(torch.arange(n) for n in x.shape[:3])).tolist():
        row = x[b, h, i]
        out[b, h, i] = row / math.sqrt(float((row**2).mean().detach()) + EPS) * scale[h, 0]
    return out


@pytest.mark.parametrize("pe", ["none", "rope"])
def test_scores_are_those_of_the_normalized_heads(pe):
    attn, parts = normed_layer(), make_parts(pe, shape=CAUSAL).double()
    x = torch.randn(2, 6, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(6)
    q, k, _ = (split_heads(t, SHAPE.n_heads) for t in attn.qkv_proj(x).split(SHAPE.d_model, -1))
    expected_q = parts.pe.rotate(rms_normed(q, attn.q_norm.weight), pos)
    expected_k = parts.pe.rotate_key(rms_normed(k, attn.k_norm.weight), pos)
    got = attn.project(x, parts, pos, pos)
    torch.testing.assert_close(got.q, expected_q)
    torch.testing.assert_close(got.k, expected_k)


def test_the_scales_learn_and_cached_decoding_is_the_full_pass():
    torch.manual_seed(0)
    model = DecoderLM(tiny(qk_norm=True, init_std=0.3), attention("rope", "softmax", "dot"), 11)
    model = model.double().eval()
    x = tokens()
    torch.testing.assert_close(decoded_one_at_a_time(model, x), model(x))
    model.train()
    model(x).logsumexp(-1).mean().backward()
    norms = [m for m in model.modules() if isinstance(m, Attention)]
    assert all(a.q_norm.weight.grad.abs().sum() > 0 for a in norms)
    assert all(a.k_norm.weight.grad.abs().sum() > 0 for a in norms)


def test_cross_attention_normalizes_its_heads_too():
    torch.manual_seed(0)
    model = EncoderDecoder(tiny(qk_norm=True), attention("none", "softmax", "dot"), 11, 11)
    crosses = [m for m in model.decoder.modules() if isinstance(m, Attention) and m.cross]
    assert crosses and all(a.q_norm is not None and a.k_norm is not None for a in crosses)


def test_off_by_default_and_refused_with_gau(tmp_path):
    cfg = compose_config(["task.causal=true"], tmp_path)
    assert Architecture.from_config(cfg).model.qk_norm is False
    with pytest.raises(ConfigError, match="block=gau scales its one shared q and k"):
        cfg = compose_config(["block=gau", "model.qk_norm=true"], tmp_path / "gau")
        DecoderLM(
            Architecture.from_config(cfg).model,
            attention("none", "softmax", "dot"),
            11,
        )
