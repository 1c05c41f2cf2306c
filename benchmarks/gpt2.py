"""GPT-2 small's training step: attnlab's causal stack against nanoGPT's GPT, one process.

    python benchmarks/gpt2.py            # on a CUDA GPU -> BENCHMARKS.md (section gpt2)
    python benchmarks/gpt2.py --cpu      # nanoGPT's Shakespeare size on the CPU (gpt2-cpu)
    python benchmarks/gpt2.py --smoke    # tiny, on the CPU, writes nothing

nanoGPT's model.py is imported from ../shared/peers/nanogpt when the script runs (never
copied into the project; without it, its row says so). Both models at GPT-2 small as
experiment=lm_gpt2_small composes it (12 layers, 12 heads, width 768, context 1,024,
vocabulary 50,304, no biases, no dropout, tied embeddings, learned positions): training steps
(forward, backward, clipping at 1.0, fused AdamW with lr 6e-4, betas (0.9, 0.95), weight
decay 0.1) on batches of 12 windows of random tokens, under bf16 autocast and torch.compile,
timed alternately in `--rounds` rounds of `--steps` steps each: the median tokens/s, and MFU
(attnlab.flops: 6N + 12·layers·width·context FLOPs per token, over the card's dense bf16
peak). attnlab also with pe=rope, alibi and t5 at the same shape. Then trainer=fsdp: the
same model trained by train.py for a few steps on a generated corpus, sharded (one GPU) and
not, from the same seed: both validation losses and step rates.

`--cpu`: the same race at nanoGPT's Shakespeare size (4 layers, 4 heads, width 128, context
64, 65 symbols), float32, eager, one thread, pe=learned. `--smoke`: width 64, 2 layers,
context 64, uncompiled, float32, on the CPU; trainer=fsdp's leg is refused there (torch's
FSDP needs a GPU), so only the unsharded one runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, documented, report
from lm_data import generate_corpus, summary_value

from attnlab.flops import flops_per_token, peak_flops
from attnlab.model.architecture import Architecture
from attnlab.model.transformer import DecoderLM
from attnlab.runner.job import compose_run, job_config

NANOGPT = ROOT.parent / "shared" / "peers" / "nanogpt"
PES = {"learned": [], "rope": ["~pe.max_len"], "alibi": ["~pe.max_len"], "t5": ["~pe.max_len"]}
QUIET = ["callbacks.progress_bar.refresh_rate=0", "extras.print_config=false"]


@dataclass(frozen=True)
class Mode:
    device: str
    shape: list[str]  # model overrides of experiment=lm_gpt2_small
    context: int
    vocab: int
    compiled: bool
    pes: tuple[str, ...]
    batch_steps_rounds: tuple[int, int, int] | None  # None: the command line's


MODES = {
    "gpu": Mode("cuda", [], 1024, 50304, True, tuple(PES), None),
    "cpu": Mode(
        "cpu",
        ["model.d_model=128", "model.n_heads=4", "model.n_layers=4", "model.d_ff=512",
         "pe.max_len=64"],
        64, 65, False, ("learned",), (12, 5, 7),
    ),
    "smoke": Mode(
        "cpu",
        ["model.d_model=64", "model.n_heads=2", "model.n_layers=2", "model.d_ff=256",
         "pe.max_len=64"],
        64, 50304, False, tuple(PES), (2, 2, 2),
    ),
}  # fmt: skip


def attnlab_model(pe: str, mode: Mode) -> tuple[torch.nn.Module, Architecture]:
    overrides = ["experiment=lm_gpt2_small", f"pe={pe}", *PES[pe]]
    overrides += [o for o in mode.shape if pe == "learned" or "max_len" not in o]
    arch = Architecture.from_config(job_config(compose_run("train", overrides)))
    return DecoderLM(arch.model, arch.attention, mode.vocab), arch


def nanogpt_model(arch: Architecture, context: int, vocab: int) -> torch.nn.Module | None:
    if not (NANOGPT / "model.py").is_file():
        return None
    sys.path.insert(0, str(NANOGPT))
    from model import GPT, GPTConfig  # nanoGPT's, unmodified

    m = arch.model
    config = GPTConfig(
        block_size=context, vocab_size=vocab, n_layer=m.n_layers, n_head=m.n_heads,
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


def race(mode: Mode, batch: int, steps: int, rounds: int) -> tuple[list[str], str]:
    """The table rows of attnlab's models and nanoGPT's, timed alternately, and the
    device's name."""
    device = torch.device(mode.device)
    tokens = torch.randint(
        0, mode.vocab, (batch, mode.context + 1), generator=torch.Generator().manual_seed(0)
    ).to(device)
    torch.manual_seed(0)
    models: dict[str, tuple[Callable[[], None], float]] = {}
    for pe in mode.pes:
        net, arch = attnlab_model(pe, mode)
        net = net.to(device)
        flops = flops_per_token(net, arch.model.d_model, mode.context)
        step = step_of(net, attnlab_loss, tokens, device, mode.compiled)
        models[f"attnlab pe={pe}"] = (step, flops)
        peer = nanogpt_model(arch, mode.context, mode.vocab) if pe == "learned" else None
        if peer is not None:  # the same shape: the same FLOPs per token
            step = step_of(peer.to(device), nanogpt_loss, tokens, device, mode.compiled)
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
        rate = batch * mode.context / statistics.median(times[label])
        mfu = f"{rate * flops / peak:.1%}" if peak else "n/a (no peak for this device)"
        ratios = [b / t for b, t in zip(times[baseline], times[label], strict=True)]
        spread = f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"
        rows.append(f"| {label} | {rate:,.0f} | {spread} | {mfu} |")
    if "nanoGPT GPT" not in models:
        rows.append(
            f"\nnanoGPT's model.py is absent ({NANOGPT}): no row for it, ratios to pe=learned."
        )
    return rows, f"{name}, torch {torch.__version__}"


