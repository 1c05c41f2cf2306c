"""The end of a -m sweep, or of its finishing by `train.py run_dir=<sweep dir>`: compare its
jobs, print the table, fail if any job failed.

A Hydra callback (conf/hydra/default.yaml): `on_multirun_end` runs in the process that
launched the sweep, after every job (joblib: in parallel; SLURM: on the cluster) is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from attnlab.reports.families import compare


class CompareAtSweepEnd(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        report_sweep(Path(config.hydra.sweep.dir))


def report_sweep(directory: Path) -> int:
    """Print the comparison of the jobs below `directory`, and how many there are; raise
    SystemExit naming those that did not complete."""
    comparison = compare(directory)
    print(f"\n{comparison.table()}\n\ncomparison: {directory / 'comparison.md'}", flush=True)
    if comparison.failed:
        jobs = ", ".join(f"{run.name} ({run.state})" for run in comparison.failed)
        raise SystemExit(
            f"attnlab: {len(comparison.failed)} of {len(comparison.every_run)} jobs did not "
            f"complete: {jobs}; their errors are in comparison.md and in each job's train.log"
        )
    return len(comparison.every_run)
