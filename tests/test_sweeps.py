"""Sweeps beyond the basic launcher: joblib, submitit, Optuna, and what a sweep refuses."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import yaml
from helpers import ROOT, compose_config
from hydra.core.hydra_config import HydraConfig

TINY = ["model=tiny", "task.data.train_size=128", "task.data.max_len=8", "trainer.max_epochs=1"]
QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]


def sweep(*args: str, log_dir) -> tuple[subprocess.CompletedProcess, list]:
    result = subprocess.run(
        [sys.executable, "train.py", "-m", *args, *TINY, *QUIET, f"paths.log_dir={log_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    sweeps = list((log_dir / "probe" / "multiruns").glob("*"))
    return result, sweeps


def states(sweep_dir) -> list[str]:
    with (sweep_dir / "comparison.csv").open() as file:
        return [row["state"] for row in csv.DictReader(file)]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_parallel_and_submitit_launchers_run_every_job_and_compare_them(launcher, tmp_path):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    result, (sweep_dir,) = sweep(
        "pe=rope,t5", f"hydra/launcher={launcher}", *extra, log_dir=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert states(sweep_dir) == ["completed", "completed"]
    assert "| run | pe | state |" in result.stdout


@pytest.mark.slow
def test_an_optuna_search_runs_its_trials_and_records_the_best(tmp_path):
    result, (sweep_dir,) = sweep(
        "hparams_search=probe_optuna", "hydra.sweeper.n_trials=2", log_dir=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert states(sweep_dir) == ["completed", "completed"]
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {
        "task.optim.lr", "task.optim.warmup_steps", "model.dropout", "pe", "norm"
    }  # fmt: skip
    assert 0.0 <= best["best_value"] <= 1.0


@pytest.mark.slow
def test_ddp_inside_a_local_sweep_fails_the_job_with_one_sentence(tmp_path):
    result, (sweep_dir,) = sweep("pe=rope", "trainer=ddp_cpu", log_dir=tmp_path)
    assert result.returncode == 1
    error = (sweep_dir / "0" / "status.json").read_text()
    assert "trainer.devices=2 inside a -m sweep" in error
    assert "hydra/launcher=slurm" in error


@pytest.mark.parametrize("search", ["probe_optuna", "multi30k_optuna"])
def test_the_optuna_searches_maximize_the_task_metric(search, tmp_path):
    cfg = compose_config([f"hparams_search={search}"], tmp_path)
    hydra = HydraConfig.get()
    assert hydra.sweeper._target_.endswith("OptunaSweeper")
    assert hydra.sweeper.direction == "maximize"
    assert cfg.optimized_metric == cfg.task.metric
    assert {"task.optim.lr", "task.optim.warmup_steps", "model.dropout", "pe", "norm"} == set(
        hydra.sweeper.params
    )


def test_the_slurm_launcher_is_submitit_with_its_resources_as_options(tmp_path):
    compose_config(
        ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=30"],
        tmp_path,
    )
    launcher = HydraConfig.get().launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.timeout_min) == ("gpu", 30)
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.mem_gb) == (1, 1, 32)


@pytest.mark.slow
def test_a_plain_sweeps_finished_jobs_keep_their_best_weights_not_their_training_state(tmp_path):
    result, (sweep_dir,) = sweep("seed=1,2", log_dir=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        kept = sorted(p.name for p in (sweep_dir / job / "checkpoints").iterdir())
        assert kept == ["epoch_000.ckpt"], f"job {job} kept {kept}"
