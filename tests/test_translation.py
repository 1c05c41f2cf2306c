"""Translation end to end on real sentences: training, decoding, BLEU, eval.py, hypotheses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from helpers import ROOT, SHARED_DATA

from attnlab.runner.train import train

MULTI30K = SHARED_DATA / "multi30k"
needs_multi30k = pytest.mark.skipif(
    not MULTI30K.is_dir(), reason=f"the shared Multi30k files are not at {MULTI30K}"
)
OVERFIT = [
    "model=tiny", "model.d_model=64", "model.dropout=0.0", "task.system.label_smoothing=0.0",
    "task.data.tokenizer.vocab_size=300", "task.optim.lr=3e-3", "task.optim.warmup_steps=20",
    "task.optim.schedule=constant", "trainer.max_epochs=400", "trainer.check_val_every_n_epoch=100",
    "decode.beam=2",
]  # fmt: skip


def write_pairs(directory: Path, first: int, count: int) -> list[str]:
    """Lines first..first+count of Multi30k's training split as train/valid/test files."""
    directory.mkdir(parents=True)
    sides = {lang: (MULTI30K / f"train.{lang}").read_text().splitlines() for lang in ("en", "de")}
    for split in ("train", "valid", "test"):
        for lang, lines in sides.items():
            text = "\n".join(lines[first : first + count]) + "\n"
            (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return sides["de"][first : first + count]


def local(directory: Path, cache: Path) -> list[str]:
    return [
        "task=multi30k", "task.data.source=local", f"task.data.dir={directory}",
        f"paths.data_dir={cache}",
    ]  # fmt: skip


def bleu_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("test/bleu"))


@needs_multi30k
@pytest.mark.slow
def test_a_tiny_model_overfits_64_real_pairs_and_eval_py_decodes_other_files(make_config, tmp_path):
    references = write_pairs(tmp_path / "pairs", 0, 64)
    metrics = train(make_config([*local(tmp_path / "pairs", tmp_path / "cache"), *OVERFIT]))
    assert metrics["test/bleu"] > 90

    hypotheses = (tmp_path / "hypotheses" / "test.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 64
    assert sum(h == r for h, r in zip(hypotheses, references, strict=True)) > 48, "corpus order"
    rescored = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert metrics["test/bleu"] == pytest.approx(rescored, abs=1e-4), "logged BLEU is sacreBLEU's"

    other = tmp_path / "other"
    write_pairs(other, 1000, 16)
    ckpt = next((tmp_path / "checkpoints").glob("epoch_*.ckpt"))
    result = subprocess.run(
        [
            sys.executable, "eval.py", f"ckpt_path={ckpt}", f"task.data.dir={other}",
            "decode.beam=4", f"hydra.run.dir={tmp_path / 'eval'}",
            f"paths.data_dir={tmp_path / 'cache'}",  # never taken from the checkpoint
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/bleu" in result.stdout and "test/chrf" in result.stdout
    tokenizers = [p.name for p in (tmp_path / "cache" / "tokenizers").iterdir() if p.is_dir()]
    restored = [name for name in tokenizers if name.startswith("restored-")]
    assert len(tokenizers) == 2 and len(restored) == 1, (
        "eval must restore the checkpoint's tokenizer, not train one on the new files"
    )
    assert len((tmp_path / "eval" / "hypotheses" / "test.txt").read_text().splitlines()) == 16

    files = [
        f"task.data.test_{side}={other / f'test.{lang}'}"
        for side, lang in (("src", "en"), ("tgt", "de"))
    ]
    by_path = subprocess.run(
        [sys.executable, "eval.py", f"ckpt_path={ckpt}", *files, "decode.beam=4", f"hydra.run.dir={tmp_path / 'pair'}",
         f"paths.data_dir={tmp_path / 'cache'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert by_path.returncode == 0, by_path.stderr[-3000:]
    assert bleu_line(by_path.stdout) == bleu_line(result.stdout), "same 16 pairs, same beam"


@pytest.mark.slow
@needs_multi30k
def test_fast_dev_run_of_multi30k_on_the_shared_files(make_config, tmp_path):
    cfg = make_config(
        [
            *local(MULTI30K, tmp_path / "cache"), "model=tiny", "debug=fast", "task.data.batching.train_size=500",
            "task.data.tokenizer.vocab_size=1000", "pe=rope", "norm=l2",
        ]
    )  # fmt: skip
    metrics = train(cfg)
    assert 0 <= metrics["test/bleu"] <= 100 and metrics["test/chrf"] >= 0
    assert metrics["train/loss"] > 0
