"""Model FLOPs utilization (MFU; Chowdhery et al. 2022, PaLM, Appendix B): the FLOPs a
training step needs by the model's shape, over what the device could do in its time.

A token of training costs 6N + 12·L·d·T FLOPs: N the parameters that multiply activations
(every parameter but lookup tables: a position table, or a token table not tied to the output
projection), forward 2N and backward 4N; and attention's scores and weighted values, 12·L·d·T
for L layers of width d over a context of T (counted in full even where a causal mask skips
half, as PaLM and nanoGPT count); an encoder-decoder counts its cross-attention layers too. The peak is the
device's dense bf16 tensor rate from its maker's data sheet; a device not in the table (a CPU)
has no MFU.
"""

from __future__ import annotations

from torch import nn

from attnlab.attention.layer import Attention

# (a part of torch.cuda.get_device_name(), dense bf16 FLOP/s), most specific first
PEAK_BF16 = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989.4e12),  # SXM
    ("H200", 989.4e12),
    ("GH200", 989.4e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
)


def peak_flops(device_name: str) -> float | None:
    return next((peak for part, peak in PEAK_BF16 if part in device_name), None)


def multiplying_parameters(model: nn.Module) -> int:
    """Parameters held by some module other than an nn.Embedding (shared ones once)."""
    held = {
        id(p): p.numel()
        for module in model.modules()
        if not isinstance(module, nn.Embedding)
        for p in module.parameters(recurse=False)
    }
    return sum(held.values())


def flops_per_token(model: nn.Module, d_model: int, context: int) -> float:
    """Training FLOPs of one token (the module docstring): L counts the model's attention
    layers, self- and cross-attention alike."""
    layers = sum(isinstance(module, Attention) for module in model.modules())
    return 6 * multiplying_parameters(model) + 12 * layers * d_model * context
