"""Training end to end through the real Hydra config: train.py, eval.py, multirun."""

from __future__ import annotations

import csv
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, compose_config, every_combination
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from attnlab import status
from attnlab.config.options import causal_only, options
from attnlab.errors import Diverged
from attnlab.runner.summary import print_config
from attnlab.runner.train import train
from attnlab.systems.optim import lr_factor

TINY = ["model=tiny", "task.data.train_size=256", "task.data.max_len=8"]
QUIET_OUTPUT = ["callbacks.progress_bar.refresh_rate=0", "extras.print_config=false"]


# make test runs an absolute, a rotary and a score-bias encoding end to end (every pe trains a
# step in test_combinations); test-all runs every pe
IN_MAKE_TEST = ("learned", "rope", "t5")


@pytest.mark.parametrize(
    "pe,norm",
    [case if case.values[0] in IN_MAKE_TEST else pytest.param(*case.values, marks=pytest.mark.slow)
     for case in every_combination(options("pe"), options("norm"), strength=1)],
)  # fmt: skip
def test_fast_dev_run_of_the_probe(pe, norm, make_config):
    causal = f"task.causal={bool(causal_only(pe) or causal_only(norm, 'norm'))}"  # bidirectional where they can be
    metrics = train(make_config(["debug=fast", f"pe={pe}", f"norm={norm}", causal, *TINY]))
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
    assert re.search(r"^pe +rope$", result.stdout, re.M) and re.search(
        r"^norm +l2$", result.stdout, re.M
    )


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
    for job in jobs:  # a finished job keeps its best weights, not the state to resume
        assert any((sweep / job / "checkpoints").glob("epoch_*.ckpt"))
        assert not (sweep / job / "checkpoints" / "last.ckpt").exists()
        assert "── norm" in (sweep / job / "config_tree.log").read_text()  # every job keeps it
    choices = {(sweep / job / ".hydra" / "overrides.yaml").read_text() for job in jobs}
    assert len(choices) == 4
    assert result.stdout.count("optimized_metric: val/acc") == 1, "the tree once per sweep"


