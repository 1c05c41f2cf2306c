"""logger=wandb: offline runs read back from their files, one W&B run per sweep job, and an
online mode that stops within seconds when W&B cannot be reached."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from helpers import ROOT, compose_config
from wandb_records import read_offline_run

from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError

TINY = ["model=tiny", "task.data.train_size=128", "task.data.max_len=8", "trainer.max_epochs=1"]
QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]


def wandb_logger(save_dir: str, *overrides: str):
    """logger=wandb's WandbLogger from its YAML (conf/logger/wandb.yaml), writing to
    `save_dir`, with `overrides` of its options (e.g. "mode=offline")."""
    settings = [f"{group}.save_dir={save_dir}" for group in ("csv", "wandb")]
    return build(variant("logger", "wandb", *settings, *(f"wandb.{o}" for o in overrides))["wandb"])


def train_cli(*args: str, env: dict | None = None, timeout: int = 600):
    return subprocess.run(
        [sys.executable, "train.py", *args, *QUIET],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def wandb_sweep(tmp_path_factory):
    """A real 3-job sweep with logger=wandb (offline by default)."""
    logs = tmp_path_factory.mktemp("logs")
    result = train_cli(
        "-m", "pe=rope,t5,alibi", "norm=l2", "logger=wandb", "tags=[probe_check]", *TINY,
        f"paths.log_dir={logs}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (logs / "probe" / "multiruns").iterdir()
    return sweep


def offline_runs(sweep):
    jobs = sorted(p for p in sweep.iterdir() if p.name.isdigit())
    return {job.name: read_offline_run(next((job / "wandb").glob("offline-run-*"))) for job in jobs}


@pytest.mark.slow
def test_every_job_of_a_sweep_is_its_own_offline_wandb_run(wandb_sweep):
    runs = offline_runs(wandb_sweep)
    assert len(runs) == 3
    for job, run in runs.items():
        assert (wandb_sweep / job / "csv" / "metrics.csv").is_file(), "the CSV logger stays on"
        assert run.group == wandb_sweep.name, "the sweep directory's name groups its jobs"
        assert run.job_type == "probe"
        assert run.exit_code == 0
    names = {run.name for run in runs.values()}
    assert len(names) == 3 and all("norm=l2" in name for name in names)
    assert {name.split("pe=")[1].split(",")[0] for name in names} == {"rope", "t5", "alibi"}
    assert "logger" not in " ".join(names) and "tags" not in " ".join(names)
    for run in runs.values():
        pe = run.config["pe"]["name"]
        assert set(run.tags) == {
            "probe_check", f"pe={pe}", "norm=l2", "synthesizer=dot", "task=probe", "model=tiny",
                "block=standard",
        }  # fmt: skip


@pytest.mark.slow
def test_the_wandb_config_is_the_run_config_without_metadata_or_machine_paths(wandb_sweep):
    run = offline_runs(wandb_sweep)["0"]
    config = run.config
    assert config["pe"]["name"] == "rope" and config["pe"]["base"] == 10000.0
    assert config["pe"]["layout"] == "interleaved" and config["pe"]["scaling"] is None
    assert config["norm"]["name"] == "l2" and config["synthesizer"]["name"] == "dot"
    assert config["task"]["name"] == "probe" and config["model"]["d_model"] == 32
    assert config["optim"]["lr"] == 1e-3 and "optim" not in config["task"]
    assert config["params"]["total"] > 0 and "pe" in config["params"]
    text = str(config)
    for absent in ("_target_", "description", "paper", str(ROOT), "paths", "hydra"):
        assert absent not in text, absent


@pytest.mark.slow
def test_wandb_gets_accuracy_by_position_as_one_plot_and_the_metric_summary(wandb_sweep):
    run = offline_runs(wandb_sweep)["1"]
    assert any(key.startswith("val/acc_by_position") for key in run.history_keys)
    assert not [key for key in run.history_keys if "acc_pos" in key], "no panel per position"
    assert set(run.summary["val/acc"]) == {"max", "last"}
    csv_header = (wandb_sweep / "1" / "csv" / "metrics.csv").read_text().splitlines()[0]
    assert "val/acc_pos/8" in csv_header, "the CSV keeps the per-position columns"
    assert (wandb_sweep / "1" / "attention.png").stat().st_size > 1000


def test_offline_mode_does_not_leak_into_the_environment(tmp_path):
    logger = wandb_logger(str(tmp_path), "project=attnlab-test", "mode=offline")
    first = logger.experiment.id
    logger.finish()
    assert "WANDB_MODE" not in os.environ
    logger_2 = wandb_logger(str(tmp_path), "project=attnlab-test", "mode=offline")
    assert logger_2.experiment.id != first, "a finished run is never reused"
    logger_2.finish(exit_code=1)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ConfigError, match=r"logger.wandb.mode='onlne' is not one of"):
        wandb_logger(".", "mode=onlne")


def environment(tmp_path, **variables: str) -> dict[str, str]:
    """This environment without any W&B login: a home with no .netrc, no key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), NETRC=str(tmp_path / "netrc"), **variables)
    return env


