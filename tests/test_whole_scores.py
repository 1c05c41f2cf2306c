"""Scores are of the data the user asked for: an evaluation scores the whole split unless its
own command limits it (a training run's limits stay with it) and says how many examples it
scored; every run validates its final weights; a run's data is found where it was trained,
from any working directory, or refused when it is gone."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import ROOT, SHARED_DATA

from attnlab.runner.callbacks import ValidateAtEnd
from attnlab.runner.resume import best_files

QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]
PROBE = ["model=tiny", "trainer.max_epochs=1", "task.data.train_size=64", "task.data.batch_size=4"]


def program(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / name), *args, *QUIET],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def examples(stdout: str, split: str) -> str:
    """The summary's `<split>/examples  N of M`."""
    name = f"{split}/examples"
    return next(line[len(name) :].strip() for line in stdout.splitlines() if line.startswith(name))


def val_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open() as file:
        return [row for row in csv.DictReader(file) if row.get("val/acc")]


@pytest.mark.slow
@pytest.mark.parametrize("limit", ["++trainer.limit_val_batches=1", "debug=limit"])
def test_eval_scores_the_whole_split_whatever_training_was_limited_to(limit, tmp_path):
    run_dir = tmp_path / "run"
    trained = program("train.py", *PROBE, limit, "test=false", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "val: scored " in trained.stdout + trained.stderr + (run_dir / "train.log").read_text()
    assert {row["val/examples_total"] for row in val_rows(run_dir)} == {"16.0"}
    assert float(val_rows(run_dir)[-1]["val/examples"]) < 16

    ckpt = run_dir / "checkpoints" / "last.ckpt"
    evaluated = program(
        "eval.py", f"ckpt_path={ckpt}", "split=val", f"hydra.run.dir={tmp_path / 'e'}"
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert examples(evaluated.stdout, "val") == "16 of 16"
    assert "attnlab: evaluating without the run's training settings: " in evaluated.stderr
    assert limit in evaluated.stderr

    limited = program(
        "eval.py", f"ckpt_path={ckpt}", "split=val", "++trainer.limit_val_batches=2",
        f"hydra.run.dir={tmp_path / 'limited'}",
    )  # fmt: skip
    assert limited.returncode == 0, limited.stderr[-2000:]
    assert examples(limited.stdout, "val") == "8 of 16"
    log = (tmp_path / "limited" / "eval.log").read_text()
    assert "val: scored 8 of 16 examples (trainer.limit_val_batches=2)" in log


@pytest.mark.slow
@pytest.mark.parametrize(
    "budget,validated_at",
    [
        (["trainer.max_steps=3"], [2]),  # 16 steps an epoch: the budget ends inside the first
        (["trainer.max_steps=5", "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=2"], [1, 3, 4]),
        (["trainer.max_epochs=3", "task.data.train_size=8", "trainer.check_val_every_n_epoch=2"], [3, 5]),
    ],
)  # fmt: skip
def test_every_run_validates_its_final_weights(budget, validated_at, tmp_path):
    result = program("train.py", *PROBE, *budget, "test=false", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "best/val/acc" in result.stdout
    assert [int(row["step"]) for row in val_rows(tmp_path)] == validated_at
    assert best_files(tmp_path / "checkpoints"), "a best checkpoint exists"


MULTI30K = SHARED_DATA / "multi30k"


@pytest.mark.slow
@pytest.mark.skipif(
    not MULTI30K.is_dir(), reason=f"the shared Multi30k files are not at {MULTI30K}"
)
def test_a_run_reads_the_data_it_was_trained_on_from_any_directory(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    for directory, count in ((here, 40), (there, 24)):  # `pairs` in both: other data in each
        (directory / "pairs").mkdir(parents=True)
        for split in ("train", "valid", "test"):
            for lang in ("en", "de"):
                lines = (MULTI30K / f"train.{lang}").read_text().splitlines()[:count]
                (directory / "pairs" / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    trained = program(
        "train.py", "task=multi30k", "task.data.source=local", "task.data.dir=pairs", "model=tiny",
        "task.data.tokenizer.vocab_size=200", "trainer.max_steps=2", "test=false",
        f"paths.data_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}", cwd=here,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    cache = f"paths.data_dir={tmp_path / 'cache'}"

    evaluated = program("eval.py", f"ckpt_path={ckpt}", cache, "hydra.run.dir=e1", cwd=there)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert examples(evaluated.stdout, "test") == "40 of 40", "here/pairs, not there/pairs"

    shutil.move(here / "pairs", here / "moved")
    gone = program("eval.py", f"ckpt_path={ckpt}", cache, "hydra.run.dir=e2", cwd=there)
    assert gone.returncode == 1
    assert gone.stderr.strip().splitlines()[-1] == (
        f"attnlab: the run was trained with task.data.dir={here / 'pairs'}, which is gone: pass "
        "task.data.dir=<where that data is now> to eval.py"
    )
    moved = program(
        "eval.py", f"ckpt_path={ckpt}", cache, f"task.data.dir={here / 'moved'}",
        "hydra.run.dir=e3", cwd=there,
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr[-2000:]


@pytest.mark.slow
def test_compare_says_where_a_test_scored_part_of_its_split(tmp_path):
    for name, limit in (("whole", []), ("part", ["++trainer.limit_test_batches=1"])):
        result = program("train.py", *PROBE, *limit, f"hydra.run.dir={tmp_path / 'runs' / name}")
        assert result.returncode == 0, result.stderr[-2000:]
    compared = subprocess.run(
        [str(Path(sys.executable).parent / "attnlab"), "compare", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert compared.returncode == 0, compared.stderr[-2000:]
    header, _, *rows = compared.stdout.splitlines()[:4]
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert "test examples" in columns and "test/examples" not in columns
    cells = {row.split("|")[1].strip(): row.split("|") for row in rows}
    position = columns.index("test examples") + 1
    assert cells["part"][position].strip() == "4 of 16"
    assert cells["whole"][position].strip() == ""


@pytest.mark.parametrize("max_epochs,kept", [(-1, 5), (None, 5), (3, 5), (1, 1)])
def test_only_a_last_epoch_of_a_budget_is_made_to_validate(max_epochs, kept):
    """Epoch 0 is the last of max_epochs=1 only; -1 and None set no epoch budget."""
    trainer = SimpleNamespace(max_epochs=max_epochs, current_epoch=0, check_val_every_n_epoch=5)
    ValidateAtEnd().on_train_epoch_start(trainer, None)
    assert trainer.check_val_every_n_epoch == kept
