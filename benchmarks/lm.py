"""Language model benchmarks on Tiny Shakespeare (results go to BENCHMARKS.md).

    python benchmarks/lm.py anchor [--seeds 0 1 2]        # the nanoGPT run, once per seed
    python benchmarks/lm.py speed [--steps 200 --repeats 5]   # Lightning vs a plain loop
    python benchmarks/lm.py anchor --smoke   # or speed --smoke: tiny, no writing

anchor: `train.py experiment=lm_shakespeare_char seed=S` (nanoGPT's "I only have a macbook"
character-level run: 4 layers, 4 heads, width 128, context 64, batch 12, 2,000 steps) once
per seed, each a process of its own; from each run's csv/metrics.csv its final val/loss
(nats per character over all of the last 10% of the file), val/bpc and last
train/tokens_per_s, and the process's wall time (start-up, tokenization and the eight
validations included). Reported: each seed, and the mean with its 95% t interval over seeds,
next to nanoGPT's 1.88 (which it estimates on 20 random batches of validation windows) and
to nanoGPT's own code run on this machine and scored on the whole split (NANOGPT_HERE).

speed: the experiment's network (its config composed, built by attnlab.runner.plan as train.py
builds it), trained on the same pre-drawn training batches two ways, alternating, in one
process: (a) a lightning.Trainer (conf/trainer/default.yaml's settings with max_steps,
gradient clipping 1.0 and fp32; no validation, checkpointing, logger, progress bar or model
summary) fitting the LMSystem; (b) a plain PyTorch loop over the same LMSystem code, its
param groups and LambdaLR schedule from attnlab.systems.optim.Optim.configure, clip_grad_norm_(1.0).
Both start each repeat from the same initial weights. Timed: (a) from the start of its first
training batch to on_train_end (Trainer construction and setup excluded), (b) its steps.
Reported: training tokens/s of each, the ratio Lightning/plain (target ≥ 0.95), and the
difference of their last losses and weights, as a check that both trained alike. One torch
thread by default (`--threads`): with two on this 2-core machine, any other process makes
every step wait for a descheduled thread, and the ratio swung from 0.57 to 2.0.

BENCHMARKS.md is written at the documented settings (the defaults) only. `--smoke` runs
either at tiny sizes (width 32, one layer, a few steps, one seed, caches and runs in a
temporary directory) and prints its section: the test that keeps this script working.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, documented, machine, report

from attnlab.compare.runs import read_logged
from attnlab.compare.seeds import interval
from attnlab.config.build import to_dict
from attnlab.config.options import CONF_DIR
from attnlab.config.resolvers import register_resolvers
from attnlab.runner.loggers import quiet_library_noise
from attnlab.runner.plan import Plan, build_datamodule, build_system
from attnlab.runner.trainer import trainer_from
from attnlab.tasks.lm.system import LMSystem

SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
EXPERIMENT = "experiment=lm_shakespeare_char"
NANOGPT = 1.88  # nanoGPT's README: val loss of its CPU run, nats per character
# nanoGPT's own train.py (karpathy/nanoGPT at 3adf61e) with its README's CPU command, run on
# this machine on 2026-11-26 with torch.manual_seed(seed) in place of its fixed 1337, each
# run's iteration-2,000 checkpoint scored on all of val.bin in non-overlapping windows of
# 64, as here (nats per character): seed -> val loss
NANOGPT_HERE = {1337: 1.8983, 1: 1.8910, 2: 1.9081}
SMOKE_MODEL = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"]
SMOKE_RUN = ["trainer.max_steps=10", "trainer.val_check_interval=5", "task.optim.warmup_steps=2"]
QUIET = ["callbacks.progress_bar.refresh_rate=0"]
WARMUP_STEPS = 2  # untimed steps of each way before the timed repeats


def cuda_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def last(logged: dict[str, list[tuple[int, float]]], metric: str) -> float:
    return logged[metric][-1][1]


def train_once(seed: int, overrides: list[str]) -> dict[str, float]:
    """One `train.py` run; its final validation, last throughput and wall time."""
    command = [sys.executable, "train.py", EXPERIMENT, f"seed={seed}", *QUIET, *overrides]
    print(" ".join(command[1:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command[1:])} failed:\n{done.stderr[-3000:]}")
    run_dir = next(
        line.split()[-1] for line in done.stdout.splitlines() if line.startswith("run dir ")
    )
    logged = read_logged(Path(run_dir) / "csv" / "metrics.csv")
    return {
        "val/loss": last(logged, "val/loss"), "val/bpc": last(logged, "val/bpc"),
        "tokens_per_s": last(logged, "train/tokens_per_s"), "seconds": seconds,
    }  # fmt: skip


def mean_and_interval(values: list[float], digits: int) -> str:
    """The mean, ± the half-width of its 95% t interval over seeds (the mean alone for one)."""
    mean, half = statistics.mean(values), interval(values)
    return f"{mean:.{digits}f}" + ("" if half is None else f" ± {half:.{digits}f}")


def anchor(args: argparse.Namespace, overrides: list[str]) -> str:
    seeds = args.seeds[:1] if args.smoke else args.seeds
    results = {seed: train_once(seed, overrides) for seed in seeds}
    rows = [
        f"| {seed} | {r['val/loss']:.4f} | {r['val/bpc']:.4f} | {r['seconds'] / 60:.1f} "
        f"| {r['tokens_per_s']:.0f} |"
        for seed, r in results.items()
    ]
    column = {key: [r[key] for r in results.values()] for key in next(iter(results.values()))}
    mean_row = (
        f"| mean ± 95% t interval | **{mean_and_interval(column['val/loss'], 3)}** "
        f"| {mean_and_interval(column['val/bpc'], 3)} "
        f"| {mean_and_interval([s / 60 for s in column['seconds']], 1)} "
        f"| {mean_and_interval(column['tokens_per_s'], 0)} |"
    )
    table = "\n".join(rows)
    reference = list(NANOGPT_HERE.values())
    reference_row = (
        f"| nanoGPT's train.py here, all of the split (seeds "
        f"{', '.join(map(str, NANOGPT_HERE))}) | {mean_and_interval(reference, 3)} "
        f"| {mean_and_interval([v / math.log(2) for v in reference], 3)} | | |"
    )
    mean = statistics.mean(column["val/loss"])
    seed_list = " ".join(map(str, seeds))
    return f"""## Language model anchor: nanoGPT's Shakespeare run (`make bench-lm`)

