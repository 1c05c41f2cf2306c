"""`attnlab compare` and the end of a sweep: every run in the table, failed ones included."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from wandb_records import read_offline_run

from attnlab.compare.runs import read_run
from attnlab.errors import ConfigError
from attnlab.reports.families import compare
from attnlab.status import RunStatus

TINY = ["model=tiny", "task.data.train_size=128", "task.data.max_len=8", "trainer.max_epochs=2"]
QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]


def fake_run(
    directory: Path,
    overrides: list[str],
    rows: list[dict],
    state: str = "completed",
    mode: str = "max",
    error: str | None = None,
    pid: int | None = None,
) -> Path:
    """A run directory as train.py leaves it: Hydra's files, Lightning's CSV, our status."""
    (directory / ".hydra").mkdir(parents=True)
    config = {
        "optimized_metric": "${task.metric}",
        "task": {"metric": "val/acc", "metric_mode": mode},
    }
    (directory / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    columns = sorted({key for row in rows for key in row})
    (directory / "csv").mkdir()
    with (directory / "csv" / "metrics.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, ["epoch", "step", *columns])
        writer.writeheader()
        writer.writerows(rows)
    status = RunStatus(state, time.time(), params=1234, error=error)
    if pid is not None:
        status.pid = pid
    if state != "running":
        status.ended = time.time()
    status.write(directory)
    return directory


def read_csv(path: Path) -> list[dict]:
    with path.open() as file:
        return list(csv.DictReader(file))


def test_rows_are_sorted_by_the_best_metric_and_keep_failed_and_unfinished_runs(tmp_path):
    fake_run(tmp_path / "0", ["pe=rope", "trainer.max_epochs=2"], [
        {"step": 10, "val/acc": 0.5}, {"step": 20, "val/acc": 0.9}, {"step": 30, "val/acc": 0.7},
        {"step": 30, "test/acc": 0.88, "test/acc_pos/1": 1.0, "test/acc_pos/2": 0.75},
    ])  # fmt: skip
    fake_run(tmp_path / "1", ["pe=t5", "trainer.max_epochs=2"], [
        {"step": 10, "val/acc": 0.95}, {"step": 20, "val/acc": 0.96},
        {"step": 20, "test/acc": 0.97, "test/acc_pos/1": 1.0, "test/acc_pos/2": 0.9},
    ])  # fmt: skip
    fake_run(tmp_path / "2", ["pe=alibi", "trainer.max_epochs=2"], [{"step": 10, "val/acc": 0.2}],
             state="failed", error="Diverged: train/loss is nan at step 12")  # fmt: skip
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    fake_run(
        tmp_path / "10", ["pe=none", "trainer.max_epochs=2"], [{"step": 10, "val/acc": 0.1}],
        state="running", pid=dead.pid,
    )  # fmt: skip

    comparison = compare(tmp_path)

    assert [run.name for run in comparison.runs] == ["1", "0", "2", "10"]
    rows = read_csv(tmp_path / "comparison.csv")
    assert [row["pe"] for row in rows] == ["t5", "rope", "alibi", "none"]
    assert "trainer.max_epochs" not in rows[0], "only swept overrides get a column"
    assert [row["state"] for row in rows] == ["completed", "completed", "failed", "unfinished"]
    assert float(rows[1]["best"]) == 0.9 and float(rows[1]["final"]) == 0.7
    assert float(rows[0]["test/acc"]) == 0.97 and rows[0]["params"] == "1234"
    assert rows[2]["error"] == "Diverged: train/loss is nan at step 12"
    assert [run.name for run in comparison.failed] == ["2", "10"]
    table = (tmp_path / "comparison.md").read_text()
    assert "| 2 | alibi | failed |" in table and "Diverged: train/loss is nan" in table
    assert {p.name for p in comparison.plots} == {"curves_val_acc.png", "acc_by_position.png"}
    for plot in comparison.plots:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({plot.name})" in table


def test_a_minimized_metric_sorts_smallest_first_and_runs_may_log_different_metrics(tmp_path):
    fake_run(tmp_path / "a", ["lr=1"], [{"step": 1, "val/acc": 0.3, "val/bleu": 20.0}], mode="min")
    fake_run(tmp_path / "b", ["lr=2"], [{"step": 1, "val/acc": 0.1}], mode="min")
    comparison = compare(tmp_path)
    assert [run.name for run in comparison.runs] == ["b", "a"]
    assert {p.name for p in comparison.plots} == {"curves_val_acc.png", "curves_val_bleu.png"}


def test_one_run_and_a_running_run_compare_too(tmp_path):
    fake_run(tmp_path, ["pe=rope"], [{"step": 5, "val/acc": 0.4}], state="running", pid=os.getpid())
    comparison = compare(tmp_path)
    (row,) = read_csv(tmp_path / "comparison.csv")
    assert row["state"] == "running" and row["overrides"] == "pe=rope" and row["steps"] == "5"
    assert comparison.failed == []


def test_a_resumed_job_is_still_the_configuration_of_its_sweep(tmp_path):
    """Resuming (`train.py run_dir=<job>`) rewrites the job's overrides: ckpt_path comes in,
    display settings go. Neither makes it a different configuration."""
    fake_run(tmp_path / "0", ["pe=none", *QUIET], [{"step": 5, "val/acc": 0.4}])
    resumed = ["pe=rope", "extras.print_config=false", "ckpt_path=1/checkpoints/last.ckpt"]
    fake_run(tmp_path / "1", resumed, [{"step": 5, "val/acc": 0.5}])
    compare(tmp_path)
    rows = read_csv(tmp_path / "comparison.csv")
    assert [row["pe"] for row in rows] == ["rope", "none"]
    assert list(rows[0])[:3] == ["run", "pe", "state"], "pe is the only swept key"


def test_a_run_left_at_a_default_shows_the_default(tmp_path):
    """One run of a sweep changed the normalizer and the seed: the others read softmax and
    their config's seed, not blanks."""
    fake_run(tmp_path / "0", ["pe=rope"], [{"step": 5, "val/acc": 0.4}])
    fake_run(tmp_path / "1", ["pe=rope", "norm=l2", "seed=1"], [{"step": 5, "val/acc": 0.5}])
    config = tmp_path / "0" / ".hydra" / "config.yaml"
    stored = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**stored, "norm": {"name": "softmax"}, "seed": 42}))
    compare(tmp_path)
    rows = read_csv(tmp_path / "comparison.csv")
    assert [(row["norm"], row["seed"]) for row in rows] == [("l2", "1"), ("softmax", "42")]


