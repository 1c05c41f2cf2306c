"""Nothing lost: a run killed mid-epoch resumes, in its own directory, to the weights an
uninterrupted run reaches; one killed after training resumes to its test; last.ckpt holds
the latest state; run directories are unique."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TEXT

from attnlab import status

STEPS_PER_EPOCH = 64
CHECKPOINTED = [  # deterministic, quiet, last.ckpt every 10 steps
    "model=tiny", "trainer.max_epochs=2", "trainer.deterministic=true", "test=false",
    "trainer.log_every_n_steps=1", "callbacks.latest.every_n_minutes=null",
    "callbacks.latest.every_n_steps=10", "extras.print_config=false",
    "callbacks.progress_bar.refresh_rate=0",
]  # fmt: skip
RUN = [*CHECKPOINTED, f"task.data.train_size={64 * STEPS_PER_EPOCH}"]


def train_py(*args: str) -> list[str]:
    return [sys.executable, "train.py", *args]


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        train_py(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def interrupt(
    run_dir: Path, sig: signal.Signals, args: list[str] = RUN
) -> subprocess.CompletedProcess:
    """Start a run and send it `sig` once it has taken its first checkpoint (step 10)."""
    from attnlab.shell import override

    process = subprocess.Popen(
        train_py(*args, override("hydra.run.dir", run_dir)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.02)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


# epoch is logged on some rows only; tokens/s is a wall-clock reading, different in any two runs
NOT_COMPARED = {"epoch", "train/tokens_per_s"}


def metric_rows(run_dir: Path) -> list[tuple]:
    with (run_dir / "csv" / "metrics.csv").open() as file:
        return sorted(
            tuple(sorted((k, v) for k, v in row.items() if v and k not in NOT_COMPARED))
            for row in csv.DictReader(file)
        )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("whole")
    run(*RUN, f"hydra.run.dir={run_dir}")
    return run_dir


def lm_run(directory: Path) -> list[str]:
    """A character language model of 40 steps an epoch, on text the test writes."""
    directory.mkdir(exist_ok=True)
    for split, repeats in (("train", 40), ("valid", 2)):
        (directory / f"{split}.txt").write_text(TEXT * repeats, encoding="utf-8")
    return [
        *CHECKPOINTED, "task=lm", "task.data.source=local", f"task.data.dir={directory}",
        "task.data.tokenizer=char", "task.data.block_size=16", "task.data.batch_size=4",
        "task.data.train_windows=160", "task.system.sample_tokens=20",
        f"paths.data_dir={directory / 'cache'}",
    ]  # fmt: skip


@pytest.mark.slow
def test_a_language_model_killed_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    """Training windows are drawn at random offsets: the resumed run draws the same ones."""
    args = lm_run(tmp_path / "text")
    whole = tmp_path / "whole"
    run(*args, f"hydra.run.dir={whole}")
    run_dir = tmp_path / "run"
    assert interrupt(run_dir, signal.SIGTERM, args).returncode == 1
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 10 <= step < 40, "stopped mid-epoch"
    run(f"run_dir={run_dir}")
    resumed, expected = weights(run_dir), weights(whole)
    for name, value in expected.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-6, msg=name)
    assert metric_rows(run_dir) == metric_rows(whole)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig,spelling",
    [(signal.SIGTERM, "run_dir"), (signal.SIGINT, "ckpt_path")],
    ids=["sigterm-run_dir", "ctrl_c-ckpt_path"],
)
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_weights(
    sig, spelling, uninterrupted, tmp_path
):
    run_dir = tmp_path / "run"
    stopped = interrupt(run_dir, sig)
    assert stopped.returncode == 1
    resume = f"python train.py run_dir={run_dir}"
    assert stopped.stderr.strip().splitlines()[-1] == f"attnlab: interrupted; resume with: {resume}"
    assert status.read(run_dir).state == "interrupted"
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 10 <= step < STEPS_PER_EPOCH, "last.ckpt holds the step the run was stopped at"

    argument = f"run_dir={run_dir}" if spelling == "run_dir" else (
        f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    )  # fmt: skip
    run(argument)

    assert [p.name for p in tmp_path.iterdir()] == ["run"], "it continued in its directory"
    resumed, whole = weights(run_dir), weights(uninterrupted)
    for name, value in whole.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-6, msg=name)
    assert metric_rows(run_dir) == metric_rows(uninterrupted), "metrics appended, none twice"
    recorded = status.read(run_dir)
    assert recorded.state == "completed" and recorded.steps == 2 * STEPS_PER_EPOCH
    assert recorded.earlier > 0, "the wall time counts the interrupted part too"
    best = sorted(p.name for p in (run_dir / "checkpoints").glob("epoch_*.ckpt"))
    assert best == sorted(p.name for p in (uninterrupted / "checkpoints").glob("epoch_*.ckpt"))


EARLY_STOPPED = [  # stops after its second validation (no gain of 1.0 in accuracy); a long test
    "model=tiny", "callbacks=early_stopping", "callbacks.early_stopping.patience=1",
    "callbacks.early_stopping.min_delta=1.0", "callbacks.latest.keep_when_done=false",
    "task.data.train_size=256", "task.data.eval_max_len=1500", "extras.print_config=false",
    "callbacks.progress_bar.refresh_rate=0",
]  # fmt: skip


def stopped_training(last: Path) -> bool:
    """Whether last.ckpt holds a state that early stopping had stopped (it is renamed into
    place whole, so it can be read while the run goes on)."""
    if not last.exists():
        return False
    state = torch.load(last, weights_only=True)["callbacks"]["LatestCheckpoint"]
    return state["should_stop"]


@pytest.mark.slow
def test_a_run_killed_after_training_resumes_to_its_test_and_trains_no_further(tmp_path):
    """SIGKILL (a session's end) once early stopping has stopped training, in the test or the
    last moments of fit: the training state is kept until the run is done, and the resumed
    run tests the best checkpoint without training again (Lightning forgets should_stop)."""
    run_dir, last = tmp_path / "run", tmp_path / "run" / "checkpoints" / "last.ckpt"
    process = subprocess.Popen(
        train_py(*EARLY_STOPPED, f"hydra.run.dir={run_dir}"),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not stopped_training(last):
        assert process.poll() is None and time.monotonic() < deadline, "training did not stop"
        time.sleep(0.02)
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL, "killed before it finished its test"
    steps = torch.load(last, weights_only=True)["global_step"]

    run(f"run_dir={run_dir}")  # the stored callbacks.latest.keep_when_done=false holds again

    recorded = status.read(run_dir)
    assert recorded.state == "completed" and recorded.steps == steps, "no step trained again"
    assert not last.exists(), "the finished run dropped its training state"
    with (run_dir / "csv" / "metrics.csv").open() as file:
        tested = [row for row in csv.DictReader(file) if row.get("test/acc")]
    assert len(tested) == 1, "tested once, after the resume"


@pytest.mark.slow
def test_last_ckpt_at_an_epochs_end_holds_that_epochs_early_stopping_and_best_checkpoint(
    tmp_path,
):
    """last.ckpt saved where an epoch ends (no timed saves) holds early stopping's and the best
    checkpoint's state after that epoch's validation: a run killed then and resumed stops where
    the uninterrupted run stops, and tests the same best checkpoint."""
    run_dir, last = tmp_path / "run", tmp_path / "run" / "checkpoints" / "last.ckpt"
    process = subprocess.Popen(
        train_py(
            "model=tiny", "callbacks=early_stopping", "callbacks.early_stopping.patience=5",
            "callbacks.latest.every_n_minutes=null", "task.data.train_size=256",
            "trainer.max_epochs=3", "test=false", "extras.print_config=false",
            "callbacks.progress_bar.refresh_rate=0", f"hydra.run.dir={run_dir}",
        ),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not last.exists():
            assert process.poll() is None and time.monotonic() < deadline, "no epoch ended"
            time.sleep(0.02)
        state = torch.load(last, weights_only=True)
    finally:
        process.kill()
        process.wait(timeout=60)
    assert state["epoch"] == 0, "the save of the first epoch's end"
    (stopping,) = [v for k, v in state["callbacks"].items() if k.startswith("EarlyStopping")]
    (best,) = [v for k, v in state["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert stopping["best_score"].isfinite(), "early stopping has seen epoch 0's validation"
    assert Path(best["best_model_path"]).name == "epoch_000.ckpt"


TINY_EPOCH = ["model=tiny", "task.data.train_size=256", "trainer.max_epochs=1"]


@pytest.fixture
def sigterm_as_training_ends(monkeypatch) -> None:
    """A real SIGTERM after Lightning's last look for one in fit (it looks between steps and
    batches), as training ends."""
    from attnlab.runner.checkpoints import LatestCheckpoint

    end_of_training = LatestCheckpoint.on_train_end

    def then_sigterm(self, trainer, module) -> None:
        end_of_training(self, trainer, module)
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler only notes it

    monkeypatch.setattr(LatestCheckpoint, "on_train_end", then_sigterm)


def test_a_sigterm_as_training_ends_stops_the_run_before_its_test(
    make_config, tmp_path, sigterm_as_training_ends
):
    """The test would forget that SIGTERM: it starts afresh."""
    from attnlab.runner.train import train

    with pytest.raises(SystemExit):  # else it tests, and returns the test metrics
        train(make_config(TINY_EPOCH))
    assert status.read(tmp_path).state == "interrupted"
    assert (tmp_path / "checkpoints" / "last.ckpt").exists(), "the final state, to resume"


def test_a_sigterm_as_training_ends_lets_a_run_without_a_test_finish(
    make_config, tmp_path, sigterm_as_training_ends
):
    """Nothing is left to stop: the run is done, not interrupted."""
    from attnlab.runner.train import train

    train(make_config([*TINY_EPOCH, "test=false"]))
    assert status.read(tmp_path).state == "completed"


def test_a_new_run_refuses_a_directory_that_holds_a_run(tmp_path):
    status.RunStatus("completed", 0.0).write(tmp_path)
    result = subprocess.run(
        train_py("model=tiny", f"hydra.run.dir={tmp_path}"),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"attnlab: {tmp_path} already holds a run: resume it with run_dir={tmp_path}, or start "
        "this one in a new directory (leave hydra.run.dir to its default)"
    )


def test_resuming_a_directory_without_a_checkpoint_is_one_sentence(tmp_path):
    result = subprocess.run(
        train_py(f"run_dir={tmp_path}"), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith(
        f"attnlab: run_dir={tmp_path} has no checkpoints/last.ckpt to resume from"
    )


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path):
    from attnlab.config.resolvers import unique_directory

    base = str(tmp_path / "runs" / "2026-01-01_00-00-00")
    made = [unique_directory(base) for _ in range(3)]
    assert made == [base, f"{base}_2", f"{base}_3"]
    assert all(Path(d).is_dir() for d in made)


@pytest.mark.slow
def test_three_runs_launched_at_once_write_three_directories(tmp_path):
    processes = [
        subprocess.Popen(
            train_py(
                "model=tiny",
                "trainer.max_epochs=1",
                "task.data.train_size=64",
                "test=false",
                "extras.print_config=false",
                f"paths.log_dir={tmp_path}",
            ),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for process in processes:
        assert process.wait(timeout=300) == 0, process.stderr.read()[-2000:]
    runs = list((tmp_path / "probe" / "runs").iterdir())
    assert len(runs) == 3
    for run_dir in runs:
        assert status.read(run_dir).state == "completed"
        assert len(list((run_dir / "checkpoints").glob("*.ckpt"))) == 2, "last and best, one run's"


class Positions:
    """A dataset whose item is its key: a batch of positions for the token-batch sampler."""

    def __getitem__(self, key):
        return key

    def __len__(self) -> int:
        return 50


def batches_of(loader) -> list[list[int]]:
    return [batch if isinstance(batch, list) else batch.tolist() for batch in loader]


@pytest.mark.parametrize("epoch", [0, 3])
def test_a_resumed_pass_serves_the_rest_of_the_same_order(epoch):
    import numpy as np

    from attnlab.data.batching import TokenBatchSampler
    from attnlab.data.loader import ResumableLoader, ResumableSampler

    token_batches = [np.arange(i, i + 5) for i in range(0, 50, 5)]
    makers = [
        lambda: ResumableLoader(
            list(range(50)), sampler=ResumableSampler(range(50), num_replicas=1, rank=0, seed=7),
            batch_size=4,
        ),
        lambda: ResumableLoader(
            Positions(), sampler=TokenBatchSampler(token_batches, True, seed=7), batch_size=None,
            collate_fn=lambda positions: positions,
        ),
    ]  # fmt: skip
    for make in makers:
        whole = make()
        whole.sampler.set_epoch(epoch)
        global_state = torch.get_rng_state()
        expected = batches_of(whole)
        assert torch.get_rng_state().equal(global_state), "the global generator is untouched"
        resumed = make()
        iterator = iter(resumed)  # Lightning makes the iterator before the resume is known
        resumed.sampler.set_epoch(epoch)
        resumed.resume_after(3)
        assert batches_of(iterator) == expected[3:]
        assert batches_of(resumed) == expected, "only one pass is shortened"


@pytest.mark.slow
def test_a_run_whose_directory_a_config_replaces_leaves_no_stray_directory(tmp_path):
    run(
        "debug=fast", "model=tiny", "extras.print_config=false", f"paths.log_dir={tmp_path}",
        "callbacks.progress_bar.refresh_rate=0",
    )  # fmt: skip
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_dir())
    runs = [d for d in made if d.count("/") == 2]
    assert len(runs) == 1 and runs[0].startswith("debug/runs/"), made


def test_a_sigterm_while_a_run_sets_up_ends_it_interrupted_with_its_lock_freed(
    make_config, tmp_path, monkeypatch
):
    """Before Lightning's handler exists (the default handler would kill the run with its
    status left running and its lock held)."""
    from attnlab.runner import plan
    from attnlab.runner.train import sigterm_stops, train

    building = plan.build_datamodule

    def then_sigterm(cfg):
        os.kill(os.getpid(), signal.SIGTERM)
        return building(cfg)

    monkeypatch.setattr(plan, "build_datamodule", then_sigterm)
    with pytest.raises(SystemExit), sigterm_stops():
        train(make_config(TINY_EPOCH))
    assert status.read(tmp_path).state == "interrupted"
    assert not list(tmp_path.glob("*.lock")), "the lock is freed"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handler is put back"


NASTY = "a b'c\"d;$(touch PWNED)"  # a space, both quotes, a command substitution


@pytest.mark.parametrize(
    "name", [NASTY, "x${oc.env:HOME}", "back\\", "q\\'", "null", "a,b", "(x)", " lead", ""]
)
def test_a_value_quoted_for_hydra_reads_back_as_itself(name):
    from attnlab.shell import override, value

    assert value(override("run_dir", name)) == name


def pasted(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """`line` pasted into bash in `cwd`, `python` being this interpreter."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": path},
    )  # fmt: skip


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_printed_resume_line_resumes_a_run_named_to_inject_and_runs_nothing_else(tmp_path):
    run_dir = tmp_path / NASTY
    result = interrupt(run_dir, signal.SIGINT)
    prefix = "attnlab: interrupted; resume with: "
    assert last_line(result).startswith(prefix), result.stderr[-2000:]
    resumed = pasted(last_line(result).removeprefix(prefix), ROOT)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not (ROOT / "PWNED").exists() and not (tmp_path / "PWNED").exists()
    assert status.read(run_dir).state == "completed"
    assert sorted(p.name for p in tmp_path.iterdir()) == [NASTY]


