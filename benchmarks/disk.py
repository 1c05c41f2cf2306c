"""Disk left by a finished run: the default probe run, and a probe_table sweep job.

    python benchmarks/disk.py            # -> BENCHMARKS.md
    python benchmarks/disk.py --smoke    # model=tiny, one epoch, no writing

Each row is one `train.py` run (the default: the probe at model=small, 8 epochs) in a
temporary directory, measured with every file in it once it has finished: before, as runs
were written until 2026-11-26 (the best checkpoint with the optimizer state:
`callbacks.model_checkpoint.save_weights_only=false`); now, with the defaults (the best
checkpoint holds the weights only, last.ckpt the training state); a sweep job now, as
`experiment=probe_table` runs its jobs (`callbacks.latest.keep_when_done=false`: a finished
job drops last.ckpt); and before after `attnlab prune`. probe_table's 120 jobs are 120
such runs. Target: a finished run at most a third of the before.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, documented, report

from attnlab.commands.prune import prune

QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0", "~logger"]
SMOKE = ["model=tiny", "trainer.max_epochs=1", "task.data.train_size=128"]
WAYS = {
    "before (best checkpoint with the optimizer state)": [
        "callbacks.model_checkpoint.save_weights_only=false"
    ],
    "now, a single run (best: weights only; last.ckpt kept)": [],
    "now, a sweep job (keep_when_done=false, as the experiments)": [
        "callbacks.latest.keep_when_done=false"
    ],
}
SWEEP_JOBS = 120  # experiment=probe_table


def size(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def finished_run(directory: Path, overrides: list[str]) -> Path:
    command = [sys.executable, "train.py", *QUIET, *overrides, f"hydra.run.dir={directory}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[1:])} failed:\n{done.stderr[-3000:]}")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="model=tiny, one epoch, no writing")
    args = parser.parse_args()
    extra = SMOKE if args.smoke else []
    with tempfile.TemporaryDirectory() as scratch:
        runs = {way: finished_run(Path(scratch) / str(i), [*extra, *overrides])
                for i, (way, overrides) in enumerate(WAYS.items())}  # fmt: skip
        sizes = {way: size(run) for way, run in runs.items()}
        before = next(iter(WAYS))
        prune(runs[before])
        sizes[f"{before}, then `attnlab prune`"] = size(runs[before])
    before = sizes[next(iter(WAYS))]
    rows = "\n".join(
        f"| {way} | {value / 2**20:.2f} | {value * SWEEP_JOBS / 2**30:.2f} | {value / before:.2f} |"
        for way, value in sizes.items()
    )
    body = f"""## Disk per finished run (`make bench-disk`)

One default run (`python train.py`: the probe at model=small, 8 epochs{", smoke: model=tiny, one epoch" if args.smoke else ""}), every file of its
directory once it finished; experiment=probe_table's {SWEEP_JOBS} jobs are {SWEEP_JOBS} such runs.
Target: a finished run at most a third of before.

| run | MiB per run | GiB per probe_table sweep | × before |
|---|---|---|---|
{rows}
"""
    report("disk", body, documented(parser, args))


if __name__ == "__main__":
    main()
