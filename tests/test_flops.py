"""MFU's FLOPs per token against nanoGPT's count for the same GPT (6N + 12·L·H·Q·T, N without
the position table), and the peak table."""

from __future__ import annotations

import pytest

from attnlab.flops import flops_per_token, multiplying_parameters, peak_flops
from attnlab.model.architecture import Architecture
from attnlab.model.transformer import DecoderLM


@pytest.mark.parametrize("pe", ["learned", "rope"])
def test_flops_per_token_is_nanogpts_count_for_a_gpt(make_config, pe):
    overrides = ["experiment=lm_shakespeare_char", f"pe={pe}", "task.data.file=/dev/null"]
    if pe != "learned":
        overrides.append("~pe.max_len")
    cfg = make_config(overrides)
    arch = Architecture.from_config(cfg)
    net = DecoderLM(arch.model, arch.attention, 65)
    every = sum(p.numel() for p in net.parameters())
    position_table = 64 * 128 if pe == "learned" else 0  # nanoGPT's N leaves out wpe alone
    n = every - position_table
    assert multiplying_parameters(net) == n
    assert flops_per_token(net, 128, 64) == 6 * n + 12 * 4 * 128 * 64


def test_the_peak_of_a_device_is_its_most_specific_entry():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989.4e12
    assert peak_flops("Intel(R) Xeon(R) Processor") is None
