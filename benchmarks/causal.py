"""Speed of the causal stack: attnlab's decoder-only LM against torch.nn.TransformerEncoder.

    python benchmarks/causal.py             # both sizes, eager and compiled -> BENCHMARKS.md
    python benchmarks/causal.py --smoke     # tiny and eager only, no writing
    python benchmarks/causal.py --device cuda   # on a GPU: bf16, and the FlashAttention check

Both networks: token embeddings, learned positions added to them, N pre-LN blocks (GELU
feed-forward, no dropout), a final LayerNorm and the output head tied to the embeddings.
attnlab's is `DecoderLM` with pe=learned, norm=softmax, synthesizer=dot; the baseline's
blocks are `nn.TransformerEncoderLayer(norm_first=True, batch_first=True)` called with a
causal mask and `is_causal=True`. Biases as the size says, in both (equal parameter counts
are checked). Sizes: nanoGPT's Shakespeare configuration (4 layers, 4 heads, width 128,
context 64, batch 12, no biases) and model=small (3 layers, 4 heads, width 256, FFN 1024,
biases) at a 256-token context, batch 12.

Both train (forward, cross-entropy, backward, gradient clipping at 1.0, AdamW) on the same
pre-drawn windows of random tokens (a 65-symbol vocabulary, as Tiny Shakespeare's
characters; speed does not depend on which tokens) in one process, alternating step by
step: each round is `--steps` steps of each, and its ratio is attnlab's tokens/s over the
baseline's.
Reported: each network's tokens/s over all rounds and the median ratio with its range.
Compiled: both networks through `torch.compile` (as model.compile=true does to attnlab's),
after untimed steps that compile them. One torch thread by default (`--threads`): on 2 cores
a second thread waits on any other process.

On CUDA (`--device cuda`): the same race under bf16 autocast, each step synchronized, in its
own section; and first a check that the causal stack with pe none, learned, sinusoidal and
rope runs on SDPA's FlashAttention backend (every other backend disabled with
`torch.nn.attention.sdpa_kernel`), forward and backward, its loss against the math
backend's. pe=alibi, whose bias reaches SDPA as a tensor, is the control that must be
refused there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import documented, machine, report

from attnlab.config.options import variant
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import DecoderLM

VOCAB = 65  # Tiny Shakespeare's characters


@dataclass(frozen=True)
class Size:
    name: str
    model: ModelConfig
    context: int
    batch: int


def model(d: int, layers: int, d_ff: int, biases: bool) -> ModelConfig:
    return ModelConfig(
        Standard(), d_model=d, n_heads=4, n_layers=layers, d_ff=d_ff, dropout=0.0,
        qkv_bias=biases, bias=biases, embed_scale=False,
    )  # fmt: skip


SIZES = [
    Size(
        "nanoGPT Shakespeare (4 layers, width 128, context 64)", model(128, 4, 512, False), 64, 12
    ),
    Size("model=small (3 layers, width 256, context 256)", model(256, 3, 1024, True), 256, 12),
]
SMOKE = [Size("tiny (1 layer, width 32, context 16)", model(32, 1, 64, False), 16, 2)]


class EncoderLM(nn.Module):
    """The baseline: the same embeddings, positions and tied head around nn.TransformerEncoder."""

    def __init__(self, cfg: ModelConfig, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, cfg.d_model)
        self.positions = nn.Parameter(torch.randn(context, cfg.d_model) * cfg.init_std)
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_heads, cfg.d_ff, 0.0, activation="gelu", batch_first=True,
            norm_first=True, bias=cfg.bias,
        )  # fmt: skip
        final = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, final, enable_nested_tensor=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.positions[:length]
        hidden = self.encoder(x, self.mask[:length, :length], is_causal=True)
        return hidden @ self.embed.weight.t()


def attnlab_lm(cfg: ModelConfig, context: int, pe: str = "learned") -> DecoderLM:
    overrides = (f"max_len={context}",) if pe == "learned" else ()
    attention = AttentionConfig(
        variant("pe", pe, *overrides),
        variant("norm", "softmax"),
        variant("synthesizer", "dot"),
    )
    return DecoderLM(cfg, attention, VOCAB)


def lm_loss(net: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, under bf16 autocast on CUDA (fp32 on the CPU)."""
    cuda = batch.device.type == "cuda"
    with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=cuda):
        logits = net(batch[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def train_step(net: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """Seconds of one training step on `batch` (synchronized on CUDA)."""
    start = time.perf_counter()
    lm_loss(net, batch).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if batch.device.type == "cuda":
        torch.cuda.synchronize(batch.device)
    return time.perf_counter() - start


def race(
    size: Size, compiled: bool, steps: int, rounds: int, device: torch.device
) -> dict[str, float | str]:
    """Tokens/s of both networks over alternating rounds, and their per-round ratios."""
    torch.manual_seed(0)
    nets = {
        "attnlab": attnlab_lm(size.model, size.context).to(device),
        "nn": EncoderLM(size.model, size.context).to(device),
    }
    counts = {name: sum(p.numel() for p in net.parameters()) for name, net in nets.items()}
    if counts["attnlab"] != counts["nn"]:
        raise SystemExit(f"the two networks differ in size: {counts}")
    optimizers = {
        name: torch.optim.AdamW(net.parameters(), 1e-3, betas=(0.9, 0.99), weight_decay=0.1)
        for name, net in nets.items()
    }
    runners = {name: torch.compile(net) if compiled else net for name, net in nets.items()}
    g = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(VOCAB, (size.batch, size.context + 1), generator=g).to(device)
        for _ in range(steps)
    ]
    for name, net in runners.items():  # untimed: compiles, and warms the allocator
        for batch in batches[:2]:
            train_step(net, optimizers[name], batch)
    seconds = {name: 0.0 for name in nets}
    ratios = []
    for _ in range(rounds):
        took = dict.fromkeys(nets, 0.0)
        for batch in batches:  # step by step: a change in the machine's speed hits both alike
            for name, net in runners.items():
                took[name] += train_step(net, optimizers[name], batch)
        ratios.append(took["nn"] / took["attnlab"])
        for name in nets:
            seconds[name] += took[name]
    tokens = rounds * steps * size.batch * size.context
    return {
        "attnlab": tokens / seconds["attnlab"],
        "nn": tokens / seconds["nn"],
        "median": statistics.median(ratios),
        "range": f"{min(ratios):.2f}-{max(ratios):.2f}",
        "params": counts["attnlab"],
    }


def flash_check(size: Size, device: torch.device) -> str:
    """Table: whether each pe's causal stack trains on the FlashAttention backend alone, and
    its loss there against the math backend's (same weights, same batch)."""
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(VOCAB, (size.batch, size.context + 1), generator=g).to(device)
    lines = ["| pe | FlashAttention only: forward + backward | loss (flash) | loss (math) |",
             "|---|---|---|---|"]  # fmt: skip
    for pe in ("none", "learned", "sinusoidal", "rope", "alibi"):
        torch.manual_seed(0)
        net = attnlab_lm(size.model, size.context, pe).to(device)
        losses = []
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
            try:
                with sdpa_kernel(backend):
                    loss = lm_loss(net, batch)
                    loss.backward()
                losses.append(f"{loss.item():.4f}")
            except RuntimeError as error:
                losses.append("refused: " + str(error).strip().splitlines()[0][:80])
        ran = "runs" if not losses[0].startswith("refused") else "refused"
        lines.append(f"| {pe} | {ran} | {losses[0]} | {losses[1]} |")
    return "\n".join(lines)


def section(
    rows: list[tuple[Size, str, dict]], steps: int, rounds: int, device: torch.device
) -> str:
    lines = [
        f"| {size.name} | {mode} | {r['params']:,} | {r['attnlab']:.0f} | {r['nn']:.0f} | "
        f"**{r['median']:.3f}** ({r['range']}) |"
        for size, mode, r in rows
    ]
    table = "\n".join(lines)
    cuda = device.type == "cuda"
    where = (
        f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}" if cuda else machine()
    )
    precision = "bf16 autocast, each step synchronized" if cuda else "fp32"
    target = "No target on a GPU (the issue's targets are this CPU's)." if cuda else (
        "Target: ≥ 1.15 eager at both sizes.")  # fmt: skip
    return f"""## The causal stack against nn.TransformerEncoder{" on a GPU" if cuda else ""} (`make bench-causal`)

Command: `python benchmarks/causal.py{"".join(" " + a for a in sys.argv[1:])}` on {where}.

attnlab's `DecoderLM` (pe=learned, softmax, dot) and `nn.TransformerEncoder` with the same
embeddings, learned positions, pre-LN blocks, final LayerNorm and tied head, called with a
causal mask and `is_causal=True`; {precision}, batch {rows[0][0].batch}, random tokens of a
65-symbol vocabulary; {rounds} rounds of {steps} training steps of each, alternating step
by step (forward, backward, clipping, AdamW). Ratio: attnlab's tokens/s over the baseline's in each
round, median (range). {target}

| size | mode | parameters | attnlab tokens/s | nn.TransformerEncoder tokens/s | ratio |
|---|---|---|---|---|---|
{table}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no writing")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda needs a CUDA GPU; leave it out to measure on the CPU")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes, (steps, rounds) = (SMOKE, (2, 1)) if args.smoke else (SIZES, (args.steps, args.rounds))
    flash = ""
    if device.type == "cuda":
        flash = flash_check(sizes[0], device)
        print(flash, flush=True)
    rows = []
    modes = ("eager",) if args.smoke else ("eager", "compiled")  # compiling takes minutes here
    for size in sizes:
        for mode in modes:
            rows.append((size, mode, race(size, mode == "compiled", steps, rounds, device)))
            print(f"{size.name}, {mode}: {rows[-1][2]}", flush=True)
    body = section(rows, steps, rounds, device)
    if flash:
        body += f"""
### The causal path on FlashAttention

pe none, learned, sinusoidal and rope at the first size, with SDPA restricted to one backend
(`torch.nn.attention.sdpa_kernel`), one training step's forward and backward under bf16
autocast; the loss on the same weights and batch with the math backend beside it. alibi is
the control: its bias reaches SDPA as a tensor, which FlashAttention refuses.

{flash}
"""
    name = "causal-speed" if device.type == "cpu" else "causal-speed-cuda"
    report(name, body, documented(parser, args, free=("device",)))


if __name__ == "__main__":
    main()