Command: `python benchmarks/lm.py anchor --seeds {seed_list}` on {machine()}: for each seed
`train.py {EXPERIMENT} seed=S` (nanoGPT's "I only have a macbook" run: 4 layers, 4 heads,
width 128, context 64, batch 12, 2,000 steps, lr 1e-3, cosine to 1e-4, no dropout, no biases, learned
positions, characters of the first 90% of Tiny Shakespeare). val/loss: nats per character
over all of the last 10% after the last step; wall time: the whole process (start-up,
tokenization and 8 validations included); tokens/s: training steps only (train/tokens_per_s).

| seed | val/loss | val/bpc | wall time, min | training tokens/s |
|---|---|---|---|---|
{table}
{mean_row}
| nanoGPT (its README) | 1.88 | {NANOGPT / math.log(2):.3f} | ~3 (its CPU) | |
{reference_row}

nanoGPT estimates its 1.88 on 20 random batches of validation windows; here the whole
validation split is scored once, in non-overlapping windows of 64. nanoGPT's own
`train.py`, run here with its README's command and scored the same way, gives the last row
(its own 20-batch estimate for seed 1337 was 1.886). Mean minus nanoGPT's README:
{mean - NANOGPT:+.3f}; minus nanoGPT's code on the whole split: {mean - statistics.mean(reference):+.3f}
nats per character.
"""


def compose_config(overrides: list[str], directory: Path) -> DictConfig:
    """train.py's config for the experiment with `overrides`, writing under `directory`."""
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        paths = [f"paths.root_dir={ROOT}", f"paths.output_dir={directory}"]
        cfg = compose("train", overrides=[EXPERIMENT, *paths, *overrides])
    GlobalHydra.instance().clear()
    return cfg


class StepTimer(L.Callback):
    """Seconds from the start of the first training batch to the end of training."""

    def __init__(self) -> None:
        self.start, self.seconds = 0.0, 0.0

    def on_train_batch_start(self, trainer: L.Trainer, module: LMSystem, *_: object) -> None:
        if trainer.global_step == 0:
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, module: LMSystem) -> None:
        cuda_sync(module.device)
        self.seconds = time.perf_counter() - self.start


def fit_lightning(
    system: LMSystem, cfg: DictConfig, batches: list[torch.Tensor]
) -> tuple[float, float]:
    """Seconds of the steps and the last loss of a Trainer fitting `system` on `batches`."""
    timer = StepTimer()
    trainer = trainer_from(
        to_dict(cfg.trainer), max_steps=len(batches), max_epochs=-1, limit_val_batches=0,
        num_sanity_val_steps=0, enable_checkpointing=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
        precision="32-true", callbacks=[timer],
    )  # fmt: skip
    trainer.fit(system, DataLoader(batches, batch_size=None))
    return timer.seconds, float(trainer.callback_metrics["train/loss"])


