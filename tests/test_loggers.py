"""logger=tensorboard, logger=mlflow and logger=many: a real 2-job sweep, read back from the
files each logger wrote (TensorBoard's event files, MLflow's SQLite store)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from helpers import ROOT

TINY = ["model=tiny", "task.data.train_size=128", "task.data.max_len=8", "trainer.max_epochs=1"]
QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]


def sweep(logger: str, logs) -> None:
    result = subprocess.run(
        [sys.executable, "train.py", "-m", f"logger={logger}", "pe=rope,t5", "tags=[check]",
         *TINY, *QUIET, f"paths.log_dir={logs}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def jobs(logs) -> list:
    (multirun,) = (logs / "probe" / "multiruns").iterdir()
    return sorted(p for p in multirun.iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_metrics_and_the_runs_name_group_and_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep("tensorboard", tmp_path)
    names = set()
    for job in jobs(tmp_path):
        assert (job / "csv" / "metrics.csv").is_file(), "the CSV logger stays on"
        events = EventAccumulator(str(job / "tensorboard"))
        events.Reload()
        assert {"val/acc", "test/acc"} <= set(events.Tags()["scalars"])
        logged = yaml.safe_load((job / "tensorboard" / "hparams.yaml").read_text())
        run = logged["run"]
        assert run["group"] == job.parent.name and "task=probe" in run["tags"]
        assert "check" in run["tags"] and logged["model"]["d_model"] == 32
        names.add(run["name"].split(",")[0])
    assert names == {"pe=rope", "pe=t5"}, "each job its own run, named by its pe"


@pytest.mark.slow
def test_mlflow_holds_one_run_per_job_with_name_group_tags_config_and_metrics(tmp_path):
    from mlflow import MlflowClient

    sweep("mlflow", tmp_path)
    (multirun,) = (tmp_path / "probe" / "multiruns").iterdir()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(multirun.name)  # the sweep groups its jobs
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    assert {run.data.tags["pe"] for run in runs} == {"rope", "t5"}
    for run in runs:
        assert run.info.run_name.startswith(f"pe={run.data.tags['pe']}")
        assert "check" in run.data.tags and run.data.tags["task"] == "probe"
        assert {"val/acc", "test/acc"} <= set(run.data.metrics)
        assert run.data.params["model/d_model"] == "32" and "paths" not in str(run.data.params)


@pytest.mark.slow
def test_many_writes_csv_wandb_and_tensorboard_for_every_job(tmp_path):
    sweep("many", tmp_path)
    for job in jobs(tmp_path):
        assert (job / "csv" / "metrics.csv").is_file()
        assert list((job / "wandb").glob("offline-run-*"))
        assert list((job / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("logger", ["tensorboard", "mlflow"])
def test_a_name_given_on_the_command_line_is_the_runs_name(logger, tmp_path):
    from attnlab.config.build import build
    from attnlab.config.options import variant

    where = {"tensorboard": f"save_dir={tmp_path}", "mlflow": f"database={tmp_path / 'ml.db'}"}
    node = variant("logger", logger, "csv.save_dir=x", f"{logger}.{where[logger]}",
                   f"{logger}.name=mine", f"{logger}.group=ours", f"{logger}.job_type=probe",
                   f"{logger}.tags=[]")[logger]  # fmt: skip
    built = build(node)
    named = built.run if logger == "tensorboard" else {"name": built._run_name}
    assert named["name"] == "mine"
