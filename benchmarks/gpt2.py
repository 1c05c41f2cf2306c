"""GPT-2 small's training step: attnlab's causal stack against nanoGPT's GPT, one process.

    python benchmarks/gpt2.py            # on a CUDA GPU -> BENCHMARKS.md
    python benchmarks/gpt2.py --smoke    # tiny, on the CPU, writes nothing

nanoGPT's model.py is imported from ../shared/peers/nanogpt when the script runs (never
copied into the project; without it, its row says so). Both models at GPT-2 small as
experiment=lm_gpt2_small composes it (12 layers, 12 heads, width 768, context 1,024,
vocabulary 50,304, no biases, no dropout, tied embeddings, learned positions): training steps
(forward, backward, clipping at 1.0, fused AdamW with lr 6e-4, betas (0.9, 0.95), weight
decay 0.1) on batches of 12 windows of random tokens, under bf16 autocast and torch.compile,
timed alternately in `--rounds` rounds of `--steps` steps each: the median tokens/s, and MFU
(attnlab.flops: 6N + 12·layers·width·context FLOPs per token, over the card's dense bf16
peak). attnlab also with pe=rope, alibi and t5 at the same shape. `--smoke`: width 64,
2 layers, context 64, uncompiled, float32, on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, documented, report

from attnlab.flops import flops_per_token, peak_flops
from attnlab.model.architecture import Architecture
from attnlab.model.transformer import DecoderLM
from attnlab.runner.job import compose_run, job_config
from attnlab.runner.run import architecture_nodes

NANOGPT = ROOT.parent / "shared" / "peers" / "nanogpt"
VOCAB = 50304
SMOKE_MODEL = [
    "model.d_model=64", "model.n_heads=2", "model.n_layers=2", "model.d_ff=256",
    "pe.max_len=64",
]  # fmt: skip
PES = {"learned": [], "rope": ["~pe.max_len"], "alibi": ["~pe.max_len"], "t5": ["~pe.max_len"]}


def attnlab_model(pe: str, smoke: bool) -> tuple[torch.nn.Module, Architecture]:
    overrides = ["experiment=lm_gpt2_small", f"pe={pe}", *PES[pe]]
    if smoke:
        overrides += [o for o in SMOKE_MODEL if pe == "learned" or "max_len" not in o]
    arch = Architecture.from_config(architecture_nodes(job_config(compose_run("train", overrides))))
    return DecoderLM(arch.model, arch.attention, VOCAB), arch


def nanogpt_model(arch: Architecture, context: int) -> torch.nn.Module | None:
    if not (NANOGPT / "model.py").is_file():
        return None
    sys.path.insert(0, str(NANOGPT))
    from model import GPT, GPTConfig  # nanoGPT's, unmodified

    m = arch.model
    config = GPTConfig(
        block_size=context, vocab_size=VOCAB, n_layer=m.n_layers, n_head=m.n_heads,
        n_embd=m.d_model, dropout=0.0, bias=False,
    )  # fmt: skip
    return GPT(config)


def attnlab_loss(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(net(x).float().flatten(0, 1), y.flatten())


def nanogpt_loss(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return net(x, y)[1]  # its own cross-entropy over every position


def step_of(model: torch.nn.Module, forward: Callable, batch: torch.Tensor, device, compiled):
    """One training step of `model` on `batch` [B, T + 1]: its loss (`forward(net, inputs,
    targets)`), backward, clipping and fused AdamW (nanoGPT's settings)."""
    net = torch.compile(model) if compiled else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(
        groups, lr=6e-4, betas=(0.9, 0.95), fused=device.type == "cuda" or None
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    inputs, targets = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # nanoGPT views them

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            loss = forward(net, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def seconds_of(step: Callable[[], None], steps: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    at_documented = documented(parser, args)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpt2.py needs a CUDA GPU (or --smoke, on the CPU)")
    device = torch.device("cuda" if not args.smoke else "cpu")
    batch, steps, rounds = (2, 2, 2) if args.smoke else (args.batch, args.steps, args.rounds)
    context = 64 if args.smoke else 1024
    tokens = torch.randint(
        0, VOCAB, (batch, context + 1), generator=torch.Generator().manual_seed(0)
    )
    tokens = tokens.to(device)
    torch.manual_seed(0)
    models: dict[str, tuple[Callable[[], None], float]] = {}
    for pe in PES:
        net, arch = attnlab_model(pe, args.smoke)
        net = net.to(device)
        flops = flops_per_token(net, arch.model.d_model, context)
        compiled = not args.smoke
        models[f"attnlab pe={pe}"] = (step_of(net, attnlab_loss, tokens, device, compiled), flops)
        peer = nanogpt_model(arch, context) if pe == "learned" else None
        if peer is not None:  # the same shape: the same FLOPs per token
            step = step_of(peer.to(device), nanogpt_loss, tokens, device, compiled)
            models["nanoGPT GPT"] = (step, flops)
    for step, _ in models.values():
        step()  # compiles, warms up
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, (step, _) in models.items():
            times[name].append(seconds_of(step, steps, device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = peak_flops(name)
    baseline = "nanoGPT GPT" if "nanoGPT GPT" in models else "attnlab pe=learned"
    rows = []
    for label, (_, flops) in models.items():
        seconds = statistics.median(times[label])
        rate = batch * context / seconds
        mfu = f"{rate * flops / peak:.1%}" if peak else "n/a (no peak for this device)"
        ratio = statistics.median(times[baseline]) / seconds
        rows.append(f"| {label} | {rate:,.0f} | {ratio:.2f}× | {mfu} |")
    absent = (
        ""
        if "nanoGPT GPT" in models
        else f"\nnanoGPT's model.py is absent ({NANOGPT}): no row for it.\n"
    )
    body = f"""## GPT-2 small's training step against nanoGPT's (`benchmarks/gpt2.py`)

{name}, torch {torch.__version__}; batch {batch} x {context} tokens, bf16 autocast, compiled,
fused AdamW; median of {rounds} alternated rounds of {steps} steps. Ratio: tokens/s over the
{baseline}'s.
{absent}
| model | tokens/s | ratio | MFU |
|---|---|---|---|
{chr(10).join(rows)}
"""
    report("gpt2", body, at_documented and not args.smoke)


if __name__ == "__main__":
    main()
