"""Runs that fit on a disk: the best checkpoint holds what evaluation needs, a finished sweep
job drops its training state, `attnlab prune` frees what finished runs no longer need."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import QUIET
from helpers import compose_config

from attnlab import status
from attnlab.commands.cli import main as attnlab
from attnlab.commands.prune import TRAINING_STATE, prune
from attnlab.errors import ConfigError
from attnlab.runner.resume import training_arguments
from attnlab.runner.train import train
from attnlab.stored import RECORD_KEY

TINY = ["model=tiny", "task.data.train_size=256", "task.data.max_len=8", "trainer.max_epochs=2"]


def keys(path: Path) -> set[str]:
    return set(torch.load(path, weights_only=True))


def test_the_best_checkpoint_holds_weights_and_the_record_not_the_optimizer(make_config, tmp_path):
    train(make_config(TINY))
    (best,) = (tmp_path / "checkpoints").glob("epoch_*.ckpt")
    assert {"state_dict", RECORD_KEY} <= keys(best) and not keys(best) & set(TRAINING_STATE)
    assert "optimizer_states" in keys(tmp_path / "checkpoints" / "last.ckpt")
    assert best.stat().st_size < (tmp_path / "checkpoints" / "last.ckpt").stat().st_size / 2
    with pytest.raises(
        ConfigError, match=r"holds the weights only .* resume from checkpoints/last"
    ):
        training_arguments([f"ckpt_path={best}"])


def test_a_finished_run_with_keep_when_done_false_drops_its_training_state(make_config, tmp_path):
    train(make_config([*TINY, "callbacks.latest.keep_when_done=false"]))
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert len(list((tmp_path / "checkpoints").glob("epoch_*.ckpt"))) == 1


@pytest.mark.parametrize("sweep_job", [False, True], ids=["single_run", "sweep_job"])
def test_by_default_a_finished_sweep_job_drops_its_training_state_and_a_single_run_keeps_it(
    sweep_job, tmp_path
):
    """callbacks.latest.keep_when_done null: a job of a -m sweep (multirun.yaml beside its
    directory, as when it is resumed on its own) drops last.ckpt once done."""
    run_dir = tmp_path / "sweep" / "0"
    if sweep_job:
        run_dir.parent.mkdir()
        (run_dir.parent / "multirun.yaml").write_text("hydra: {}\n")
    train(compose_config([*QUIET, *TINY], run_dir))
    assert (run_dir / "checkpoints" / "last.ckpt").exists() != sweep_job
    assert len(list((run_dir / "checkpoints").glob("epoch_*.ckpt"))) == 1


def test_prune_frees_finished_runs_and_leaves_the_others_whole(make_config, tmp_path, capsys):
    # a best checkpoint as written before they held the weights only
    train(make_config([*TINY, "callbacks.model_checkpoint.save_weights_only=false"]))
    sweep = tmp_path.parent / f"{tmp_path.name}_sweep"
    shutil.copytree(tmp_path, sweep / "0")
    shutil.copytree(tmp_path, sweep / "1")
    running = status.read(sweep / "1")
    running.state = "interrupted"
    running.write(sweep / "1")
    (best,) = (sweep / "0" / "checkpoints").glob("epoch_*.ckpt")
    before = best.stat().st_size
    attnlab(["prune", str(sweep)])
    assert "1 finished runs below" in capsys.readouterr().out
    assert not (sweep / "0" / "checkpoints" / "last.ckpt").exists()
    assert best.stat().st_size < before and not keys(best) & set(TRAINING_STATE)
    assert {"state_dict", RECORD_KEY} <= keys(best)
    assert (sweep / "1" / "checkpoints" / "last.ckpt").is_file(), "an interrupted run resumes"
    assert prune(sweep).files == 0, "a second prune finds nothing left"
    shutil.copytree(tmp_path, sweep / "2")
    (sweep / "2" / "status.json").write_text('{"state": "completed", "started": "noon"}')
    attnlab(["prune", str(sweep)])
    assert (
        f"left whole, as its status cannot be read: {sweep / '2' / 'status.json'} records "
        "started='noon', not of type int"
    ) in capsys.readouterr().out
    assert (sweep / "2" / "checkpoints" / "last.ckpt").is_file()


def test_prune_keeps_last_ckpt_where_it_holds_the_only_weights(make_config, tmp_path):
    train(make_config(TINY))
    for best in (tmp_path / "checkpoints").glob("epoch_*.ckpt"):
        best.unlink()
    assert prune(tmp_path).files == 0
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_prune_frees_a_run_whose_best_checkpoint_is_named_by_step(make_config, tmp_path):
    train(make_config([*TINY, "callbacks.model_checkpoint.save_weights_only=false"]))
    checkpoints = tmp_path / "checkpoints"
    (best,) = checkpoints.glob("epoch_*.ckpt")
    best = best.rename(checkpoints / "step_000064.ckpt")  # as a run validated by steps names it
    assert prune(tmp_path).files == 2
    assert not (checkpoints / "last.ckpt").exists() and not keys(best) & set(TRAINING_STATE)