def fit_plain(system: LMSystem, batches: list[torch.Tensor]) -> tuple[float, float]:
    """Seconds and last loss of a plain loop with the system's optimizer and schedule."""
    configured = system.optim.configure(system, len(batches))
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    system.train()
    device = next(system.parameters()).device
    cuda_sync(device)
    start = time.perf_counter()
    for batch in batches:
        loss = system.token_nll(batch.to(device, non_blocking=True)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(system.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    cuda_sync(device)
    return time.perf_counter() - start, loss.item()


def speed(args: argparse.Namespace, overrides: list[str], directory: Path) -> str:
    steps, repeats = (4, 1) if args.smoke else (args.steps, args.repeats)
    torch.set_num_threads(args.threads)
    cfg = compose_config(overrides, directory)
    L.seed_everything(cfg.seed, verbose=False)
    data = build_datamodule(cfg)
    loader = iter(data.train_dataloader())
    batches = [next(loader) for _ in range(steps)]
    lightning_system = build_system(Plan.from_config(cfg), data)
    plain_system = copy.deepcopy(lightning_system)
    initial = copy.deepcopy(lightning_system.state_dict())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # accelerator=auto
    plain_system.to(device)
    fit_lightning(lightning_system, cfg, batches[:WARMUP_STEPS])
    fit_plain(plain_system, batches[:WARMUP_STEPS])
    seconds = {"lightning": 0.0, "plain": 0.0}
    ratios = []
    for _ in range(repeats):  # alternate, so drifts in machine speed hit both alike
        lightning_system.load_state_dict(initial)
        plain_system.load_state_dict(initial)
        ours, lightning_loss = fit_lightning(lightning_system, cfg, batches)
        theirs, plain_loss = fit_plain(plain_system, batches)
        seconds["lightning"] += ours
        seconds["plain"] += theirs
        ratios.append(theirs / ours)
    tokens = repeats * sum(batch[:, :-1].numel() for batch in batches)
    rate = {name: tokens / s for name, s in seconds.items()}
    weights = zip(lightning_system.parameters(), plain_system.parameters(), strict=True)
    weight_gap = max(float((a.detach().cpu() - b.detach().cpu()).abs().max()) for a, b in weights)
    model, spread = cfg.model, ", ".join(f"{r:.3f}" for r in sorted(ratios))
    return f"""## Language model training: Lightning vs a plain loop (`make bench-lm`)

Command: `python benchmarks/lm.py speed --steps {steps} --repeats {repeats}` on {machine()}; device: {device.type}.

experiment=lm_shakespeare_char's network (d_model {model.d_model}, {model.n_heads} heads,
{model.n_layers} layers, FFN {model.d_ff}, learned positions), {steps} pre-drawn training
batches of {batches[0].shape[0]} windows of {batches[0].shape[1] - 1} characters, {repeats} alternating repeats from the
same initial weights; fp32, AdamW with the run's param groups and warmup + cosine schedule,
gradients clipped at 1.0. Lightning: a Trainer fitting the LMSystem (no validation,
checkpointing or logger), timed from its first batch to `on_train_end`; plain: the same
steps in a `for` loop.

| training loop | tokens/s |
|---|---|
| lightning.Trainer | {rate["lightning"]:.0f} |
| plain PyTorch loop | {rate["plain"]:.0f} |
| **ratio** Lightning / plain (target ≥ 0.95) | **{rate["lightning"] / rate["plain"]:.3f}** |

Ratio in each repeat, sorted: {spread}. Check that both trained alike: last loss Lightning
{lightning_loss:.5f}, plain {plain_loss:.5f} (difference {abs(lightning_loss - plain_loss):.2e}); largest
weight difference after the last repeat {weight_gap:.2e}.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="which", required=True)
    anchor_parser = sub.add_parser("anchor")
    anchor_parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    anchor_parser.add_argument("--smoke", action="store_true", help="tiny sizes, no writing")
    speed_parser = sub.add_parser("speed")
    speed_parser.add_argument("--steps", type=int, default=200)
    speed_parser.add_argument("--repeats", type=int, default=5)
    speed_parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (2 on 2 busy cores stall every step)"
    )
    speed_parser.add_argument("--smoke", action="store_true", help="tiny sizes, no writing")
    args = parser.parse_args()
    if not SHAKESPEARE.is_file():
        raise SystemExit(
            f"the benchmarks read Tiny Shakespeare from {SHAKESPEARE}, which is absent"
        )
    warnings.filterwarnings("ignore", module="lightning")  # the list's loader has no workers
    quiet_library_noise()
    subparser = anchor_parser if args.which == "anchor" else speed_parser
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        overrides = []
        if args.smoke:
            places = [f"paths.data_dir={directory / 'data'}", f"paths.log_dir={directory / 'logs'}"]
            overrides = SMOKE_MODEL + places + (SMOKE_RUN if args.which == "anchor" else [])
        if args.which == "anchor":
            body = anchor(args, overrides)
        else:
            body = speed(args, overrides, directory / "speed")
    report(f"lm-{args.which}", body, documented(subparser, args, free=("which",)))


if __name__ == "__main__":
    main()
