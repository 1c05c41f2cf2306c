"""A run SIGKILLed at any moment (a step, a save, a validation, an epoch's end, its test),
resumed with `train.py run_dir=`, again and again, ends as the uninterrupted run: the same
weights bit for bit, the same metric rows (none missing, none twice), one best checkpoint,
one test. Kill times are drawn from a seeded generator over the run's training time; each
draw is one case, named by its seed."""

from __future__ import annotations

import csv
import functools
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from test_resume import metric_rows, weights

WAIT = 240  # seconds a process may take to reach a kill point
KILLED = [  # tiny, deterministic, 16 steps an epoch, tested
    "model=tiny", "trainer.deterministic=true", "task.data.train_size=1024",
    "trainer.log_every_n_steps=1", "extras.print_config=false",
    "callbacks.progress_bar.refresh_rate=0",
]  # fmt: skip
EVERY_5 = ["callbacks.latest.every_n_minutes=null", "callbacks.latest.every_n_steps=5"]
# a budget of steps (Lightning restores its loops otherwise than for a budget of epochs; 60
# ends mid-epoch), last.ckpt at epoch ends only (the default at this size) or every 5 steps
STEPS = ["trainer.max_steps=60", "trainer.max_epochs=-1"]
SAVES = {
    "steps-epoch_ends": STEPS,
    "steps-every_5_steps": [*STEPS, *EVERY_5],
    "epochs-epoch_ends": ["trainer.max_epochs=4"],
    "epochs-every_5_steps": ["trainer.max_epochs=4", *EVERY_5],
    # a step of two batches: no save may fall between them (their gradients are held)
    "steps-every_5_steps-accumulating": [*STEPS, *EVERY_5, "trainer.accumulate_grad_batches=2"],
}
FAST = ["steps-epoch_ends", "steps-every_5_steps"]  # the rest are marked slow


def command(*args: str) -> list[str]:
    return [sys.executable, "train.py", *args]


def kill_when(process: subprocess.Popen, ready, delay: float) -> bool:
    """SIGKILL `process` `delay` seconds after `ready()` first holds; False if it ended first."""
    deadline = time.monotonic() + WAIT
    while not ready():
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, "the kill point never came"
        time.sleep(0.005)
    time.sleep(delay)
    process.kill()
    return process.wait(timeout=60) == -signal.SIGKILL


def saved_since(last: Path) -> Callable[[], bool]:
    """Whether `last` has been written since this was called."""
    seen = last.stat().st_mtime_ns if last.exists() else None
    return lambda: last.exists() and last.stat().st_mtime_ns != seen


