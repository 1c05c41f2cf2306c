"""Checkpoints: written whole or not at all, read without running code, rebuilt only from
allowed overrides, and evaluated only as the model they hold."""

from __future__ import annotations

import copy
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, train_py
from hydra.errors import ConfigCompositionException

from attnlab.config.build import to_dict
from attnlab.errors import ConfigError
from attnlab.runner.checkpoints import AtomicCheckpointIO, LatestCheckpoint
from attnlab.runner.resume import (
    RECORD_KEY,
    allowed_overrides,
    best_files,
    for_callbacks_chosen,
    read_checkpoint,
    stored_overrides,
)
from attnlab.runner.same_model import check_same_model

SHM = Path("/dev/shm")

SAVE_TWICE = """
import sys, torch
from attnlab.runner.checkpoints import AtomicCheckpointIO
io = AtomicCheckpointIO()
io.save_checkpoint({"n": 1, "w": torch.zeros(2**24)}, sys.argv[1])
print("saving", flush=True)
io.save_checkpoint({"n": 2, "w": torch.ones(2**27)}, sys.argv[1])
print("saved", flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm to put TMPDIR on another filesystem")
def test_a_save_killed_halfway_leaves_the_previous_checkpoint_whole(tmp_path):
    target = tmp_path / "checkpoints" / "last.ckpt"
    tmpdir = Path(SHM / f"attnlab-test-{os.getpid()}")
    tmpdir.mkdir()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", SAVE_TWICE, str(target)], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "TMPDIR": str(tmpdir)},
        )  # fmt: skip
        assert process.stdout.readline().strip() == "saving"
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 0 for p in target.parent.glob(".last.ckpt.partial-*")):
            assert time.monotonic() < deadline and process.poll() is None, "the save ended first"
            time.sleep(0.001)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert torch.load(target, weights_only=True)["n"] == 1, "the earlier checkpoint is whole"
        assert list(tmpdir.iterdir()) == [], "nothing left in TMPDIR"
        AtomicCheckpointIO().save_checkpoint({"n": 3}, target)
        assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"], "the orphan is gone"
    finally:
        for leftover in tmpdir.iterdir():
            leftover.unlink()
        tmpdir.rmdir()


def test_training_writes_checkpoints_through_the_atomic_io(make_config):
    from attnlab.config.build import to_dict
    from attnlab.runner.trainer import build_trainer

    trainer = build_trainer(to_dict(make_config(["model=tiny"])))
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


STEPS = ["trainer.max_steps=4", "trainer.max_epochs=-1"]


@pytest.mark.parametrize(
    "overrides,name",
    [
        ([], "epoch_{epoch:03d}"),
        (["task=lm"], "epoch_{epoch:03d}"),
        (STEPS, "epoch_{epoch:03d}"),  # validated at each epoch's end
        ([*STEPS, "trainer.val_check_interval=2"], "step_{step:06d}"),
        ([*STEPS, "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=2"], "step_{step:06d}"),
        (["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=2"], "epoch_{epoch:03d}"),
        (["trainer.val_check_interval=0.5"], "epoch_{epoch:03d}"),
        (["experiment=length_generalization"], "step_{step:06d}"),
        (["experiment=lm_shakespeare_char"], "step_{step:06d}"),
    ],
)  # fmt: skip
def test_the_best_checkpoint_is_named_by_step_where_the_run_validates_by_steps(
    overrides, name, make_config
):
    assert to_dict(make_config(overrides))["callbacks"]["model_checkpoint"]["filename"] == name


def test_a_run_that_validates_by_steps_names_its_best_checkpoint_by_step(make_config, tmp_path):
    from attnlab.runner.train import train

    budget = [*STEPS, "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=2"]
    train(make_config(["model=tiny", "task.data.train_size=64", "test=false", *budget]))
    (best,) = best_files(tmp_path / "checkpoints")
    assert re.fullmatch(r"step_00000[24]\.ckpt", best.name)


def test_a_callback_set_to_null_is_left_out(make_config):
    from attnlab.config.build import to_dict
    from attnlab.runner.callbacks import AttentionMaps
    from attnlab.runner.trainer import build_trainer

    def kinds(*overrides: str) -> set[str]:
        trainer = build_trainer(to_dict(make_config(["model=tiny", *overrides])))
        return {type(found).__name__ for found in trainer.callbacks}

    assert AttentionMaps.__name__ in kinds()
    left = kinds("callbacks.attention_maps=null")
    assert AttentionMaps.__name__ not in left and "LatestCheckpoint" in left


@pytest.mark.parametrize(
    "override,kept",
    [
        ("pe=rope", True),
        ("~logger", True),
        ("pe@pe.base=rope", True),
        ("model.d_model=64", True),
        ("task.data.dir=../shared/data/multi30k", True),
        ("tags=[a,b]", True),
        ("+callbacks.evil._target_=os.makedirs", False),
        ("callbacks.early_stopping.min_delta=0.05", True),
        ("callbacks.latest.keep_when_done=false", True),
        ("callbacks.latest.every_n_steps=null", True),
        ("callbacks.progress_bar.refresh_rate=0", True),
        ("callbacks.attention_maps.filename=../../x.png", False),
        ("callbacks.attention_maps.filename=null", False),
        ("callbacks.model_checkpoint.monitor=null", False),
        ("callbacks.model_checkpoint.save_top_k=-1", False),
        ("callbacks.early_stopping.monitor=val/bleu", False),
        ("callbacks.early_stopping.patience='${oc.env:HOME}'", False),
        ("+callbacks.early_stopping.patience=1", False),
        ("++callbacks.evil.patience=1", False),
        ("~callbacks.finite_loss", False),
        ("callbacks.finite_loss=null", False),
        ("callbacks.model_checkpoint.dirpath=null", False),
        ("+trainer.plugins={_target_:os.system}", False),
        ("trainer._target_=os.system", False),
        ("hydra.run.dir=/tmp/x", False),
        ("hydra/launcher=joblib", False),
        ("logger.wandb.mode=online", False),
        ("pe=../../etc/passwd", False),
        ("model.d_model=32,64", False),
    ],
)
def test_only_allowed_stored_overrides_are_reused(override, kept):
    assert allowed_overrides([override], "a checkpoint") == ([override] if kept else [])


def test_choosing_the_callbacks_anew_drops_the_stored_callback_options(make_config, capsys):
    stored = ["callbacks=early_stopping", "callbacks.early_stopping.patience=1", "pe=rope"]
    args = ["callbacks=default"]
    with pytest.raises(
        ConfigCompositionException,
        match=r"Could not override 'callbacks\.early_stopping\.patience'",
    ):
        make_config([*stored, *args])
    kept = for_callbacks_chosen(stored, args)
    assert kept == ["callbacks=early_stopping", "pe=rope"]
    assert (
        "callbacks=default on the command line replaces callbacks.early_stopping.patience=1"
        in capsys.readouterr().err
    )
    assert "early_stopping" not in make_config([*kept, *args]).callbacks
    assert for_callbacks_chosen(stored, ["pe=t5"]) == stored
    assert for_callbacks_chosen(stored, ["callbacks=early_stopping"]) == stored, "the same choice"
    assert for_callbacks_chosen(stored, ["~callbacks"]) == ["callbacks=early_stopping", "pe=rope"]


@pytest.mark.parametrize(
    "every",
    [{"every_n_steps": 0}, {"every_n_minutes": 0}, {"every_n_steps": -5}, {"every_n_steps": 0.5}],
)
def test_a_latest_checkpoint_every_zero_or_fewer_steps_or_minutes_is_one_sentence(every, tmp_path):
    options = {"every_n_minutes": None, "every_n_steps": None, **every}
    (value,) = every.values()
    unit = "steps" if "every_n_steps" in every else "minutes"
    with pytest.raises(ConfigError, match=f"saves every {value} {unit}: give a (whole|positive)"):
        LatestCheckpoint(str(tmp_path), keep_when_done=True, **options)


def test_the_latest_checkpoint_saves_after_the_best_checkpoint_and_early_stopping(tmp_path):
    """Whatever order the config lists them in: Lightning calls the monitoring callbacks (early
    stopping, every Checkpoint) last, in list order, where an epoch ends."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from attnlab.runner.trainer import state_savers_last

    latest = LatestCheckpoint(str(tmp_path), None, None, keep_when_done=True)
    best, stopping = ModelCheckpoint(dirpath=tmp_path), EarlyStopping(monitor="val/loss")
    assert state_savers_last([latest, best, stopping]) == [best, stopping, latest]


