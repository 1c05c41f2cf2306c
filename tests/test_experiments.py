"""Every experiment config composes and runs one fast_dev_run job (its sweep's first cell
is the config without -m)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, SHARED_DATA
from omegaconf import OmegaConf

from attnlab.config.options import options
from attnlab.runner.train import train

MULTI30K = SHARED_DATA / "multi30k"
SHAKESPEARE = SHARED_DATA / "tinyshakespeare"
SMALL_DATA = {
    "probe": ["task.data.train_size=64"],
    "multi30k": [
        "task.data.source=local", f"task.data.dir={MULTI30K}",
        "task.data.batching.train_size=300", "task.data.tokenizer.vocab_size=500",
    ],
    "chitchat": [
        "task.data.tokenizer.vocab_size=500", "task.data.tokenizer.pairs=5000",
        "task.data.batching.train_size=64", "task.system.val_generate=8",
    ],
    "lm": [],
}  # fmt: skip
SMALL_DATA |= {
    task: ["task.data.train_size=64"] for task in options("task") if task not in SMALL_DATA
}
SMALL_EXPERIMENT = {  # an experiment its task's small data does not fit: GPT-2 small's corpus
    "lm_gpt2_small": [
        f"task.data.dir={SHAKESPEARE}", "task.data.vocab_size=256", "task.data.tokenizer_lines=2000",
        "task.data.block_size=64", "task.data.batch_size=2", "task.data.tokens_per_step=128",
        "task.data.val_tokens=512", "task.data.eval_lengths=[64,128]",
        "task.data.eval_batch_tokens=512", "pe.max_len=128", "model.d_model=64", "model.n_heads=4",
        "model.n_layers=2", "model.d_ff=128",
    ],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_runs_one_fast_dev_run_job(experiment, make_config, tmp_path):
    task = make_config([f"experiment={experiment}"]).task.name
    if task == "multi30k" and not MULTI30K.is_dir():
        pytest.skip(f"the shared Multi30k files are not at {MULTI30K}")
    if task == "lm" and not SHAKESPEARE.is_dir():
        pytest.skip(f"the shared Tiny Shakespeare is not at {SHAKESPEARE}")
    cfg = make_config(
        [f"experiment={experiment}", "model=tiny", "debug=fast", f"paths.data_dir={tmp_path}",
         *SMALL_DATA[task], *SMALL_EXPERIMENT.get(experiment, [])]
    )  # fmt: skip
    metrics = train(cfg)
    assert metrics["train/loss"] > 0


@pytest.mark.slow
def test_part_of_an_experiment_runs_with_its_swept_keys_replaced_on_the_command_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "train.py", "-m", "experiment=probe_table", "pe=rope,t5", "seed=0",
            "model=tiny", "debug=fast", "extras.print_config=false",
            "callbacks.progress_bar.refresh_rate=0", f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = [p for p in tmp_path.iterdir() if p.name.isdigit()]
    assert len(jobs) == 8, "pe 2 × norm 2 × markers 2 × seed 1"
    chosen = {(job / ".hydra" / "overrides.yaml").read_text() for job in jobs}
    assert all("pe=rope" in text or "pe=t5" in text for text in chosen)
    assert all("seed=0" in text for text in chosen)


def test_the_paper_protocol_sweeps_the_papers_five_encodings_and_tasks():
    """Kazemnejad et al. 2023 compare NoPE, absolute (sinusoidal), T5, ALiBi and rotary; full
    rotary runs beside the quarter-head one of the second command."""
    sweep = OmegaConf.load(ROOT / "conf/experiment/length_generalization_paper.yaml").hydra
    params = sweep.sweeper.params
    assert set(params.pe.split(",")) == {"none", "sinusoidal", "rope", "t5", "alibi"}
    assert set(params.task.split(",")) == {"copy", "reverse", "sort", "addition", "parity"}
