"""When the machine says no (a full disk, a directory that cannot be written, no GPU, no
SLURM) or a command asks for a group that does not exist, the run ends in one sentence that
says what to do, its last good checkpoint intact and its resume command printed."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, fill
from PIL import Image
from test_lm_corpus import corpus_settings, many_documents

from attnlab import status

QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]


def train_py(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "train.py", *args, *QUIET],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def one_sentence(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_full_disk_ends_in_one_sentence_with_the_last_checkpoint_whole(small_disk):
    run_dir = small_disk / "run"
    run = [
        "model=tiny", "trainer.max_epochs=100", "task.data.train_size=256", "test=false",
        "callbacks.latest.every_n_minutes=null", "callbacks.latest.every_n_steps=20",
        f"hydra.run.dir={run_dir}", *QUIET,
    ]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "train.py", *run], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    last = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not last.exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.05)
    filler = small_disk / "filler"
    with filler.open("wb") as file, pytest.raises(OSError):
        while True:  # until the disk is full
            file.write(b"\0" * 65536)
            file.flush()
    _, stderr = process.communicate(timeout=240)
    result = subprocess.CompletedProcess(process.args, process.returncode, "", stderr)

    sentence = one_sentence(result)
    assert sentence.startswith("attnlab: could not write "), sentence
    assert "(No space left on device" in sentence
    assert sentence.endswith(
        f"free space there; then resume with: python train.py run_dir={run_dir}"
    )
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] > 0
    assert not list(run_dir.rglob(".*partial*")), "no half-written file left"

    filler.unlink()
    resumed = train_py(f"run_dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert torch.load(last, weights_only=True)["global_step"] > saved["global_step"]


@pytest.mark.slow
def test_a_full_disk_stops_tokenize_in_one_sentence_and_the_rerun_builds_the_same_stream(
    small_disk, tmp_path
):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(many_documents(40_000)) + "\n")  # 2.5 MB of ids
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 2**20)

    def tokenize(cache: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "attnlab.commands.cli", "tokenize", *corpus_settings(corpus, cache)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    streams = small_disk / "cache" / "streams"
    sentence = one_sentence(tokenize(small_disk / "cache"))
    assert sentence.startswith(f"attnlab: could not write {streams} (No space left on device, ")
    assert sentence.endswith(
        " MiB free there): free space there; then run the same command again, and the build "
        "goes on where it stopped"
    )
    sealed = [path for path in streams.iterdir() if (path / "meta.json").exists()]
    assert sealed == [], "no stream sealed half written"

    filler.unlink()
    rerun = tokenize(small_disk / "cache")
    roomy = tokenize(tmp_path / "roomy")
    assert rerun.returncode == roomy.returncode == 0, rerun.stderr[-2000:]
    ((ids,), (roomy_ids,)) = (streams.glob("*/ids.bin"), tmp_path.glob("roomy/streams/*/ids.bin"))
    assert ids.read_bytes() == roomy_ids.read_bytes()


@pytest.mark.parametrize(
    "where,written",
    [
        ("paths.log_dir=/proc/attnlab-nowhere", "/proc/attnlab-nowhere/probe/runs"),
        ("hydra.run.dir=/proc/attnlab-nowhere/run", "/proc/attnlab-nowhere/run"),
    ],
)
def test_a_directory_that_cannot_be_written_is_one_sentence(where, written):
    assert one_sentence(train_py(where, "trainer.max_steps=1")) == (
        f"attnlab: cannot write in {written} (No such file or directory): make it writable, or "
        "pass paths.log_dir=<a writable directory>"
    )


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_trainer_without_a_gpu_is_one_sentence(tmp_path):
    assert one_sentence(train_py("trainer=gpu", f"hydra.run.dir={tmp_path / 'run'}")) == (
        "attnlab: trainer.accelerator=gpu needs a GPU, and this machine has none: use "
        "trainer=cpu, or trainer.accelerator=auto to use a GPU wherever there is one"
    )


@pytest.mark.skipif(shutil.which("srun") is not None, reason="this machine has SLURM")
def test_the_slurm_launcher_without_slurm_is_one_sentence(tmp_path):
    result = train_py("-m", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert one_sentence(result) == (
        "attnlab: hydra/launcher=slurm submits the sweep to SLURM, and this machine has no SLURM "
        "(no srun on its PATH): run the command on the cluster's login node, or run the sweep "
        "here with hydra/launcher=joblib"
    )
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("added", ["+optimizer=adam", "++scheduler=cosine"])
def test_a_group_that_does_not_exist_is_not_added_silently(added, tmp_path):
    sentence = one_sentence(train_py(added, f"hydra.run.dir={tmp_path / 'run'}"))
    group = added.lstrip("+").split("=")[0]
    assert sentence.startswith(
        f"attnlab: {added} adds a setting that nothing reads: attnlab has no config group {group} "
        "(the groups are task, pe, norm,"
    ), sentence
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("data_dir", [None, "elsewhere"])
def test_the_resume_command_names_a_cache_of_the_runs_own(data_dir, make_config, tmp_path):
    from attnlab.runner.train import resumable

    paths = [] if data_dir is None else [f"paths.data_dir={tmp_path / data_dir}"]
    cfg = make_config(paths)
    assert resumable(cfg) is None, "nothing to resume before the first checkpoint"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").touch()
    suffix = "" if data_dir is None else f" paths.data_dir={tmp_path / data_dir}"
    assert resumable(cfg) == f"python train.py run_dir={tmp_path.resolve()}{suffix}"


@pytest.fixture
def read_only(tmp_path):
    """`tmp_path / "run"` seen read-only at `tmp_path / "read_only"` (a read-only bind mount:
    root writes through permissions)."""
    source, view = tmp_path / "run", tmp_path / "read_only"
    source.mkdir()
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(source), str(view)]).returncode != 0:
        pytest.skip("a read-only bind mount needs root and mount rights")
    subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
    yield source, view
    subprocess.run(["umount", str(view)], check=True)


@pytest.mark.slow
def test_a_read_only_run_is_told_to_resume_a_copy_and_the_copy_resumes(read_only, tmp_path):
    from test_resume import CHECKPOINTED, interrupt, pasted

    source, view = read_only
    interrupt(source, signal.SIGINT, [*CHECKPOINTED, "task.data.train_size=1280"])
    refused = one_sentence(train_py(f"run_dir={view}"))
    assert refused == (
        f"attnlab: cannot write in {view} (permission denied): a resume writes in its run's "
        "directory, so make it writable, or copy the run to a writable place and resume the "
        f"copy (cp -a {view} <copy>, then python train.py run_dir=<copy>)"
    )
    copy = tmp_path / "copy"
    followed = pasted(f"cp -a {view} {copy} && python train.py run_dir={copy}", ROOT)
    assert followed.returncode == 0, followed.stderr[-2000:]
    assert status.read(copy).state == "completed"


def test_a_comparison_onto_a_full_disk_is_one_sentence_and_leaves_no_half_file(small_disk):
    from test_compare import ROWS, fake_run

    runs = small_disk.parent / "runs"
    for seed in (1, 2):
        fake_run(runs / f"r{seed}", [f"seed={seed}"], ROWS)
    out = small_disk / "comparison"
    filler = fill(small_disk, leave=16 * 1024)  # room for a figure or two, not for all
    command = [
        sys.executable,
        "-m",
        "attnlab.commands.cli",
        "compare",
        str(runs),
        "--out",
        str(out),
    ]
    sentence = one_sentence(subprocess.run(command, capture_output=True, text=True, timeout=300))
    assert re.fullmatch(
        rf"attnlab: could not write {out}/\S+ \(No space left on device, [\d.]+ MiB free "
        r"there\): free space there",
        sentence,
    ), sentence
    assert not list(out.glob(".*partial*")), "no half-written file left"
    for figure in out.glob("*.png"):
        Image.open(figure).load()  # each left is whole

    filler.unlink()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "comparison.md").read_text().startswith("# Comparison of 2 runs")


@pytest.mark.slow
@pytest.mark.parametrize("left", [0, 16 * 1024])
def test_an_evaluation_onto_a_full_disk_is_one_sentence_and_leaves_no_directory(
    left, small_disk, tmp_path
):
    """A disk full from the start (eval.py's config files) or filling during the test (its
    log, metrics and plots): one sentence, no half-written evaluation, and it runs again."""
    trained = train_py("model=tiny", "trainer.max_steps=4", f"hydra.run.dir={tmp_path / 'run'}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    out = small_disk / "eval"
    command = [sys.executable, "eval.py", f"ckpt_path={tmp_path / 'run/checkpoints/last.ckpt'}",
               f"hydra.run.dir={out}", *QUIET]  # fmt: skip
    filler = fill(small_disk, leave=left)
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert re.fullmatch(
        rf"attnlab: could not write {out}\S* \(No space left on device, \d+\.\d MiB free "
        rf"there\): free space there, then run eval.py again \(its unfinished directory {out} "
        r"is removed\)",
        one_sentence(result),
    ), result.stderr[-2000:]
    assert [p.name for p in small_disk.iterdir()] == ["filler"]
    filler.unlink()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "csv" / "metrics.csv").is_file()
