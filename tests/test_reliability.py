"""Every bad input stops before any work with one sentence: the option, the value, the fix.

Each row is a real command line: (arguments, the start of the last line it prints). The
translation-data cases run in process on small files these tests write.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, first_then_slow, train_py
from test_decoding import model as decoding_model
from test_translation_data import local, sentence_pairs, write_split

from attnlab.decoding.encoder_decoder import max_target_lengths
from attnlab.errors import ConfigError

CASES = [
    (["model.dmodel=64"], "attnlab: model.dmodel is not a setting (did you mean model.d_model?): model has"),
    (["model.d_model=abc"], "attnlab: model.d_model='abc' must be a positive integer"),
    (["model.n_heads=0"], "attnlab: model.n_heads=0 must be a positive integer"),
    (["model.n_heads=-2"], "attnlab: model.n_heads=-2 must be a positive integer"),
    (["model.n_layers=0"], "attnlab: model.n_layers=0 must be a positive integer"),
    (["model.dropout=1.5"], "attnlab: model.dropout=1.5 must be a probability in [0, 1)"),
    (["task.data.batch_size=0"], "attnlab: task.data.batch_size=0 must be a positive integer"),
    (["task.data.train_size=0"], "attnlab: task.data.train_size=0 must be a positive integer"),
    (["task.optim.lr=-0.001"], "attnlab: task.optim.lr=-0.001 must be a positive number"),
    (["task.optim.betas=[0.9]"], "attnlab: task.optim.betas=[0.9] must be two numbers in [0, 1)"),
    (["decode.beam=0"], "attnlab: decode.beam=0 must be a positive integer"),
    (["decode.val_beam=0"], "attnlab: decode.val_beam=0 must be a positive integer"),
    (["trainer.max_epcohs=3"], "attnlab: trainer.max_epcohs is not a setting (did you mean trainer.max_epochs?)"),
    (["task=multi30k", "task.data.max_tokens=64"], "attnlab: task.data.max_tokens is now spelled task.data.batching.max_tokens"),
    (["task=chitchat", "task.data.tokenizer_pairs=9"], "attnlab: task.data.tokenizer_pairs is now spelled task.data.tokenizer.pairs"),
    (["task=multi30k", "task.data.batching=64"], "attnlab: task.data.batching=64 must be a node of settings (max_tokens, max_len, max_len_ratio, max_eval_len, train_size, sort_chunk)"),
    (["task=chitchat", "~task.data.batching.max_len"], "attnlab: 'task.data.batching' needs the option max_len: set it in its YAML"),
    (["model.d_model=100", "model.n_heads=3"], "attnlab: model.d_model=100 is not divisible by model.n_heads=3"),
    (["run_dir=/nonexistent/run"], "attnlab: run_dir=/nonexistent/run has no checkpoints/last.ckpt to resume from"),
    (["ckpt_path=/nonexistent.ckpt"], "attnlab: /nonexistent.ckpt is not a file: pass a checkpoint written by train.py"),
    (["ckpt_path=https://example.com/x.ckpt"], "attnlab: https://example.com/x.ckpt is a URL: download the checkpoint"),
]  # fmt: skip


@pytest.mark.parametrize("args,sentence", first_then_slow(CASES, [" ".join(a) for a, _ in CASES]))
def test_train_py_stops_with_one_sentence(args, sentence, tmp_path):
    result = subprocess.run(
        [sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(sentence), result.stderr[-1500:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists(), "it stopped before any work"


def test_eval_py_without_a_checkpoint_says_what_to_pass():
    result = subprocess.run(
        [sys.executable, "eval.py"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "attnlab: eval.py needs the checkpoint to evaluate: pass ckpt_path=<run>/checkpoints/"
        "last.ckpt (the latest state) or <run>/checkpoints/epoch_NNN.ckpt (the best; "
        "step_NNNNNN.ckpt in a run that validates by steps)"
    )


def test_a_mistyped_option_still_lists_the_valid_ones(tmp_path):
    result = subprocess.run(
        [sys.executable, "train.py", "norm=l3", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and "attnlab: norm=l3 is not an option: norm has" in result.stderr
    assert "softmax" in result.stderr and "l2_act" in result.stderr


# --- translation data -----------------------------------------------------------------------


def corpus_with(directory: Path, **splits: list[tuple[str, str]]) -> Path:
    for split, pairs in splits.items():
        write_split(directory, split, pairs)
    return directory


@pytest.mark.parametrize(
    "train",
    [[], [("", "")] * 5, [("   ", "\t")] * 5],
    ids=["empty", "empty-lines", "blank"],
)
def test_training_files_without_text_are_one_sentence(train, tmp_path):
    directory = corpus_with(tmp_path / "c", train=train, valid=sentence_pairs(5))
    with pytest.raises(
        ConfigError, match=r"train\.\{en,de\} holds no pair with text on both sides"
    ):
        local(directory, tmp_path / "cache").prepare_data()


def test_an_empty_validation_file_is_one_sentence(tmp_path):
    directory = corpus_with(tmp_path / "c", train=sentence_pairs(100), valid=[])
    with pytest.raises(ConfigError, match=r"the valid split .* holds no pair with text on both"):
        local(directory, tmp_path / "cache").setup()


def test_crlf_files_and_paths_with_spaces_work(tmp_path):
    directory = tmp_path / "my corpus"
    for split, pairs in (("train", sentence_pairs(100)), ("valid", sentence_pairs(10, seed=1))):
        directory.mkdir(exist_ok=True)
        for side, lang in enumerate(("en", "de")):
            text = "".join(f"{pair[side]}\r\n" for pair in pairs)
            (directory / f"{split}.{lang}").write_bytes(text.encode())
    datamodule = local(directory, tmp_path / "cache dir")
    datamodule.setup()
    refs = [ref for batch in datamodule.val_dataloader() for ref in batch["ref"]]
    assert sorted(refs) == sorted(pair[1] for pair in sentence_pairs(10, seed=1))
    assert not any("\r" in ref for ref in refs)


def test_an_evaluation_pair_beyond_the_limit_is_cut_and_its_line_named(tmp_path, caplog):
    valid = sentence_pairs(10, seed=1)
    valid[6] = (" ".join(["man runs"] * 400), "mann rennt")
    directory = corpus_with(tmp_path / "c", train=sentence_pairs(100), valid=valid)
    datamodule = local(directory, tmp_path / "cache", max_eval_len=64)
    with caplog.at_level(logging.WARNING):
        datamodule.setup()
    assert "valid: 1 pairs are longer than task.data.max_eval_len=64 tokens" in caplog.text
    assert "(lines 7)" in caplog.text
    lengths = [batch["src"].shape[1] for batch in datamodule.val_dataloader()]
    assert max(lengths) == 64 and datamodule.max_seq_len == 64
    refs = [ref for batch in datamodule.val_dataloader() for ref in batch["ref"]]
    assert "mann rennt" in refs, "the reference stays whole"


def test_hypotheses_end_by_the_absolute_cap_whatever_the_source_length():
    padding = torch.zeros(2, 5000, dtype=torch.bool)
    padding[1, 10:] = True
    limits = max_target_lengths(decoding_model(pe="sinusoidal"), padding, 1.2, 10, 256)
    assert limits.tolist() == [256, 22]


def test_a_lightning_trainer_argument_not_in_the_trainer_config_is_a_setting():
    from attnlab.runner.preflight import check_setting_keys

    args = ["trainer.accumulate_grad_batches=2", "trainer.max_epochs=3", "pe=rope"]
    assert check_setting_keys(args, "train") == ["++trainer.accumulate_grad_batches=2", *args[1:]]
    with pytest.raises(ConfigError, match=r"did you mean trainer.accumulate_grad_batches\?"):
        check_setting_keys(["trainer.acumulate_grad_batches=2"], "train")


@pytest.mark.slow
def test_train_py_takes_a_trainer_argument_and_uses_it(tmp_path):
    train_py(tmp_path, "trainer.accumulate_grad_batches=2", "task.data.train_size=256")
    # 256 examples in batches of 64, two batches an optimizer step
    assert '"steps": 2' in (tmp_path / "status.json").read_text()