@pytest.mark.slow
def test_runs_that_never_trained_are_named_under_the_table_not_compared(tmp_path):
    """A debug=fast check and a run stopped by a config error trained nothing: they get no
    row, no curve and no rank; the note under the table says what each was."""
    fake_run(tmp_path / "trained", ["pe=rope"], [{"step": 5, "val/acc": 0.4}])
    fast = subprocess.run(
        [sys.executable, "train.py", "debug=fast", "model=tiny", *QUIET,
         f"hydra.run.dir={tmp_path / 'fast'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fast.returncode == 0, fast.stderr[-3000:]
    assert not (tmp_path / "fast" / "checkpoints").exists(), "debug=fast writes no checkpoint"
    bad = subprocess.run(
        [sys.executable, "train.py", "pe=rope", "++pe.max_len=16", "model=tiny", *QUIET,
         f"hydra.run.dir={tmp_path / 'bad'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 1

    comparison = compare(tmp_path)

    assert [run.name for run in comparison.runs] == ["trained"]
    assert [row["run"] for row in read_csv(tmp_path / "comparison.csv")] == ["trained"]
    assert [run.name for run in comparison.failed] == ["bad"], "a check that ran is no failure"
    note = comparison.table().split("\n\n")[-1].splitlines()
    assert note == [
        "Never trained, so not in the table: 2 runs",
        "- bad: failed before its first step: attnlab.errors.ConfigError: 'rope' has no option "
        f"max_len; its options are: {', '.join(rope_options())}",
        "- fast: a fast_dev_run (debug=fast), a check that the configuration runs",
    ]
    assert "\n".join(note) in (tmp_path / "comparison.md").read_text()


def rope_options() -> list[str]:
    """pe=rope's settings, as its YAML lists them (less name and metadata)."""
    from attnlab.config.options import CONF_DIR

    node = yaml.safe_load((CONF_DIR / "pe" / "rope.yaml").read_text())
    return sorted(set(node) - {"_target_", "name", "description", "paper"})


def test_booleans_print_one_way_however_a_run_wrote_them(tmp_path):
    """A sweep's overrides hold True, a command line true, a run left at the default only its
    config (False)."""
    fake_run(tmp_path / "0", ["task.markers=True"], [{"step": 5, "val/acc": 0.6}])
    fake_run(tmp_path / "1", ["task.markers=false"], [{"step": 5, "val/acc": 0.5}])
    fake_run(tmp_path / "2", ["pe=rope"], [{"step": 5, "val/acc": 0.4}])
    config = tmp_path / "2" / ".hydra" / "config.yaml"
    stored = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**stored, "task": {**stored["task"], "markers": False}}))
    compare(tmp_path)
    rows = read_csv(tmp_path / "comparison.csv")
    assert [row["task.markers"] for row in rows] == ["true", "false", "false"]


def test_a_directory_without_runs_is_one_sentence(tmp_path):
    with pytest.raises(ConfigError, match="holds no runs"):
        compare(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.commands.cli", "compare", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"attnlab: {tmp_path / 'missing'} is not a directory: pass a run or a sweep directory"
    )


def test_out_writes_the_comparison_elsewhere_and_leaves_the_records_untouched(tmp_path):
    records = tmp_path / "records"
    fake_run(records / "0", ["pe=rope"], [{"step": 5, "val/acc": 0.6}])
    fake_run(records / "1", ["pe=t5"], [{"step": 5, "val/acc": 0.5}])
    before = sorted(path.relative_to(records) for path in records.rglob("*"))
    out = tmp_path / "report" / "pe"
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.commands.cli", "compare", str(records), "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(path.relative_to(records) for path in records.rglob("*")) == before
    assert [row["pe"] for row in read_csv(out / "comparison.csv")] == ["rope", "t5"]
    assert (out / "curves_val_acc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out / 'comparison.md'}" in result.stdout
    (tmp_path / "a_file").write_text("")
    for unwritable in (tmp_path / "a_file", tmp_path / "a_file" / "below"):
        with pytest.raises(ConfigError, match=r"cannot write the comparison into .*: pass a dir"):
            compare(records, unwritable)


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("config.yaml", "model: {d_model: 16\n", r".*Error"),  # cut off mid-write
        ("config.yaml", "- 1\n", r"it holds list data, not a mapping"),
        ("overrides.yaml", "a: 1\n", r"it holds dict data, not a list of text"),
        ("overrides.yaml", "- [seed=1]\n", r"it holds list data, not a list of text"),
    ],
)
def test_a_damaged_run_record_is_one_sentence_naming_its_file(name, text, why, tmp_path):
    run = fake_run(tmp_path / "run", ["seed=1"], ROWS)
    (run / ".hydra" / name).write_text(text)
    with pytest.raises(ConfigError, match=rf"{name} is damaged \({why}\): restore it"):
        read_run(run, tmp_path)


