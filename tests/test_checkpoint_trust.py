"""What a run reads back from its files is data, never code and never a destination: stored
overrides are literals (no interpolation, resolver or object), `paths.*` and other output
locations are never taken from a file, and a checkpoint's hyperparameters build attnlab's
own classes only. Each case runs the real command (eval.py ckpt_path=, train.py
ckpt_path=, train.py run_dir=) from a fresh working directory and checks that nothing was
made outside that directory's logs/ and the run directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TEXT
from test_checkpoints import Payload

from attnlab.runner.resume import allowed_overrides
from attnlab.stored import RECORD_KEY

QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]
RUN = [
    "model=tiny", "trainer.max_epochs=1", "task.data.train_size=64", "task.data.max_len=8", *QUIET,
]  # fmt: skip


# a finished probe run's directory, as committed for the results tests
RECORDED_RUN = ROOT / "tests/data/results/docs/results/runs/extrapolation_sample/2"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The directory of a finished 1-epoch tiny probe run."""
    run_dir = tmp_path_factory.mktemp("trained")
    command = [sys.executable, "train.py", *RUN, "test=false", f"hydra.run.dir={run_dir}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return run_dir


def tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def tampered(trained: Path, tmp_path: Path, stored: list[str]) -> Path:
    """A copy of the trained run whose last.ckpt stores `stored` besides its own overrides."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    data = torch.load(last, weights_only=True)
    data[RECORD_KEY]["overrides"] += stored
    torch.save(data, last)
    return run_dir


def command(program: str, run_dir: Path) -> list[str]:
    script = str(ROOT / program)
    if program == "eval.py":
        return [sys.executable, script, f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"]
    if program == "train.py ckpt_path":
        return [
            sys.executable,
            str(ROOT / "train.py"),
            f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
        ]
    return [sys.executable, str(ROOT / "train.py"), f"run_dir={run_dir}"]


PROGRAMS = ["eval.py", "train.py ckpt_path", "train.py run_dir"]


def payloads(tmp_path: Path) -> dict[str, tuple[str, Path]]:
    """Each stored override, and what it would make if it were honoured."""
    marker = tmp_path / "outside"
    decode = f"{{_target_: os.mkdir, path: {marker / 'decoded'}}}"
    return {
        "decode": (f"task.data='${{oc.decode:\"{decode}\"}}'", marker / "decoded"),
        "env": ("task.data.seed='${oc.env:HOME}'", marker / "env"),
        "unique": (f"task.description='${{unique:{marker / 'unique'}}}'", marker / "unique"),
        "nested": (
            f"+task.data.hooks=[{{_target_: tempfile.mkdtemp, dir: {marker}}}]",
            marker,
        ),
        "log_dir": (f"paths.log_dir={marker / 'logs'}", marker / "logs"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("payload", ["decode", "env", "unique", "nested", "log_dir"])
def test_a_stored_value_is_a_literal_or_left_out(program, payload, trained, tmp_path):
    stored, would_make = payloads(tmp_path)[payload]
    run_dir = tampered(trained, tmp_path, [stored])
    workdir = tmp_path / "work"
    workdir.mkdir()
    before = tree(tmp_path)
    result = subprocess.run(
        [*command(program, run_dir), "extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    refused = next(line for line in result.stderr.splitlines() if "not reusing" in line)
    assert refused.startswith("attnlab: not reusing these overrides of the checkpoint: ")
    assert stored in refused
    assert not would_make.exists()
    made = {
        path
        for path in tree(tmp_path) - before
        if run_dir not in path.parents and workdir / "logs" not in [path, *path.parents]
    }
    assert made == set(), f"made outside the run directory: {sorted(made)}"


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_stored_override_of_a_setting_gone_names_the_checkpoint(program, trained, tmp_path):
    """A run trained by a version that had a setting this one lacks: one sentence saying the
    checkpoint supplied it, where the user typed nothing wrong."""
    run_dir = tampered(trained, tmp_path, ["model.rotary_fraction=0.5"])
    result = subprocess.run(
        command(program, run_dir), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "attnlab: the run's checkpoint stores the override model.rotary_fraction=0.5, and "
        "model.rotary_fraction is not a setting of this version of attnlab: resume or evaluate "
        "the run with the version that trained it"
    )


@pytest.mark.parametrize(
    "override",
    [
        "pe=rope",
        "task.data.dir=/data/multi30k",
        "tags=[a,b]",
        "task.data.seed='${oc.env:HOME}'",
        "task.data.seed=${seed}",
        "tags=[a,'${oc.env:HOME}']",
        "task.data.hooks=[{_target_:os.system}]",
        "task.data.hooks=[[1]]",
        "paths.data_dir=/elsewhere",
        "trainer.default_root_dir=/elsewhere",
        "++trainer.profiler.dirpath=/elsewhere",
        "pe@hydra.run=rope",
        "model.schedule.pattern=[{pe:pe,window:8},{pe:nope}]",
        "model.schedule.pattern=[{pe:{_target_:os.system}}]",
        "model.schedule.pattern=[{_partial_:true}]",
        "model.schedule.pattern=[{pe:'${oc.env:HOME}'}]",
        "task.data.hooks={_target_:os.system}",
        "trainer.profiler={dirpath:/elsewhere}",
        "model.schedule.pattern=[{pe:pe,save_dir:/elsewhere}]",
        "callbacks.early_stopping=null",
        "callbacks.latest=null",
        "~callbacks.early_stopping",
        "+callbacks.early_stopping=null",
    ],
)
def test_only_literal_values_in_their_place_pass(override):
    kept = override in (
        "pe=rope", "task.data.dir=/data/multi30k", "tags=[a,b]",
        "model.schedule.pattern=[{pe:pe,window:8},{pe:nope}]", "callbacks.early_stopping=null",
    )  # fmt: skip
    assert allowed_overrides([override], "a checkpoint") == ([override] if kept else [])


@pytest.mark.slow
def test_a_checkpoint_whose_hyperparameters_name_other_code_is_refused(trained, tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    last = trained / "checkpoints" / "last.ckpt"
    data = torch.load(last, weights_only=True)
    data["hyper_parameters"]["architecture"]["norm"] = {
        "_target_": "tempfile.mkdtemp",
        "dir": str(made),
    }
    evil = tmp_path / "evil.ckpt"
    torch.save(data, evil)
    result = subprocess.run(
        [sys.executable, "eval.py", f"ckpt_path={evil}", f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert list(made.iterdir()) == []
    assert result.stderr.strip().splitlines()[-1] == (
        "attnlab: _target_ 'tempfile.mkdtemp' is not a class of attnlab: variants, tasks and "
        "systems are built from attnlab's own classes (add a new one under src/attnlab/)"
    )


def test_comparing_run_directories_runs_no_resolver_they_store(tmp_path):
    """Run a's pe is shown from its config (run b overrides pe), which someone edited."""
    runs = tmp_path / "runs"
    for name, overrides in (("a", ""), ("b", "- pe=rope\n")):
        shutil.copytree(RECORDED_RUN, runs / name)
        (runs / name / ".hydra" / "overrides.yaml").write_text(f"- model=tiny\n{overrides}")
    made = tmp_path / "made"
    edited = runs / "a" / ".hydra" / "config.yaml"
    text = edited.read_text().replace("name: sinusoidal", "name: ${oc.env:ATTNLAB_SECRET}", 1)
    edited.write_text(text.replace("name: softmax", f"name: ${{unique:{made}}}", 1))
    config = runs / "b" / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace("name: sinusoidal", "name: rope", 1))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "attnlab"), "compare", str(runs)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "ATTNLAB_SECRET": "hunter2"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| a | ${oc.env:ATTNLAB_SECRET} |" in result.stdout, "shown as the text it is"
    assert "hunter2" not in result.stdout + (runs / "comparison.md").read_text()
    assert not list(tmp_path.glob("made*"))


