"""The gated attention unit against its definition (Hua et al. 2022, arXiv 2202.10447)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config.options import variant
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.gau import GAU
from attnlab.model.transformer import Stack


@pytest.mark.parametrize("causal", [False, True])
def test_a_gau_block_computes_u_times_attention_of_v_with_shared_z(causal):
    torch.manual_seed(0)
    gau = GAU(qk_dim=8, expansion=2)  # s = 8, e = 2d
    cfg = ModelConfig(d_model=16, n_heads=1, n_layers=1, block=gau, dropout=0.0, init_std=0.3)
    spec = AttentionConfig(
        variant("pe", "none"), variant("norm", "relu2"), variant("synthesizer", "dot")
    )
    stack = Stack(cfg, spec, 1, causal=causal).double().eval()
    block = stack.blocks[0]
    unit = block.unit
    x = torch.randn(2, 5, 16, dtype=torch.float64)

    h = F.layer_norm(x, (16,), block.norm.weight, block.norm.bias, cfg.layer_norm_eps)
    u, v = F.silu(h @ unit.uv.weight.T + unit.uv.bias).chunk(2, -1)  # [B, L, e] each, e = 2d
    z = F.silu(h @ unit.z.weight.T + unit.z.bias)  # one Z for queries and keys
    q = z * unit.gamma["q"] + unit.beta["q"]
    k = z * unit.gamma["k"] + unit.beta["k"]
    scores = q @ k.transpose(-2, -1) / 8**0.5
    visible = (
        torch.ones(5, 5, dtype=torch.bool).tril() if causal else torch.ones(5, 5, dtype=torch.bool)
    )
    weights = F.relu(scores).square() * visible / visible.sum(-1, keepdim=True)  # relu²/n
    out = x + (u * (weights @ v)) @ unit.out.weight.T + unit.out.bias
    expected = stack.final_norm(out)

    assert u.shape[-1] == 2 * cfg.d_model and not hasattr(block, "ff_in"), "no FFN in a GAU"
    torch.testing.assert_close(stack(x), expected)


def test_model_gau_selects_the_relu2_normalizer_unless_told_otherwise(make_config):
    assert make_config(["model=gau"]).norm.name == "relu2"
    assert make_config(["model=gau", "norm=softmax"]).norm.name == "softmax"
