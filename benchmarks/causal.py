"""Speed of the causal stack: attnlab's decoder-only LM against torch.nn.TransformerEncoder.

    python benchmarks/causal.py             # both sizes, eager and compiled -> BENCHMARKS.md
    python benchmarks/causal.py --smoke     # tiny and eager only, no writing

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

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import documented, machine, report

from attnlab.model.config import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import DecoderLM
from attnlab.options import variant

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


def attnlab_lm(cfg: ModelConfig, context: int) -> DecoderLM:
    attention = AttentionConfig(
        variant("pe", "learned", f"max_len={context}"),
        variant("norm", "softmax"),
        variant("synthesizer", "dot"),
    )
    return DecoderLM(cfg, attention, VOCAB)


def train_step(net: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """Seconds of one training step on `batch`."""
    start = time.perf_counter()
    logits = net(batch[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def race(size: Size, compiled: bool, steps: int, rounds: int) -> dict[str, float | str]:
    """Tokens/s of both networks over alternating rounds, and their per-round ratios."""
    torch.manual_seed(0)
    nets = {
        "attnlab": attnlab_lm(size.model, size.context),
        "nn": EncoderLM(size.model, size.context),
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
        torch.randint(VOCAB, (size.batch, size.context + 1), generator=g) for _ in range(steps)
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


def section(rows: list[tuple[Size, str, dict]], steps: int, rounds: int) -> str:
    lines = [
        f"| {size.name} | {mode} | {r['params']:,} | {r['attnlab']:.0f} | {r['nn']:.0f} | "
        f"**{r['median']:.3f}** ({r['range']}) |"
        for size, mode, r in rows
    ]
    table = "\n".join(lines)
    return f"""## The causal stack against nn.TransformerEncoder (`make bench-causal`)

Command: `python benchmarks/causal.py{"".join(" " + a for a in sys.argv[1:])}` on {machine()}.

attnlab's `DecoderLM` (pe=learned, softmax, dot) and `nn.TransformerEncoder` with the same
embeddings, learned positions, pre-LN blocks, final LayerNorm and tied head, called with a
causal mask and `is_causal=True`; fp32, batch {rows[0][0].batch}, random tokens of a
65-symbol vocabulary; {rounds} rounds of {steps} training steps of each, alternating step
by step (forward, backward, clipping, AdamW). Ratio: attnlab's tokens/s over the baseline's in each
round, median (range). Target: ≥ 1.15 eager at both sizes.

| size | mode | parameters | attnlab tokens/s | nn.TransformerEncoder tokens/s | ratio |
|---|---|---|---|---|---|
{table}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no writing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes, (steps, rounds) = (SMOKE, (2, 1)) if args.smoke else (SIZES, (args.steps, args.rounds))
    rows = []
    modes = ("eager",) if args.smoke else ("eager", "compiled")  # compiling takes minutes here
    for size in sizes:
        for mode in modes:
            rows.append((size, mode, race(size, mode == "compiled", steps, rounds)))
            print(f"{size.name}, {mode}: {rows[-1][2]}", flush=True)
    report("causal-speed", section(rows, steps, rounds), documented(parser, args))


if __name__ == "__main__":
    main()
