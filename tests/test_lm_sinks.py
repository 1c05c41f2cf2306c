"""task.system.sink_windows: the attention sink (the weight queries give a window's first
token, per layer) measured at evaluation, against its value for uniform attention, and
logged by a real run at every evaluation length."""

from __future__ import annotations

import json
import subprocess
import sys

import lightning as L
import pytest
import torch
from conftest import QUIET
from helpers import ROOT, TEXT, compose_config
from test_lm import lm_overrides, write_splits
from test_lm_generation import save_lm_checkpoint

from attnlab.commands.generate import load_language_model
from attnlab.config.build import build
from attnlab.errors import ConfigError
from attnlab.runner.plan import Plan, build_system
from attnlab.runner.train import train


def uniform_share(length: int) -> float:
    """Queries 1..L−1 attending uniformly over their i + 1 keys give the first 1/(i + 1)."""
    return sum(1 / (i + 1) for i in range(1, length)) / (length - 1)


def test_uniform_attention_gives_the_first_token_its_share_at_every_length(make_config, tmp_path):
    cfg = make_config(lm_overrides(
        tmp_path, "pe=none", "task.data.block_size=8", "task.data.eval_lengths=[8,32]",
        "task.system.sink_windows=2",
    ))  # fmt: skip
    data = build(cfg.task.data)
    data.prepare_data()
    data.setup("test")
    system = build_system(Plan.from_config(cfg), data)
    with torch.no_grad():  # q = k = 0: every score 0, every row uniform
        for block in system.net.stack.blocks:
            q_and_k = sum(block.self_attn.widths[:2])
            block.self_attn.qkv_proj.weight[:q_and_k] = 0
            block.self_attn.qkv_proj.bias[:q_and_k] = 0
    trainer = L.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    (metrics,) = trainer.test(system, datamodule=data, verbose=False)
    record = json.loads((tmp_path / "lengths" / "test.json").read_text())["lengths"]
    for length in (8, 32):
        layers = record[str(length)]["sink_by_layer"]
        assert layers == pytest.approx([uniform_share(length)] * 2, rel=1e-6)
        assert metrics[f"test/sink@{length}"] == pytest.approx(uniform_share(length), rel=1e-6)


def test_a_run_logs_the_sink_of_every_length_and_none_by_default(make_config, tmp_path):
    overrides = ["pe=alibi", "task.data.block_size=8", "task.data.eval_lengths=[8,16]",
                 "trainer.max_steps=2", "trainer.val_check_interval=2", "task.system.samples=0"]  # fmt: skip
    metrics = train(make_config(lm_overrides(tmp_path, *overrides, "task.system.sink_windows=1")))
    assert all(0 < metrics[f"test/sink@{n}"] < 1 for n in (8, 16))
    record = json.loads((tmp_path / "lengths" / "test.json").read_text())["lengths"]
    assert len(record["16"]["sink_by_layer"]) == 2
    plain = train(compose_config([*QUIET, *lm_overrides(tmp_path, *overrides)], tmp_path / "b"))
    assert not any(name.startswith("test/sink") for name in plain)


def test_a_negative_number_of_windows_is_one_sentence(make_config, tmp_path):
    cfg = make_config(lm_overrides(tmp_path, "task.system.sink_windows=-1"))
    with pytest.raises(ConfigError, match="sink_windows"):
        build_system(Plan.from_config(cfg), build(cfg.task.data))


def test_a_checkpoint_written_before_the_option_existed_still_loads(make_config, tmp_path):
    path = save_lm_checkpoint(make_config, tmp_path / "lm.ckpt")
    checkpoint = torch.load(path, weights_only=False)
    del checkpoint["hyper_parameters"]["sink_windows"]
    torch.save(checkpoint, path)
    assert load_language_model(str(path)).sink_windows == 0


@pytest.mark.slow
def test_two_ddp_ranks_measure_and_reduce_the_sinks_of_every_length(tmp_path):
    """Each rank measures its own first whole windows; a length where one rank has none
    still reduces (zeros), so no rank waits on another."""
    data = write_splits(tmp_path / "text", train=TEXT * 20, test=TEXT * 3)
    run = subprocess.run(
        [sys.executable, "train.py", "trainer=ddp_cpu", "task=lm", "task.data.source=local",
         f"task.data.dir={data}", "task.data.tokenizer=char", "task.data.block_size=8",
         "task.data.eval_lengths=[8,64,128]", f"paths.data_dir={tmp_path / 'cache'}",
         "model=tiny", "trainer.max_steps=2", "trainer.max_epochs=-1",
         "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=2",
         "task.system.sink_windows=1", "task.system.samples=0", *QUIET,
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "lengths" / "test.json").read_text())["lengths"]
    for length in ("8", "64", "128"):
        assert len(record[length]["sink_by_layer"]) == 2
        assert 0 < record[length]["sink"] < 1