@pytest.fixture
def listening_port():
    """A port on this machine that accepts connections (a stand-in W&B server)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no-login", "no-network"])
def test_online_without_login_or_network_stops_within_seconds_with_one_sentence(
    case, listening_port, tmp_path
):
    if case == "no-login":  # the server answers, but there is no key
        variables = {"WANDB_BASE_URL": f"http://127.0.0.1:{listening_port}"}
        reason = "there is no W&B login"
    else:
        variables = {"WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}
        reason = "the W&B server http://127.0.0.1:9 does not answer"
    start = time.monotonic()
    result = train_cli(
        "logger=wandb", "logger.wandb.mode=online", *TINY, f"hydra.run.dir={tmp_path / 'run'}",
        env=environment(tmp_path, **variables), timeout=120,
    )  # fmt: skip
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"attnlab: logger.wandb.mode=online, but {reason}"), result.stderr[
        -2000:
    ]
    assert "wandb sync" in last and "Traceback" not in result.stderr


def test_the_group_is_the_experiment_else_the_sweep_directory(tmp_path):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict, read_write

    from attnlab.logger.naming import default_group

    compose_config(["experiment=probe_table"], tmp_path)
    assert default_group() == "probe_table"
    compose_config([], tmp_path)
    assert default_group() is None, "a single run outside an experiment has no group"
    hydra = HydraConfig.get()
    try:
        with open_dict(hydra), read_write(hydra):
            hydra.mode = RunMode.MULTIRUN
            hydra.sweep.dir = "/logs/probe/multiruns/2026-01-02_03-04-05"
        assert default_group() == "2026-01-02_03-04-05"
    finally:  # the next test in this process must not find a sweep's Hydra config
        HydraConfig.instance().cfg = None


def test_a_translation_run_logs_sacrebleus_signatures_with_its_config(tmp_path):
    from attnlab.config.build import to_dict
    from attnlab.config.groups import ARCHITECTURE
    from attnlab.runner.loggers import logged_config
    from attnlab.tasks.seq2seq.system import Seq2SeqSystem

    cfg = compose_config(["task=multi30k", "model=tiny", "pe=t5"], tmp_path)
    architecture = {g: to_dict(cfg[g]) for g in ARCHITECTURE}
    settings = {k: v for k, v in to_dict(cfg.task.system).items() if k != "_target_"}
    arguments = Seq2SeqSystem.arguments(
        {"architecture": architecture, "optim": to_dict(cfg.task.optim), **settings}
    )
    system = Seq2SeqSystem(
        **arguments, src_vocab_size=20, tgt_vocab_size=20, pad_id=0, bos_id=1, eos_id=2
    )
    config = logged_config(to_dict(cfg), system)
    assert config["sacrebleu"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert config["sacrebleu"]["chrf"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    assert config["params"]["pe"] == system.parameter_counts()["pe"] > 0
    assert config["task"]["data"]["source"] == "hub" and "cache_dir" not in config["task"]["data"]
    assert config["decode"]["beam"] == 4 and config["optim"]["schedule"] == "inverse_sqrt"


def test_a_runs_name_is_the_choices_that_set_it_apart_and_short():
    from attnlab.logger.naming import NAME_LENGTH, run_name

    overrides = [
        "pe=rope", "norm=l2", "task.data.dir=../shared/data/multi30k", "logger=wandb",
        "++trainer.limit_val_batches=1", "hydra/launcher=joblib", "tags=[a,b]", "seed=1",
        "extras.print_config=false", "callbacks.progress_bar.refresh_rate=0",
    ]  # fmt: skip
    assert run_name(overrides) == "pe=rope,norm=l2,seed=1"
    long = run_name([f"model.d_model={'9' * 300}"])
    assert len(long) == NAME_LENGTH and long.endswith("…")
    assert run_name(["logger=wandb"]) is None  # then W&B names it


def test_a_single_run_is_grouped_by_its_task(tmp_path):
    logger = wandb_logger(str(tmp_path), "mode=offline", "job_type=probe")
    assert logger._wandb_init["group"] == "probe"


def test_a_name_and_group_given_are_the_runs(tmp_path):
    logger = wandb_logger(str(tmp_path), "mode=offline", "name=mine", "group=ours")
    assert (logger._wandb_init["name"], logger._wandb_init["group"]) == ("mine", "ours")


def test_the_logged_config_holds_no_file_location_and_one_epoch_budget(tmp_path):
    from types import SimpleNamespace

    from attnlab.config.build import to_dict
    from attnlab.runner.loggers import logged_config

    system = SimpleNamespace(describe=dict)  # what logged_config asks of a system
    translation = compose_config(
        ["task=multi30k", "task.data.source=local", "task.data.dir=../shared/data/multi30k"],
        tmp_path,
    )
    assert "dir" not in logged_config(to_dict(translation), system)["task"]["data"]
    config = logged_config(to_dict(compose_config(["trainer.max_epochs=2"], tmp_path)), system)
    assert config["trainer"]["max_epochs"] == 2 and "max_epochs" not in config["task"]