def smoke_run() -> list[str]:
    """train.py overrides of the smoke shape, its windows shortened to its positions."""
    return [*MODES["smoke"].shape, "task.data.block_size=64", "task.data.batch_size=2",
            "task.data.eval_lengths=[64]"]  # fmt: skip


def fsdp_rows(smoke: bool) -> list[str]:
    """train.py at GPT-2 small on a generated 16 MB corpus (1 MB in smoke mode), 20 steps,
    unsharded and under trainer=fsdp on one GPU, from the same seed: the validation loss and
    the step rate."""
    legs = {"trainer=cpu": ["trainer=cpu"]} if smoke else {
        "trainer=gpu": ["trainer=gpu"], "trainer=fsdp": ["trainer=fsdp", "trainer.devices=1"],
    }  # fmt: skip
    steps = 2 if smoke else 20
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        corpus = Path(scratch) / "corpus"
        generate_corpus(corpus, 1 if smoke else 16)
        for label, trainer in legs.items():
            command = [
                sys.executable, "train.py", "experiment=lm_gpt2_small", f"task.data.dir={corpus}",
                "task.data.tokenizer=char", "task.data.val_tokens=65536",
                "task.data.tokens_per_step=null", f"trainer.max_steps={steps}",
                f"trainer.val_check_interval={steps}", f"paths.root_dir={scratch}/{label.split('=')[1]}",
                f"paths.data_dir={scratch}/cache", "seed=0", *trainer, *QUIET,
                *(smoke_run() if smoke else []),
            ]  # fmt: skip
            started = time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{label} failed:\n{done.stderr[-3000:]}")
            seconds = time.perf_counter() - started
            loss = summary_value(done.stdout, "val/loss")
            rows.append(f"| {label} | {loss:.4f} | {seconds:.0f} |")
    if smoke:
        rows.append("| trainer=fsdp | not run: torch's FSDP needs a GPU | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="nanoGPT's Shakespeare size, the CPU")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    at_documented = documented(parser, args, free=("cpu",))
    mode = MODES["smoke" if args.smoke else "cpu" if args.cpu else "gpu"]
    if mode.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpt2.py needs a CUDA GPU (or --cpu or --smoke, on the CPU)")
    if mode is MODES["cpu"]:
        torch.set_num_threads(1)
    batch, steps, rounds = mode.batch_steps_rounds or (args.batch, args.steps, args.rounds)
    rows, machine = race(mode, batch, steps, rounds)
    precision = "bf16 autocast, compiled, fused AdamW" if mode.compiled else "float32, eager"
    table = f"""{machine}, {torch.get_num_threads()} threads; batch {batch} x {mode.context} tokens,
vocabulary {mode.vocab}, {precision}; {rounds} rounds of {steps} steps of each model,
alternated. Ratio: tokens/s over the baseline's (nanoGPT's GPT) in each round, median (range).

| model | tokens/s | ratio | MFU |
|---|---|---|---|
{chr(10).join(rows)}
"""
    if mode is MODES["cpu"]:
        body = f"## GPT-2's stack at nanoGPT's Shakespeare size on the CPU (`benchmarks/gpt2.py --cpu`)\n\n{table}"
        report("gpt2-cpu", body, at_documented)
        return
    fsdp = "\n".join(fsdp_rows(args.smoke))
    body = f"""## GPT-2 small's training step against nanoGPT's (`benchmarks/gpt2.py`)

{table}
### trainer=fsdp

train.py experiment=lm_gpt2_small on a generated 16 MB corpus (characters), batch 12 x 1,024,
seed 0, 20 steps, unsharded and sharded over one GPU (the same data and initialization):
the validation loss after them, and the wall time of each run (start-up and validation
included).

| trainer | val/loss | seconds |
|---|---|---|
{fsdp}
"""
    report("gpt2", body, at_documented and not args.smoke)


if __name__ == "__main__":
    main()
