"""Training end to end through the real Hydra config: train.py, eval.py, multirun."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from helpers import ROOT, options

from attnlab.train import train

TINY = ["model=tiny", "task.data.train_size=256", "task.data.max_len=8"]


@pytest.mark.parametrize("norm", options("norm"))
@pytest.mark.parametrize("pe", options("pe"))
def test_fast_dev_run_of_the_probe(pe, norm, make_config):
    metrics = train(make_config(["debug=fast", f"pe={pe}", f"norm={norm}", *TINY]))
    assert math.isfinite(metrics["train/loss"])
    assert 0.0 <= metrics["test/acc"] <= 1.0


@pytest.mark.slow
def test_learned_absolute_positions_learn_the_probe(make_config):
    cfg = make_config(
        [
            "pe=learned",
            "model=tiny",
            "model.d_model=64",
            "task.optim.lr=3e-3",
            "trainer.max_epochs=3",
        ]
    )
    metrics = train(cfg)
    assert cfg.task.data.max_len == 16
    assert metrics["test/acc"] >= 0.99


@pytest.mark.slow
def test_eval_reproduces_the_test_metric_of_a_run(make_config, tmp_path):
    cfg = make_config(["pe=rope", "norm=l2", *TINY, "trainer.max_epochs=1"])
    metrics = train(cfg)
    ckpt = next((tmp_path / "checkpoints").glob("epoch_*.ckpt"))
    result = subprocess.run(
        [sys.executable, "eval.py", f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("test/acc"))
    assert float(line.split()[-1]) == pytest.approx(metrics["test/acc"], abs=1e-4)
    assert "pe            rope" in result.stdout and "norm          l2" in result.stdout


@pytest.mark.slow
def test_a_multirun_writes_every_job_into_one_sweep_directory(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "train.py", "-m", "pe=learned,rope", "norm=softmax,l2",
            "trainer.max_epochs=1", *TINY, "~logger", f"paths.log_dir={tmp_path}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (sweep,) = (tmp_path / "probe" / "multiruns").iterdir()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert jobs == ["0", "1", "2", "3"]
    for job in jobs:
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
    choices = {(sweep / job / ".hydra" / "overrides.yaml").read_text() for job in jobs}
    assert len(choices) == 4


@pytest.mark.slow
def test_ddp_over_two_cpu_processes_trains_and_tests(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "train.py", "trainer=ddp_cpu", "trainer.max_epochs=1", *TINY,
            "callbacks.progress_bar.refresh_rate=0", f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "train_ddp_process_1.log").is_file(), "a second rank ran"
    assert "test/acc" in result.stdout and "sync_dist=True" not in result.stderr