@pytest.mark.slow
def test_ddp_over_two_cpu_processes_trains_tests_and_leaves_a_checkpoint_for_one_cpu(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "train.py", "trainer=ddp_cpu", "trainer.max_epochs=1", *TINY,
            "logger=wandb", *QUIET_OUTPUT, f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "train_ddp_process_1.log").is_file(), "a second rank ran"
    assert "test/acc" in result.stdout and "sync_dist=True" not in result.stderr
    assert result.stdout.count("run dir ") == 1, "one summary, from rank zero"
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1, "only rank zero logs"
    assert status.read(tmp_path).state == "completed"
    evaluated = subprocess.run(
        [
            sys.executable, "eval.py", f"ckpt_path={tmp_path / 'checkpoints' / 'last.ckpt'}",
            "trainer=cpu", *QUIET_OUTPUT, f"hydra.run.dir={tmp_path / 'eval'}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "test/acc" in evaluated.stdout, "the DDP checkpoint is evaluated in one CPU process"


def test_a_diverging_run_stops_with_one_sentence_and_records_it(make_config, tmp_path):
    with pytest.raises(
        Diverged, match=r"train/loss is nan at step \d+ \(learning rate .*\): the run"
    ):
        train(make_config([*TINY, "trainer.max_epochs=1", "task.optim.lr=1e38"]))
    recorded = status.read(tmp_path)
    assert recorded.state == "failed" and recorded.error.startswith("attnlab.errors.Diverged")


def with_loggers(overrides: list[str], tmp_path: Path) -> DictConfig:
    """The config of a quiet run that keeps its loggers (make_config drops them)."""
    return compose_config([*QUIET_OUTPUT, *TINY, *overrides], tmp_path)


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open() as file:
        return list(csv.DictReader(file))


def test_a_run_logs_its_learning_rate_and_throughput_and_draws_its_attention(tmp_path):
    cfg = with_loggers(
        ["trainer.max_epochs=2", "task.optim.warmup_steps=3", "trainer.log_every_n_steps=1"],
        tmp_path,
    )
    train(cfg)
    rows = metric_rows(tmp_path)
    lr = {int(r["step"]): float(r["train/lr/decay"]) for r in rows if r.get("train/lr/decay")}
    assert len(lr) == 8, "LearningRateMonitor logged train/lr/decay at every step"
    optim = cfg.task.optim
    for step, value in lr.items():
        factor = lr_factor(step, optim.warmup_steps, 8, optim.schedule)
        assert value == pytest.approx(optim.lr * factor, rel=1e-6)
    throughput = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")]
    assert len(throughput) == 8 and min(throughput) > 0, "TokenThroughput logged every step"
    assert (tmp_path / "attention.png").read_bytes()[:4] == b"\x89PNG"
    recorded = status.read(tmp_path)
    assert recorded.state == "completed"
    assert recorded.device.endswith(f", {torch.get_num_threads()} threads"), recorded.device


def test_a_dry_run_draws_nothing(make_config, tmp_path):
    train(make_config(["debug=fast", *TINY]))
    assert not (tmp_path / "attention.png").exists()


@pytest.mark.parametrize("debug", ["limit", "overfit", "profile"])
def test_every_debug_config_runs_under_logs_debug(debug, make_config, tmp_path):
    cfg = make_config([f"debug={debug}", *TINY, "trainer.max_epochs=2"])
    assert "/debug/runs/" in HydraConfig.get().run.dir
    metrics = train(cfg)
    assert math.isfinite(metrics["train/loss"])
    if debug == "profile":
        assert "Profiler Report" in (tmp_path / "fit-profile.txt").read_text()


def test_early_stopping_stops_a_run_that_stopped_improving(make_config, tmp_path):
    cfg = make_config(
        [*TINY, "callbacks=early_stopping", "callbacks.early_stopping.patience=1",
         "callbacks.early_stopping.min_delta=2.0", "trainer.max_epochs=10"]
    )  # fmt: skip
    train(cfg)
    assert status.read(tmp_path).steps == 2 * 4, "2 of 10 epochs of 4 steps"


def test_the_config_tree_is_printed_at_the_start(make_config, capsys):
    print_config(make_config(["pe=rope", "norm=l2"]))
    out = capsys.readouterr().out
    for line in ("run", "pe", "name: rope", "norm", "name: l2", "optimized_metric: val/acc"):
        assert line in out


def test_the_start_of_a_run_names_the_parameters_without_lightnings_noise(make_config, caplog):
    with caplog.at_level(logging.INFO):
        train(make_config([*TINY, "trainer.max_epochs=1", "callbacks.model_summary.max_depth=1"]))
    assert "trainable parameters" in caplog.text and "| Tagger " in caplog.text
    assert "FLOPs" not in caplog.text and "Flops" not in caplog.text  # always 0 here
    assert "💡" not in caplog.text and "Trainer already configured" not in caplog.text


def test_the_end_of_run_summary_goes_to_the_console_and_to_the_runs_log_file(tmp_path, capsys):
    from attnlab.runner.summary import report

    handler = logging.FileHandler(tmp_path / "train.log")
    logging.getLogger().addHandler(handler)
    try:
        report("task  probe\nblock  standard")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert capsys.readouterr().out == "task  probe\nblock  standard\n"
    assert "task  probe\nblock  standard" in (tmp_path / "train.log").read_text()


def test_the_summary_names_the_block_and_the_probes_switches(make_config):
    from attnlab.runner.summary import closing_summary

    text = closing_summary(make_config(["task.markers=true"]), {"total": 10}, {}, "/run")
    assert "block        standard" in text and "markers      true" in text
    assert "causal       false" in text


def test_the_config_tree_keeps_every_line_whole_when_not_on_a_terminal(make_config):
    from attnlab.runner.summary import config_tree

    long = "x" * 300
    text = config_tree(make_config([f"tags=[{long}]"]), color=False)
    assert f"- {long}" in text and "\x1b[" not in text  # no 80-column crop, no colour codes


def test_training_metrics_are_averaged_over_ranks_and_the_others_kept():
    from types import SimpleNamespace

    from attnlab.runner.train import averaged_over_ranks

    calls = []

    def reduce(value, reduce_op):  # as if the other rank logged 0
        calls.append(reduce_op)
        return value / 2

    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(reduce=reduce))
    metrics = {"val/acc": 0.5, "train/loss": 3.0, "train/tokens_per_s": 100.0}
    assert averaged_over_ranks(trainer, metrics) == {
        "val/acc": 0.5, "train/loss": 1.5, "train/tokens_per_s": 50.0
    }  # fmt: skip
    assert calls == ["mean", "mean"]
    assert averaged_over_ranks(SimpleNamespace(world_size=1), metrics) == metrics


@pytest.mark.parametrize(
    "overrides,sentence",
    [
        (["task=translation", "pe=t5", "pe.num_buckets=0"], "pe.num_buckets=0 is too small"),
        (
            ["task=translation", "model.cross_pe=true", "pe=sinusoidal"],
            "cross_pe=true does nothing",
        ),
        (["task=lm", "task.data.source=local", "pe=rope", "pe.scaling=bogus"], "pe.scaling"),
        (["task=translation", "++task.system.bogus=1"], "Seq2SeqSystem' has no option bogus"),
    ],
)
def test_a_bad_variant_setting_stops_the_run_before_any_data_is_read(
    overrides, sentence, make_config, tmp_path
):
    from attnlab.errors import ConfigError

    missing = tmp_path / "no-such-data"
    cfg = make_config([*overrides, f"paths.data_dir={missing}", f"task.data.dir={missing}"])
    with pytest.raises(ConfigError, match=sentence):
        train(cfg)
    assert not missing.exists()  # no cache was opened, no tokenizer trained


def test_a_synthetic_tasks_architecture_is_checked_before_its_data_is_drawn(make_config):
    from attnlab.errors import ConfigError

    cfg = make_config(["task=copy", "task.arch=bogus", "task.data.train_size=1000000000"])
    with pytest.raises(ConfigError, match=r"task\.arch='bogus' is not one of"):
        train(cfg)


@pytest.mark.parametrize(
    ("overrides", "sentence"),
    [
        (["task.data.max_len=1"], r"max_len=1 gives the probe one position, one class"),
        (
            ["trainer.val_check_interval=100000"],
            r"val_check_interval=100000 is more than the \d+ training batches of an epoch: give",
        ),
    ],
)
def test_a_setting_lightning_or_a_metric_would_refuse_is_one_sentence(
    overrides, sentence, make_config
):
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match=sentence):
        train(make_config(["model=tiny", "trainer.max_epochs=1", *overrides]))