class Custom:
    """A class of the test's own: a checkpoint holding one is refused, not imported."""


def reading(program: str, checkpoint: Path, tmp_path: Path) -> list[str]:
    """The command line of `program` reading `checkpoint`."""
    attnlab = str(Path(sys.executable).parent / "attnlab")
    return {
        "eval.py": [sys.executable, "eval.py", f"ckpt_path={checkpoint}",
                    f"hydra.run.dir={tmp_path / 'eval'}"],
        "train.py": [sys.executable, "train.py", f"ckpt_path={checkpoint}"],
        "generate": [attnlab, "generate", f"ckpt_path={checkpoint}", "prompt=A"],
        "translate": [attnlab, "translate", f"ckpt_path={checkpoint}", "input=-"],
        "export": [attnlab, "export", f"ckpt_path={checkpoint}", f"out={tmp_path / 'out'}"],
    }[program]  # fmt: skip


def edited(last: Path, tmp_path: Path, how: str) -> tuple[Path, str]:
    """A copy of `last` edited `how`, and the sentence it is refused with."""
    data = torch.load(last, weights_only=True)
    path = tmp_path / f"{how}.ckpt"
    if how == "no_state_dict":
        del data["state_dict"]
        sentence = (
            f"{path}'s entry state_dict is missing: the file was damaged or edited; use the "
            "checkpoint train.py wrote, or export it again"
        )
    else:
        data["extra"] = Custom() if how == "custom" else Payload(tmp_path / "ran")
        held = "test_checkpoint_trust.Custom" if how == "custom" else "getattr"
        sentence = (
            f"{path} holds a Python object ({held}) besides tensors and plain data, and "
            "attnlab loads only data (reading a checkpoint runs no code): use a checkpoint that "
            "train.py wrote, or a directory that attnlab export wrote"
        )
    torch.save(data, path)
    return path, sentence