DIALOGUE = "attnlab.tasks.dialogue.DialogueDataModule"  # as runs recorded it before the move


@pytest.mark.parametrize(
    "data,added",
    [
        ({"_target_": DIALOGUE, "seed": 2}, ["task.data.data_seed=2"]),  # before data_seed
        ({"_target_": DIALOGUE, "seed": 2, "data_seed": 0}, []),  # recorded with it
        ({"_target_": "attnlab.tasks.probe.ProbeDataModule", "seed": 2}, []),  # no data seed
        ({"_target_": DIALOGUE, "seed": "${oc.env:HOME}"}, []),  # never a stored string
    ],
)
def test_a_run_recorded_before_data_seed_keeps_the_data_its_seed_drew(data, added):
    record = {
        "overrides": ["seed=2"],
        "config": {"paths": {"root_dir": "/r"}, "task": {"data": data}},
    }
    assert stored_overrides(record) == ["seed=2", *added]


MQAR = "attnlab.tasks.mqar.MQAR"  # as runs recorded it before the move


@pytest.mark.parametrize(
    "generator,added",
    [
        ({"_target_": MQAR}, ["task.data.generator.layout=answers_after"]),  # before layout
        ({"_target_": MQAR, "layout": "zoology"}, []),  # recorded with it
        ({"_target_": "attnlab.tasks.copy.Copy"}, []),
    ],
)
def test_an_mqar_run_recorded_before_layout_keeps_the_layout_it_learned(generator, added):
    record = {
        "overrides": ["task=mqar"],
        "config": {"paths": {"root_dir": "/r"}, "task": {"data": {"generator": generator}}},
    }
    assert stored_overrides(record) == ["task=mqar", *added]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real checkpoint of a 1-epoch tiny probe run."""
    run_dir = tmp_path_factory.mktemp("run")
    train_py(run_dir, "task.data.train_size=64", "task.data.max_len=8", "test=false")
    return run_dir / "checkpoints" / "last.ckpt"


def eval_py(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "eval.py", *args, f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.mkdir, (self.marker,))


@pytest.mark.slow
def test_a_checkpoint_that_would_run_code_is_refused_unrun(checkpoint, tmp_path):
    data = torch.load(checkpoint, weights_only=True)
    data["extra"] = Payload(tmp_path / "ran")
    evil = tmp_path / "evil.ckpt"
    torch.save(data, evil)
    result = eval_py(f"ckpt_path={evil}", tmp_path=tmp_path)
    assert result.returncode == 1 and not (tmp_path / "ran").exists()
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"attnlab: {evil} holds a Python object (getattr) besides tensors and plain data"
        )
    )


@pytest.mark.slow
def test_a_checkpoint_recorded_before_the_task_packages_evaluates(checkpoint, tmp_path):
    """A run recorded when the probe's data and system were attnlab.tasks.probe and
    attnlab.systems.tagger (before each task family became one package) still evaluates."""
    data = torch.load(checkpoint, weights_only=True)
    task = data[RECORD_KEY]["config"]["task"]
    assert task["system"]["_target_"] == "attnlab.tasks.probe.system.TaggerSystem"
    task["data"]["_target_"] = "attnlab.tasks.probe.ProbeDataModule"
    task["system"]["_target_"] = "attnlab.systems.tagger.TaggerSystem"
    old = tmp_path / "old.ckpt"
    torch.save(data, old)
    result = eval_py(f"ckpt_path={old}", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "test/acc" in result.stdout + result.stderr


@pytest.mark.slow
def test_stored_overrides_that_name_code_are_not_reused(checkpoint, tmp_path):
    data = torch.load(checkpoint, weights_only=True)
    marker = tmp_path / "made"
    evil = ["+callbacks.evil._target_=os.makedirs", f"+callbacks.evil.name={marker}"]
    data[RECORD_KEY]["overrides"] += evil
    path = tmp_path / "stored.ckpt"
    torch.save(data, path)
    result = eval_py(f"ckpt_path={path}", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not marker.exists()
    (refused,) = [line for line in result.stderr.splitlines() if "not reusing" in line]
    assert refused.startswith("attnlab: not reusing these overrides of the checkpoint: ")
    assert refused.endswith(" ".join(evil))


@pytest.mark.parametrize("size", ["half", 0, 1000])
def test_reading_a_truncated_or_empty_checkpoint_says_so(size, tmp_path):
    whole = tmp_path / "whole.ckpt"
    AtomicCheckpointIO().save_checkpoint(
        {RECORD_KEY: {"overrides": []}, "state_dict": {"w": torch.ones(4096)}}, whole
    )
    data = whole.read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 2 if size == "half" else size])
    with pytest.raises(ConfigError) as refusal:
        read_checkpoint(cut)
    assert str(refusal.value).startswith(f"{cut} cannot be read as a checkpoint (")
    assert str(refusal.value).endswith(
        "it is truncated, not a checkpoint, or holds objects other than tensors and plain data"
    )


@pytest.mark.slow
@pytest.mark.parametrize("size", ["half", 0, 1000])
def test_a_truncated_or_empty_checkpoint_is_one_sentence(size, checkpoint, tmp_path):
    data = checkpoint.read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 2 if size == "half" else size])
    result = eval_py(f"ckpt_path={cut}", tmp_path=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"attnlab: {cut} cannot be read as a checkpoint (")
    assert last.endswith(
        "it is truncated, not a checkpoint, or holds objects other than tensors and plain data"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "program,overrides,change",
    [
        ("eval.py", ["pe=learned", "norm=l2"], "pe.name=sinusoidal (not learned), norm.name=softmax (not l2)"),
        ("eval.py", ["model.d_model=64"], "model.d_model=32 (not 64)"),
        ("train.py", ["task=multi30k"], "task.name=probe (not multi30k)"),
    ],
)  # fmt: skip
def test_a_checkpoint_is_used_only_as_the_model_it_holds(
    program, overrides, change, checkpoint, tmp_path
):
    result = subprocess.run(
        [sys.executable, program, f"ckpt_path={checkpoint}", *overrides,
         f"hydra.run.dir={tmp_path / 'other'}", "extras.print_config=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert f"uses the model stored in the checkpoint, which has {change}" in last, last


def test_kernels_and_initialization_are_not_the_model(make_config):
    """A checkpoint of an older attnlab (FlexAttention on by default, learned positions drawn
    with std 0.02) is the same model under today's defaults."""
    config = to_dict(make_config(["pe=learned", "model=tiny"]))
    stored = copy.deepcopy(config)
    stored["model"]["flex_attention"], stored["pe"]["init_std"] = True, 0.02
    check_same_model(config, stored, "eval.py")
    stored["model"]["d_model"] = 2 * config["model"]["d_model"]
    with pytest.raises(ConfigError, match=r"model\.d_model="):
        check_same_model(config, stored, "eval.py")


def test_a_translation_run_recorded_before_the_data_nodes_resumes_in_todays_spelling():
    from attnlab.runner.resume import respelled

    old = ["task.data.max_tokens=2048", "++task.data.tokenizer_pairs=10", "pe=rope", "seed=2"]
    new = [
        "task.data.batching.max_tokens=2048",
        "++task.data.tokenizer.pairs=10",
        "pe=rope",
        "seed=2",
    ]
    data = {
        "_target_": "attnlab.tasks.translation.TranslationDataModule",  # as recorded then
        "max_tokens": 2048,
    }
    assert respelled(old, {"task": {"data": data}}) == new
    today = {**data, "batching": {"max_tokens": 2048}}
    assert respelled(new, {"task": {"data": today}}) == new
    probe = {"_target_": "attnlab.tasks.probe.ProbeDataModule", "train_size": 64}
    assert respelled(["task.data.train_size=64"], {"task": {"data": probe}}) == [
        "task.data.train_size=64"
    ]
