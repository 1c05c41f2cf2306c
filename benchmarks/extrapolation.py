"""Evaluation at 16x the training length: time and peak memory of every encoding.

    python benchmarks/extrapolation.py                      # this checkout -> BENCHMARKS.md
    python benchmarks/extrapolation.py --before TREE        # TREE's rows beside (a checkout)
    python benchmarks/extrapolation.py --smoke              # tiny, generated text, no writing

For each encoding, in a checkout (this one, and `--before`'s when given), as a user runs it:
1. `train.py experiment=lm_shakespeare_char pe=P task.data.block_size=1024` for 2 steps of
   one window: a checkpoint trained at 1,024 tokens (its quality is not the point here);
2. `eval.py ckpt_path=... split=val task.data.eval_lengths=[16384]
   trainer.limit_val_batches=1`: one window of 16,384 tokens of the validation split (the
   first; eval.py says it scored 1 of the split's windows), in a process of its own;
3. the same at eval_lengths=[1024], the start-up of eval.py and one short window.
Reported per encoding: the 16,384-token window's seconds (3's wall time subtracted from 2's)
and its ratio to pe=none's; the peak resident memory of 2 (os.wait4's ru_maxrss) and its
ratio; the window's val/loss, which a checkout changing speed only must leave as it was.
Encodings with a table of positions are built for the long window (learned and urpe
max_len, randomized max_position = 16,384). Every process runs with `--threads` torch
threads and at most `--memory-gib` of address space: a window that needs more fails with
torch's allocation error, and its row says so.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, documented, machine, report

from attnlab.config.options import options

SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
EXPERIMENT = "experiment=lm_shakespeare_char"
QUIET = ["callbacks.progress_bar.refresh_rate=0", "extras.print_config=false"]
TABLE_SIZE = {"learned": "pe.max_len", "urpe": "pe.max_len", "randomized": "pe.max_position"}
SMOKE_MODEL = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"]
SMOKE_PE = ["none", "t5", "xl"]  # the plain, per-distance and term paths
GIB = 1 << 30


@dataclass(frozen=True)
class Measured:
    seconds: float  # wall time of the process
    peak: int  # bytes, ru_maxrss
    loss: float | None  # val/loss at the evaluated length; None when the process failed
    failure: str = ""  # the process's last line of error output when it failed


def limited(memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


def process(
    tree: Path, script: str, overrides: list[str], threads: int, memory: int, log: Path
) -> tuple[Measured, str]:
    """Run `script` of the checkout `tree` with `overrides`; its measurement and stdout."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, script, *QUIET, *overrides]
    with open(log, "w") as out:
        start = time.perf_counter()
        child = subprocess.Popen(
            command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=lambda: limited(memory),
        )  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text()
    if child.returncode:
        failure = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "no output")
        return Measured(seconds, usage.ru_maxrss * 1024, None, failure[-200:]), text
    return Measured(seconds, usage.ru_maxrss * 1024, logged_loss(text)), text


def logged_loss(stdout: str) -> float | None:
    """The val/loss (or val/loss@N) of a run's closing table, of its one evaluated length."""
    rows = [ln.split() for ln in stdout.splitlines() if ln.startswith("val/loss")]
    return float(rows[-1][1]) if rows else None


def run_dir(stdout: str) -> Path:
    return Path(next(ln.split()[-1] for ln in stdout.splitlines() if ln.startswith("run dir ")))


@dataclass(frozen=True)
class Setting:
    train_length: int
    eval_length: int
    steps: int
    threads: int
    memory: int
    text: Path
    model: list[str]

    def common(self, pe: str, scratch: Path) -> list[str]:
        size = TABLE_SIZE.get(pe)
        table = [f"{size}={self.eval_length}"] if size else []
        if size != "pe.max_len":  # the experiment sets learned's
            table.append("~pe.max_len")
        return [
            EXPERIMENT, f"pe={pe}", *table, *self.model, f"task.data.file={self.text}",
            f"paths.log_dir={scratch}/logs", f"paths.data_dir={scratch}/data",
        ]  # fmt: skip


def measure(tree: Path, pe: str, setting: Setting, scratch: Path) -> tuple[Measured, float]:
    """Train `pe` briefly at the training length, then evaluate one long window; the long
    window's measurement (start-up subtracted from its seconds) and the start-up's peak."""
    common = setting.common(pe, scratch)
    trained, stdout = process(
        tree, "train.py",
        [*common, f"task.data.block_size={setting.train_length}", "task.data.batch_size=1",
         f"trainer.max_steps={setting.steps}", f"trainer.val_check_interval={setting.steps}",
         f"task.data.eval_lengths=[{setting.train_length}]", "trainer.limit_val_batches=1",
         "task.optim.warmup_steps=1"],
        setting.threads, setting.memory, scratch / f"{pe}.train.log",
    )  # fmt: skip
    if trained.loss is None:
        raise SystemExit(f"training pe={pe} in {tree} failed: {trained.failure}")
    checkpoint = run_dir(stdout) / "checkpoints" / "last.ckpt"

    def evaluate(length: int) -> Measured:  # the checkpoint holds the training's overrides
        overrides = [
            f"ckpt_path={checkpoint}", "split=val", f"paths.log_dir={scratch}/logs",
            f"task.data.eval_lengths=[{length}]", "trainer.limit_val_batches=1",
        ]  # fmt: skip
        log = scratch / f"{pe}.eval{length}.log"
        return process(tree, "eval.py", overrides, setting.threads, setting.memory, log)[0]

    long, short = evaluate(setting.eval_length), evaluate(setting.train_length)
    window = Measured(long.seconds - short.seconds, long.peak, long.loss, long.failure)
    return window, short.peak


