"""Every entry point that runs a model flushes subnormal floats before anything else."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import attnlab.commands.cli as cli
import attnlab.runner.evaluate as evaluate
import attnlab.runner.train as train
import attnlab.tensors as tensors
from attnlab.tensors import flush_denormals


def test_flushing_makes_a_subnormal_float_zero():
    tiny = 1e-39  # below float32's smallest normal, 2^-126
    assert torch.tensor([tiny]).item() != 0.0
    flush_denormals()
    assert torch.tensor([tiny]).item() == 0.0


class Flushed(Exception):
    pass


def refuse(*_args, **_kwargs):
    raise Flushed


@pytest.mark.parametrize(
    "entry",
    [
        lambda: train.train_main.__wrapped__(None),
        lambda: evaluate.main(),
        lambda: cli.main(["generate", "ckpt_path=x"]),
        lambda: cli.main(["translate", "ckpt_path=x"]),
    ],
    ids=["train.py's job", "eval.py", "attnlab generate", "attnlab translate"],
)
def test_each_entry_point_flushes_first(entry, monkeypatch):
    """train.py's main() checks the command line, computing nothing with a model, and hands
    every run (and every sweep's job) to train_main, which flushes first."""
    monkeypatch.setattr(tensors, "flush_denormals", refuse)
    monkeypatch.setattr(evaluate, "flush_denormals", refuse)
    monkeypatch.setattr(sys, "argv", ["train.py", "pe=nonexistent"])
    with pytest.raises(Flushed):
        entry()


def test_the_threads_of_a_run_flush_too():
    """In a fresh process, flushing first reaches torch's worker threads (they copy the setting
    when they start): a product computed in parallel comes out zero."""
    code = (
        "import torch; from attnlab.tensors import flush_denormals; flush_denormals(); "
        "torch.set_num_threads(2); x = torch.full((1 << 22,), 1e-20); "
        "print(int((x * 1e-19).count_nonzero()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"