@pytest.mark.slow
@pytest.mark.parametrize("how", ["no_state_dict", "custom", "payload"])
@pytest.mark.parametrize("program", ["eval.py", "train.py", "generate", "translate", "export"])
def test_a_checkpoint_it_cannot_take_is_one_sentence_of_attnlabs_own(
    program, how, trained, tmp_path
):
    """Without state_dict, or holding an object of a class (a payload that would run code):
    one sentence before anything else is read; torch's advice to load the file with
    weights_only=False (to run its code) is never passed on, and the payload did not run."""
    checkpoint, sentence = edited(trained / "checkpoints" / "last.ckpt", tmp_path, how)
    result = subprocess.run(
        reading(program, checkpoint, tmp_path), cwd=ROOT, capture_output=True, text=True,
        input="", timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"attnlab: {sentence}"
    assert "weights_only" not in result.stdout + result.stderr
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_data_file_the_checkpoint_names_is_read_only_saying_so(tmp_path):
    """A run trained on task.data.file=text.txt (relative to where it was launched), evaluated
    from a directory holding another text.txt: eval.py reads the run's file and says so in
    one line; with that file gone, one sentence naming the override; with the override, the
    file given."""
    launched, elsewhere = tmp_path / "launched", tmp_path / "elsewhere"
    launched.mkdir(), elsewhere.mkdir()
    (launched / "text.txt").write_text(TEXT * 40)
    (elsewhere / "text.txt").write_text("another text entirely\n" * 80)
    lm = ["task=lm", "task.data.source=local", "task.data.tokenizer=char", "task.data.block_size=16",
          "task.data.eval_lengths=[16]", "task.data.fractions=[0.8,0.1,0.1]", "model=tiny", *QUIET]  # fmt: skip
    trained = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *lm, "task.data.file=text.txt", "trainer.max_steps=2",
         f"hydra.run.dir={tmp_path / 'run'}", f"paths.data_dir={tmp_path / 'cache'}"],
        cwd=launched, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]

    def evaluated(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(ROOT / "eval.py"), f"ckpt_path={tmp_path / 'run/checkpoints/last.ckpt'}",
                   f"hydra.run.dir={tmp_path / 'eval'}", *QUIET, *args]  # fmt: skip
        return subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=300)

    read = evaluated()
    assert read.returncode == 0, read.stderr[-2000:]
    file = launched / "text.txt"
    assert (
        f"attnlab: reading task.data.file={file}, the run's (from its checkpoint): pass "
        "task.data.file=<another> to evaluate on other data"
    ) in read.stderr.splitlines()
    assert f"file: {file}\n" in (tmp_path / "eval/.hydra/config.yaml").read_text()

    file.rename(launched / "moved.txt")
    gone = evaluated()
    assert gone.returncode == 1 and "Traceback" not in gone.stderr
    assert gone.stderr.strip().splitlines()[-1] == (
        f"attnlab: the run was trained with task.data.file={file}, which is gone: pass "
        "task.data.file=<where that data is now> to eval.py"
    )
    given = evaluated(f"task.data.file={launched / 'moved.txt'}")
    assert given.returncode == 0, given.stderr[-2000:]
    assert "attnlab: reading task.data" not in given.stderr