@pytest.mark.slow
def test_a_resume_that_would_change_the_saved_optimizer_is_refused_and_changes_nothing(tmp_path):
    interrupt(tmp_path, signal.SIGINT)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    result = subprocess.run(
        train_py(f"run_dir={tmp_path}", "task.optim.lr=5"),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert last_line(result) == (
        "attnlab: a resume goes on with the optimizer and early stopping the run saved, which "
        "keep task.optim.lr=0.001 (not 5): drop that setting, or start a new run with it; a "
        "resume cannot change task.optim.lr, task.optim.weight_decay, task.optim.betas, "
        "task.optim.eps, callbacks.early_stopping.patience"
    )
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before
    run(f"run_dir={tmp_path}", "task.optim.warmup_steps=3")  # the schedule a resume applies


@pytest.mark.slow
def test_a_run_killed_before_its_first_save_is_told_the_command_that_starts_it_again(tmp_path):
    run_dir = tmp_path / "killed"
    started = [*TINY_EPOCH, "test=false", "extras.print_config=false"]
    process = subprocess.Popen(
        train_py(*started, f"hydra.run.dir={run_dir}", f"paths.log_dir={tmp_path / 'logs'}"),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (run_dir / status.FILE).is_file():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.kill()
    process.wait(timeout=60)
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()
    result = subprocess.run(
        train_py(f"run_dir={run_dir}"), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    prefix = (
        f"attnlab: {run_dir} has no checkpoints/last.ckpt yet: its run was stopped before its "
        "first save, so there is nothing to resume; start it again, in a new directory, with: "
    )
    assert result.returncode == 1 and last_line(result).startswith(prefix), result.stderr
    again = pasted(last_line(result).removeprefix(prefix), ROOT)
    assert again.returncode == 0, again.stderr[-2000:]
    (new,) = (tmp_path / "logs").glob("*/runs/*")
    assert status.read(new).state == "completed"


@pytest.mark.slow
def test_a_metrics_step_edited_to_no_count_is_one_sentence_and_the_file_is_kept(tmp_path):
    run_dir = tmp_path / "run"
    assert interrupt(run_dir, signal.SIGTERM).returncode == 1
    metrics = run_dir / "csv" / "metrics.csv"
    header, first, *rest = metrics.read_text().splitlines(keepends=True)
    step = header.split(",").index("step")
    cells = first.split(",")
    cells[step] = "inf"
    metrics.write_text("".join([header, ",".join(cells), *rest]))
    edited = metrics.read_bytes()

    resumed = subprocess.run(
        train_py(f"run_dir={run_dir}"), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode != 0 and "Traceback" not in resumed.stderr
    assert resumed.stderr.strip().splitlines()[-1] == (
        f"attnlab: {metrics} line 2 holds 'inf' for step, which is not a count of steps: "
        "restore that line (or delete it), then resume"
    )
    assert metrics.read_bytes() == edited, "the file is refused before it is rewritten"