def failure(text: str) -> str:
    """A failed process's last line, short: torch's allocation error as the size it asked."""
    found = re.search(r"can't allocate memory: you tried to allocate (\d+) bytes", text)
    return f"out of memory: asked {int(found[1]) / GIB:.1f} GiB more" if found else text[-120:]


def cell(measured: Measured, baseline: Measured) -> str:
    if measured.loss is None:
        return f"failed, {failure(measured.failure)} | | |"
    return (
        f"{measured.seconds:.1f} ({measured.seconds / baseline.seconds:.2f}x) "
        f"| {measured.peak / GIB:.2f} ({measured.peak / baseline.peak:.2f}x) "
        f"| {measured.loss:.4f} |"
    )


def table(results: dict[str, dict[str, Measured]], trees: list[str]) -> str:
    head = "| pe | " + " | ".join(
        f"{t}: window s (x none) | {t}: peak GiB (x none) | {t}: val/loss" for t in trees
    )
    rule = "|---|" + "---|" * (3 * len(trees))
    rows = [
        f"| {pe} | " + " ".join(cell(by_tree[t], results["none"][t]) for t in trees)
        for pe, by_tree in results.items()
    ]
    return "\n".join([head + " |", rule, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout, measured alongside")
    parser.add_argument("--pe", nargs="+", default=None, help="these encodings (default: all)")
    parser.add_argument("--train-length", type=int, default=1024)
    parser.add_argument("--factor", type=int, default=16, help="evaluation length / training")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-gib", type=float, default=16.0)
    parser.add_argument("--smoke", action="store_true", help="tiny, generated text, no writing")
    args = parser.parse_args()
    everything = ["none", *sorted(set(options("pe")) - {"none"})]
    encodings = args.pe or (SMOKE_PE if args.smoke else everything)
    if "none" not in encodings:
        raise SystemExit("--pe must include none: every ratio is to pe=none's row")
    with tempfile.TemporaryDirectory() as scratch:
        text = SHAKESPEARE
        if args.smoke:
            text = Path(scratch) / "text.txt"
            text.write_text("".join(f"line {i} of a generated text.\n" for i in range(400)))
        elif not text.exists():
            raise SystemExit(
                f"{text} is missing: this benchmark reads ../shared's Tiny Shakespeare"
            )
        length = 16 if args.smoke else args.train_length
        setting = Setting(
            length, length * args.factor, 2, args.threads, int(args.memory_gib * GIB), text,
            SMOKE_MODEL if args.smoke else [],
        )  # fmt: skip
        trees = {"now": ROOT} | ({"before": args.before.resolve()} if args.before else {})
        results: dict[str, dict[str, Measured]] = {}
        for pe in encodings:
            for name, tree in trees.items():
                where = Path(scratch) / name
                where.mkdir(exist_ok=True)
                window, _ = measure(tree, pe, setting, where)
                results.setdefault(pe, {})[name] = window
                print(f"{name} pe={pe}: {window}", flush=True)
        order = [t for t in ("before", "now") if t in trees]
        body = section(table(results, order), setting, args)
    report("extrapolation", body, not args.smoke and documented(parser, args, {"before"}))


def section(rows: str, setting: Setting, args: argparse.Namespace) -> str:
    before = f" --before {args.before}" if args.before else ""
    model = ", " + " ".join(setting.model) if setting.model else ": 4 layers, width 128, 4 heads"
    return f"""## Evaluation at {args.factor}x the training length (`benchmarks/extrapolation.py`)

Command: `python benchmarks/extrapolation.py{before}` on {machine()}, each process at
{setting.threads} torch thread(s) and at most {args.memory_gib:g} GiB of address space.
Each encoding trained for {setting.steps} steps at {setting.train_length} tokens
(`experiment=lm_shakespeare_char`{model}), then `eval.py` scored
the first window of {setting.eval_length} characters of the validation split (1 of its
windows, as eval.py says). window s: that window's seconds (eval.py's wall time at
{setting.eval_length} minus its wall time at {setting.train_length}); peak GiB: the
evaluating process's peak resident memory; val/loss: the window's loss, which a change of
speed alone leaves unchanged.

{rows}
"""


if __name__ == "__main__":
    main()