def killed_and_resumed(run_dir: Path, args: list[str], delays: list[float]) -> int:
    """Run, SIGKILL after each of `delays` (from the first last.ckpt of each process), resume
    with run_dir= until the run finishes; how many kills landed."""
    last = run_dir / "checkpoints" / "last.ckpt"
    landed = 0
    for i, delay in enumerate(delays):
        start = command(*args, f"hydra.run.dir={run_dir}") if i == 0 else None
        resume = command(f"run_dir={run_dir}")
        process = subprocess.Popen(
            start or resume, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if not kill_when(process, saved_since(last), delay):
            assert process.returncode == 0, "a resumed run failed"
            return landed
        landed += 1
    done = subprocess.run(command(f"run_dir={run_dir}"), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return landed


def the_same_run(resumed: Path, whole: Path) -> None:
    expected, got = weights(whole), weights(resumed)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{name} differs from the uninterrupted run's"
    assert metric_rows(resumed) == metric_rows(whole), "a metric row missing, changed or twice"
    best = sorted(p.name for p in (resumed / "checkpoints").glob("epoch_*.ckpt"))
    assert best == sorted(p.name for p in (whole / "checkpoints").glob("epoch_*.ckpt"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Callable[[str], tuple[Path, float]]:
    """A way of saving run once to its end, when a test first asks: its directory and its
    seconds of training after its first last.ckpt (to its last save, as training ends)."""

    @functools.cache
    def whole(name: str) -> tuple[Path, float]:
        run_dir = tmp_path_factory.mktemp(name)
        last = run_dir / "checkpoints" / "last.ckpt"
        process = subprocess.Popen(
            command(*KILLED, *SAVES[name], f"hydra.run.dir={run_dir}"),
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        while not last.exists() and process.poll() is None:
            time.sleep(0.005)
        first = time.time()
        assert process.wait(timeout=WAIT) == 0
        return run_dir, last.stat().st_mtime - first

    return whole


def drawn_delays(seed: int, span: float) -> list[float]:
    """Two or three kill delays after a checkpoint: the first uniform over the first quarter
    of the training that follows the first checkpoint (so that it lands in training, on a busy
    machine too), the others over all of it and a fifth more (the test, the process's end)."""
    draw = random.Random(seed)
    later = [draw.uniform(0, 1.2 * span) for _ in range(draw.choice((1, 2)))]
    return [draw.uniform(0, 0.25 * span), *later]


@pytest.mark.parametrize("saves", FAST)
@pytest.mark.parametrize("seed", [0])
def test_a_run_killed_at_drawn_moments_resumes_to_the_uninterrupted_run(
    seed, saves, uninterrupted, tmp_path
):
    whole, span = uninterrupted(saves)
    run_dir = tmp_path / "run"
    landed = killed_and_resumed(run_dir, [*KILLED, *SAVES[saves]], drawn_delays(seed, span))
    assert landed >= 1, "no kill landed before the run finished"
    the_same_run(run_dir, whole)


@pytest.mark.slow
@pytest.mark.parametrize("saves", SAVES)
@pytest.mark.parametrize("seed", range(1, 7))
def test_more_drawn_kill_moments(seed, saves, uninterrupted, tmp_path):
    test_a_run_killed_at_drawn_moments_resumes_to_the_uninterrupted_run(
        seed, saves, uninterrupted, tmp_path
    )


@pytest.mark.slow
@pytest.mark.parametrize("saves", sorted(set(SAVES) - {"steps-every_5_steps"}))
def test_more_kills_during_a_save(saves, uninterrupted, tmp_path):
    test_a_run_killed_during_a_save_resumes_to_the_uninterrupted_run(saves, uninterrupted, tmp_path)


@pytest.mark.parametrize("saves", ["steps-every_5_steps"])
def test_a_run_killed_during_a_save_resumes_to_the_uninterrupted_run(
    saves, uninterrupted, tmp_path
):
    """The kill lands while last.ckpt is being written (its partial file exists): the
    previous state is whole, and the resume starts from it."""
    whole, _ = uninterrupted(saves)
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        command(*KILLED, *SAVES[saves], f"hydra.run.dir={run_dir}"),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    saving = lambda: any((run_dir / "checkpoints").glob(".last.ckpt*.partial-*"))  # noqa: E731
    ckpts = run_dir / "checkpoints"
    first = lambda: (ckpts / "last.ckpt").exists() and saving()  # noqa: E731
    assert kill_when(process, first, 0.0), "the run finished before a second save"
    assert killed_and_resumed(run_dir, [], []) == 0
    the_same_run(run_dir, whole)


def steps_logged(run_dir: Path) -> set[int]:
    """The steps whose training row (train/loss) is in the metrics file."""
    with (run_dir / "csv" / "metrics.csv").open(newline="") as file:
        return {int(float(row["step"])) for row in csv.DictReader(file) if row.get("train/loss")}


@pytest.mark.parametrize("saves", ["steps-every_5_steps"])
def test_a_run_killed_the_moment_last_ckpt_changes_has_the_row_of_every_step_it_holds(
    saves, tmp_path
):
    """Lightning logs a batch's row after the callbacks' on_train_batch_end, where a step's
    save is made: a last.ckpt written there and killed before the row left the row out for
    good (the resumed run starts after that batch). Killed at once, three times over."""
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    starts = [[*KILLED, *SAVES[saves], f"hydra.run.dir={run_dir}"], *[[f"run_dir={run_dir}"]] * 2]
    for args in starts:
        process = subprocess.Popen(
            command(*args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        assert kill_when(process, saved_since(last), 0.0), "the run finished before a save"
        held = torch.load(last, weights_only=True, map_location="cpu")["global_step"]
        missing = sorted(set(range(held)) - steps_logged(run_dir))
        assert not missing, f"last.ckpt holds {held} steps; no row for steps {missing}"