@pytest.mark.slow
def test_a_sweep_with_a_failing_job_compares_every_job_and_exits_non_zero(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "train.py", "-m", "pe=learned,rope", "task.optim.lr=1e-3,1e38",
            "++pe.max_len=16", "logger=wandb", *TINY, *QUIET, f"paths.log_dir={tmp_path}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1].startswith("attnlab: 3 of 4 jobs did not complete")
    )
    (sweep,) = (tmp_path / "probe" / "multiruns").iterdir()
    rows = {row["task.optim.lr"]: row for row in read_csv(sweep / "comparison.csv")}
    assert rows["0.001"]["state"] == "completed"
    assert rows["1e+38"]["error"].startswith("attnlab.errors.Diverged: train/loss is nan")
    assert "| run | task.optim.lr | state |" in result.stdout, "the sweep prints the table"
    never_trained = "failed before its first step: attnlab.errors.ConfigError: 'rope' has no"
    assert f"- 2: {never_trained}" in result.stdout and f"- 3: {never_trained}" in result.stdout
    recorded = json.loads((sweep / "1" / "status.json").read_text())
    assert recorded["state"] == "failed" and "Diverged" in recorded["traceback"]
    assert "this job failed, the sweep goes on" in (sweep / "1" / "train.log").read_text()
    exit_codes = [read_offline_run(next((sweep / job / "wandb").glob("offline-run-*"))).exit_code
                  for job in ("0", "1")]  # fmt: skip
    assert exit_codes == [0, 1], "the diverged job's W&B run is finished as failed"
    assert (sweep / "acc_by_position.png").is_file() and (sweep / "curves_val_acc.png").is_file()
    cli = subprocess.run(
        [sys.executable, "-m", "attnlab.commands.cli", "compare", str(sweep)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0 and "| 0 | 0.001 | completed |" in cli.stdout


ROWS = [{"step": 1, "val/acc": 0.5}, {"step": 2, "val/acc": 0.6}, {"step": 3, "val/acc": 0.7}]


def damage_status(run: Path, text: str) -> None:
    (run / "status.json").write_text(text)


def damage_metrics(run: Path, row: int, value: str) -> None:
    path = run / "csv" / "metrics.csv"
    lines = path.read_text().splitlines()
    cells = lines[row].split(",")
    cells[-1] = value
    lines[row] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def rewrite_metrics(run: Path, edit) -> None:
    path = run / "csv" / "metrics.csv"
    path.write_bytes(edit(path.read_bytes()))


def edit_status(run: Path, **changes) -> None:
    path = run / "status.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


DAMAGED_RUN_FILES = {  # id: (damage, what the sentence says)
    "status_not_json": (
        lambda run: damage_status(run, "{garbage"),
        r"status.json cannot be read as JSON",
    ),
    "status_not_an_object": (
        lambda run: damage_status(run, "[1, 2]"),
        r"status.json is not a JSON object",
    ),
    "status_state_edited": (
        lambda run: damage_status(run, '{"state": "done"}'),
        r"status.json records the state 'done', not one of running, completed",
    ),
    "status_steps_text": (
        lambda run: edit_status(run, steps="five"),
        r"status.json records steps='five', not of type int",
    ),
    "status_started_a_bool": (
        lambda run: edit_status(run, started=True),
        r"status.json records started=True, not of type int",
    ),
    "metric_not_a_number": (
        lambda run: damage_metrics(run, 2, "0.6x"),
        r"metrics.csv line 3 holds '0.6x' for val/acc, which is not a number",
    ),
    "metrics_step_infinite": (
        lambda run: rewrite_metrics(run, lambda data: data.replace(b",2,0.6", b",inf,0.6")),
        r"metrics.csv line 3 holds 'inf' for step, which is not a count of steps",
    ),
    "metrics_step_a_fraction": (
        lambda run: rewrite_metrics(run, lambda data: data.replace(b",2,0.6", b",2.5,0.6")),
        r"metrics.csv line 3 holds '2.5' for step, which is not a count of steps",
    ),
    "metrics_without_steps": (
        lambda run: rewrite_metrics(run, lambda data: b"a,b\n1,2\n"),
        r"metrics.csv has no step column \(its header is 'a,b'\)",
    ),
    "metrics_row_too_long": (
        lambda run: rewrite_metrics(run, lambda data: data.replace(b"0.5", b"0.5,9")),
        r"metrics.csv line 2 has 5 fields where its header has 4",
    ),
    "metrics_cut_after_the_end": (
        lambda run: rewrite_metrics(run, lambda data: data[:20]),
        r"metrics.csv ends within a line after its run ended \(it was cut short\)",
    ),
    "metrics_not_text": (
        lambda run: rewrite_metrics(run, lambda data: b"\xff\xfe" + data),
        r"metrics.csv cannot be read as CSV \(UnicodeDecodeError\)",
    ),
}


@pytest.mark.parametrize(("damage", "sentence"), DAMAGED_RUN_FILES.values(), ids=DAMAGED_RUN_FILES)
def test_a_damaged_run_file_is_named_and_the_run_listed_as_damaged(damage, sentence, tmp_path):
    fake_run(tmp_path / "a", ["seed=1"], ROWS)
    damage(fake_run(tmp_path / "b", ["seed=2"], ROWS))
    comparison = compare(tmp_path)
    (damaged,) = [run for run in comparison.every_run if run.damaged]
    assert damaged.name == "b" and damaged.state == "damaged"
    assert re.search(rf"- b: \S+{sentence}", comparison.table())


def test_a_last_metrics_row_cut_short_is_not_damage(tmp_path):
    """A run still writing its file may leave its last row half written."""
    run = fake_run(tmp_path / "a", ["seed=1"], ROWS)
    damage_metrics(run, 3, "0.")
    assert not compare(tmp_path).every_run[0].damaged
