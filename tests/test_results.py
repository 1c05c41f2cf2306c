"""RESULTS.md's tables come from run records: the generator, the archive and the seed groups.

tests/data/results/ is a small copy of the layout: a RESULTS.md with one block of each
kind, and under docs/results/runs/ the records of real runs (archived from sweeps of
experiment=probe_causal, probe_extrapolation and pe_translation, a few jobs each).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import ROOT, SHARED_DATA
from test_compare import fake_run

from attnlab import status
from attnlab.compare.budget import budget, stopped_by
from attnlab.compare.report import configurations_table
from attnlab.compare.runs import find_runs
from attnlab.compare.seeds import best_first, configurations, summary
from attnlab.errors import ConfigError
from attnlab.reports import results
from attnlab.reports.families import compare
from attnlab.reports.results import archive, regenerate, regenerate_pages
from attnlab.tasks.probe.report import token_summary

FIXTURE = Path(__file__).parent / "data" / "results"


def fixture_copy(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "results")
    return tmp_path / "results" / "RESULTS.md"


def test_the_generator_reproduces_the_committed_tables_from_the_fixture_records():
    results_md = FIXTURE / "RESULTS.md"
    assert regenerate(results_md, draw=False) == results_md.read_text()


@pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason="RESULTS.md's paired bootstrap reads test references from ../shared/data, absent here",
)
def test_results_md_and_its_pages_match_the_run_records_committed_beside_them():
    done = regenerate_pages(ROOT, draw=False)
    assert len(done.texts) > 1, "RESULTS.md and the study pages below docs/results"
    stale = [
        str(page.relative_to(ROOT)) for page, text in done.texts.items() if text != page.read_text()
    ]
    assert not stale and not done.unlinked, (
        f"{stale or done.unlinked} out of date with docs/results/runs: run `attnlab results`"
    )


def test_drawing_adds_each_studys_plot_and_links_it(tmp_path):
    results_md = fixture_copy(tmp_path)
    text = regenerate(results_md, draw=True)
    for study, caption in (
        ("probe_sample", "accuracy by position"),
        ("extrapolation_sample", "accuracy by position"),
        ("translation_sample", "validation loss by step"),
    ):
        assert (results_md.parent / f"{study}.png").stat().st_size > 1000  # beside the page
        assert f"![{study}: {caption}]({study}.png)" in text


def test_a_figure_drawn_from_other_records_fails_the_check(tmp_path):
    results_md = fixture_copy(tmp_path)
    results_md.write_text(regenerate(results_md, draw=True))
    assert regenerate(results_md, draw=False) == results_md.read_text(), "fresh figures pass"
    (run, *_) = find_runs(results_md.parent / "docs" / "results" / "runs" / "translation_sample")
    metrics = run.path / "csv" / "metrics.csv"
    columns = metrics.read_text().splitlines()[0].split(",")
    metrics.write_text(metrics.read_text() + ",".join("0" for _ in columns) + "\n")  # one more row
    stale = "translation_sample.png was drawn from other records than"
    with pytest.raises(ConfigError, match=re.escape(stale)):
        regenerate(results_md, draw=False)
    regenerate(results_md, draw=True)
    unstamped = results_md.parent / "probe_sample.png"
    unstamped.write_bytes(b"not a png")
    with pytest.raises(ConfigError, match=r"probe_sample\.png was drawn from other records"):
        regenerate(results_md, draw=False)


def test_a_figure_with_nothing_left_to_draw_is_removed_with_its_link(tmp_path, monkeypatch):
    results_md = fixture_copy(tmp_path)
    regenerate(results_md, draw=True)
    figure = results_md.parent / "translation_sample.png"
    assert figure.is_file()
    nothing = dataclasses.replace(results.KINDS["configurations"], plot=lambda configs, path: [])
    monkeypatch.setitem(results.KINDS, "configurations", nothing)
    text = regenerate(results_md, draw=True)
    assert not figure.exists() and "translation_sample.png" not in text
    results_md.write_text(text)
    assert regenerate(results_md, draw=False) == text, "and the check passes"


def test_a_measurement_that_contradicts_the_prediction_is_flagged(tmp_path):
    results_md = fixture_copy(tmp_path)
    records = results_md.parent / "docs" / "results" / "runs" / "probe_sample"
    before = regenerate(results_md, draw=False)
    assert "| none | softmax | 2 | 0.118 (all 2 seeds at the bound) |" in before  # as predicted
    cannot = next(run for run in find_runs(records) if run.overrides["norm"] == "softmax")
    metrics = cannot.path / "csv" / "metrics.csv"
    *lines, last = metrics.read_text().splitlines()
    cells = last.split(",")
    cells[lines[0].split(",").index("test/acc")] = "0.5"  # better than equal outputs allow
    metrics.write_text("\n".join([*lines, ",".join(cells)]) + "\n")
    after = regenerate(results_md, draw=False)
    assert "| **none** | **softmax** | **2** | **0.309 ± 2.429** |" in after
    assert after.count("**partly**") == before.count("**partly**") + 1


@pytest.mark.slow
def test_check_fails_with_one_sentence_when_a_table_is_out_of_date(tmp_path):
    results_md = fixture_copy(tmp_path)
    results_md.write_text(results_md.read_text().replace("| rope |", "| RoPE |", 1))
    command = [
        sys.executable,
        "-m",
        "attnlab.commands.cli",
        "results",
        "--check",
        "--file",
        str(results_md),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode != 0
    assert "out of date with its run records: run `attnlab results`" in done.stderr
    assert "Traceback" not in done.stderr
    subprocess.run([*command[:-3], "--file", str(results_md)], check=True, capture_output=True)
    assert regenerate(results_md, draw=False) == results_md.read_text()


def test_a_block_without_records_or_with_an_unknown_kind_is_one_sentence(tmp_path):
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("<!-- results:missing probe -->\n<!-- /results:missing -->\n")
    with pytest.raises(ConfigError, match="no run records for missing"):
        regenerate(results_md)
    results_md.write_text("<!-- results:missing table -->\n<!-- /results:missing -->\n")
    with pytest.raises(ConfigError, match="has kind 'table': use one of"):
        regenerate(results_md)


def test_a_bad_block_on_a_study_page_is_named_by_its_page(tmp_path):
    fake_run(tmp_path / "docs" / "results" / "runs" / "mt" / "0", ["seed=0"], [])
    page = tmp_path / "docs" / "results" / "mt" / "README.md"
    page.parent.mkdir(parents=True)
    page.write_text("<!-- results:mt configurations among=pe=none -->\n<!-- /results:mt -->\n")
    reading = results.Reading(tmp_path)
    with pytest.raises(ConfigError, match=r"^docs/results/mt/README\.md block mt names pe=none"):
        regenerate(page, draw=False, reading=reading)
    page.write_text("<!-- results:mt configurations among -->\n<!-- /results:mt -->\n")
    with pytest.raises(ConfigError, match=r"^docs/results/mt/README\.md block mt has option among"):
        regenerate(page, draw=False, reading=reading)


def test_a_probe_block_over_runs_of_another_task_is_one_sentence(tmp_path):
    fake_run(tmp_path / "docs" / "results" / "runs" / "mt" / "0", ["seed=0"], [])
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("<!-- results:mt probe -->\n<!-- /results:mt -->\n")
    with pytest.raises(ConfigError, match="kind probe, which reads probe runs, but its records"):
        regenerate(results_md)


def test_archive_copies_each_runs_record_and_no_checkpoint(tmp_path):
    sweep = tmp_path / "sweep"
    for job, seed in enumerate((0, 1)):
        run = fake_run(sweep / str(job), [f"seed={seed}"], [{"step": 1, "test/acc": 0.5}])
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    assert archive(sweep, tmp_path / "records") == 2
    copied = sorted(
        str(p.relative_to(tmp_path / "records"))
        for p in (tmp_path / "records").rglob("*")
        if p.is_file()
    )
    assert copied == [
        f"{job}/{name}"
        for job in ("0", "1")
        for name in (
            ".hydra/config.yaml",
            ".hydra/overrides.yaml",
            "csv/metrics.csv",
            "status.json",
        )
    ]
    with pytest.raises(ConfigError, match="exists: remove it first"):
        archive(sweep, tmp_path / "records")
    with pytest.raises(ConfigError, match="holds no runs"):
        archive(tmp_path / "records" / "0" / "csv", tmp_path / "elsewhere")
    (sweep / "1" / "status.json").write_text("{")
    with pytest.raises(ConfigError, match=r"1/status.json cannot be read as JSON: restore it"):
        archive(sweep, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()


def test_a_study_with_a_damaged_record_is_not_computed(tmp_path):
    run = fake_run(tmp_path / "docs" / "results" / "runs" / "p" / "0", ["seed=0"], [])
    (run / "status.json").write_text('{"state": "completed", "started": 1, "params": "many"}')
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("<!-- results:p probe -->\n<!-- /results:p -->\n")
    with pytest.raises(
        ConfigError, match=r"params='many', not of type int: the tables of p are computed"
    ):
        regenerate(results_md)


def test_runs_that_differ_only_in_their_seed_form_one_configuration(tmp_path):
    accuracy = {"rope": (0.9, 0.7, 0.8), "t5": (0.8, 0.75, 0.775), "none": (0.1, 0.2, 0.15)}
    for pe, values in accuracy.items():
        for seed, acc in enumerate(values):
            rows = [{"step": 1, "test/acc": acc}]
            fake_run(tmp_path / f"{pe}{seed}", [f"pe={pe}", f"seed={seed}"], rows)
    runs = find_runs(tmp_path)
    configs = configurations(runs, ["pe", "seed"])
    assert sorted(c.label for c in configs) == ["pe=none", "pe=rope", "pe=t5"]
    configs = sorted(configs, key=lambda c: ["pe=rope", "pe=t5", "pe=none"].index(c.label))
    assert [c.mean("test/acc") for c in configs] == pytest.approx([0.8, 0.775, 0.15])
    two_seeds = configurations([r for r in runs if r.value("seed") != "2"], ["pe", "seed"])
    assert "vs " not in configurations_table(two_seeds), "fewer than 3 seeds: no verdict"
    fake_run(tmp_path / "6", ["pe=xl", "seed=0"], [{"step": 1, "val/acc": 0.5}])
    with_unmeasured = configurations(find_runs(tmp_path), ["pe", "seed"])
    assert [c.label for c in best_first(with_unmeasured, "test/acc", "min")] == [
        "pe=none", "pe=t5", "pe=rope", "pe=xl"
    ]  # fmt: skip
    assert best_first(configs, "test/acc", "max")[0].label == "pe=rope"


def test_a_configurations_curve_is_the_mean_over_seeds_at_the_steps_all_of_them_logged(tmp_path):
    losses = {0: [(100, 5.0), (200, 4.0), (300, 3.0)], 1: [(100, 6.0), (300, 2.0)]}
    for seed, series in losses.items():
        rows = [{"step": step, "val/loss": value} for step, value in series]
        fake_run(tmp_path / str(seed), ["pe=rope", f"seed={seed}"], rows)
    (config,) = configurations(find_runs(tmp_path), ["pe", "seed"])
    assert config.curve("val/loss") == ([100, 300], [5.5, 2.5])
    assert config.curve("val/bleu") == ([], [])


@pytest.mark.parametrize(
    ("values", "text"),
    [
        ([], ""),
        ([0.5], "0.500 (1 seed: no interval)"),
        ([1.0, 0.9, 0.95], "0.950 ± 0.124"),  # t(0.975, 2) = 4.303, s / √3 = 0.0289
        ([0.0], "0.000 (1 seed: no interval)"),
        ([0.000158, 0.000146], "0.000152 ± 7.62e-05"),  # t(0.975, 1) = 12.706, s / √2 = 6e-06
        ([0.00912], "0.00912 (1 seed: no interval)"),
        ([0.012, 0.012], "0.012 ± 0.000"),
    ],
)
def test_a_summary_is_the_mean_and_its_95_percent_t_interval_over_seeds(values, text):
    assert summary(values) == text


def test_compare_adds_a_table_by_configuration_when_seeds_were_swept(tmp_path):
    for job, (pe, seed, acc) in enumerate([("rope", 0, 0.9), ("rope", 1, 0.8), ("t5", 0, 0.1)]):
        fake_run(tmp_path / str(job), [f"pe={pe}", f"seed={seed}"], [{"step": 1, "test/acc": acc}])
    comparison = compare(tmp_path)
    document = (tmp_path / "comparison.md").read_text()
    assert [c.label for c in comparison.by_configuration] == ["pe=rope", "pe=t5"]
    assert "## By configuration: mean ± 95% t interval over seeds" in document
    assert "| pe=rope |" not in document  # the table shows the setting's columns
    assert "| rope | 2 | 0.850 ± 0.635 | 1,234 |" in document
    assert "| t5 | 1 | 0.100 (1 seed: no interval) | 1,234 |" in document


def test_a_blocks_budget_line_is_read_from_the_runs_configs_and_statuses(tmp_path):
    for job, (max_steps, schedule, steps) in enumerate(
        [(500, "inverse_sqrt", 500), (1000, "cosine", 740)]
    ):
        run = fake_run(tmp_path / str(job), [f"seed={job}"], [{"step": steps, "val/acc": 0.5}])
        config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        config["trainer"] = {"max_steps": max_steps, "max_epochs": -1}
        config["task"]["optim"] = {"lr": 0.001, "warmup_steps": 100, "schedule": schedule}
        config["task"]["system"] = {"val_generate": 100}
        config["callbacks"] = {
            "early_stopping": {"monitor": "val/acc", "mode": "max", "stopping_threshold": 0.99}
        }
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    assert budget(find_runs(tmp_path)) == (
        "Budget, from the runs' records: at most 500 / 1000 steps; ran 500–740 steps; lr 0.001; "
        "warm-up steps 100; schedule cosine / inverse_sqrt; validation generates for the first "
        "100 examples only; checkpoint tested: best val/acc (max) on validation; stopped once "
        "val/acc rose above 0.99 (runs made 1 validation); runs stopped: 1 at the step cap, "
        "1 otherwise."
    )


def test_a_budget_line_names_the_devices_the_runs_recorded(tmp_path):
    for job, device in enumerate(("NVIDIA H200", "NVIDIA H200", None)):
        run = fake_run(tmp_path / str(job), [f"seed={job}"], [{"step": 5, "val/acc": 0.5}])
        recorded = status.read(run)
        recorded.device = device
        recorded.write(run)
    line = budget(find_runs(tmp_path))
    assert "; on NVIDIA H200 (1 of 3 runs did not record theirs); " in line
    (tmp_path / "2").rename(tmp_path.parent / "unrecorded")
    assert "; on NVIDIA H200; " in budget(find_runs(tmp_path))


def test_a_budget_line_gives_the_stopping_rule_and_the_validations_each_run_made(tmp_path):
    for job, epochs in enumerate((19, 24)):
        rows = [{"step": 245 * (epoch + 1), "val/loss": 3.0} for epoch in range(epochs)]
        run = fake_run(tmp_path / str(job), [f"seed={job}"], rows)
        config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        config["trainer"] = {"max_steps": -1, "max_epochs": 40}
        config["callbacks"] = {
            "early_stopping": {"monitor": "val/loss", "patience": 2, "min_delta": 0.02}
        }
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    line = budget(find_runs(tmp_path))
    assert line.startswith("Budget, from the runs' records: at most 40 epochs; ")
    assert line.endswith(
        "stopped after 2 validations in a row without beating the best by more than 0.02 "
        "(runs made 19–24 validations); runs stopped: 2 by patience."
    )


def test_a_budget_line_names_both_ways_a_threshold_and_patience_stop_a_run(tmp_path):
    """The length-generalization rule: a threshold on accuracy, or patience with no min_delta,
    which reads as a new best rather than an improvement "by 0.0"."""
    run = fake_run(tmp_path / "0", ["seed=0"], [{"step": 250, "val/acc": 0.995}])
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    config["trainer"] = {"max_steps": 1000}
    config["callbacks"] = {
        "early_stopping": {
            "monitor": "val/acc",
            "mode": "max",
            "patience": 1000,
            "min_delta": 0.0,
            "stopping_threshold": 0.99,
        }
    }
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    assert budget(find_runs(tmp_path)).endswith(
        "stopped once val/acc rose above 0.99, or after 1000 validations in a row without a new "
        "best (runs made 1 validation); runs stopped: 1 at the threshold."
    )


def test_a_budget_line_says_when_runs_had_no_early_stopping_and_how_they_ended(tmp_path):
    """A fixed budget (Kazemnejad et al.'s protocol) beside runs stopped at a threshold: the
    line says which runs had no rule and how every run ended."""
    for job, (steps, stop) in enumerate([(1000, None), (1000, None), (300, 0.99)]):
        run = fake_run(tmp_path / str(job), [f"seed={job}"], [{"step": steps, "val/acc": 0.995}])
        config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        config["trainer"] = {"max_steps": 1000}
        rule = {"monitor": "val/acc", "mode": "max", "stopping_threshold": stop} if stop else None
        config["callbacks"] = {"early_stopping": rule}
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    assert budget(find_runs(tmp_path)).endswith(
        "stopped once val/acc rose above 0.99 (runs made 1 validation); 2 of 3 runs without "
        "early stopping; runs stopped: 1 at the threshold, 2 at the step cap."
    )
    (tmp_path / "2").rename(tmp_path.parent / "ruled")
    assert budget(find_runs(tmp_path)).endswith(
        "; no early stopping; runs stopped: 2 at the step cap."
    )


def stopping_run(directory: Path, series: list[float], trainer: dict, stop: dict) -> Path:
    rows = [{"step": 100 * (n + 1), "val/acc": value} for n, value in enumerate(series)]
    run = fake_run(directory, [f"seed={directory.name}"], rows)
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    config["trainer"] = trainer
    config["callbacks"] = {"early_stopping": {"monitor": "val/acc", "mode": "max", **stop}}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    return run


@pytest.mark.parametrize(
    "series,trainer,stop,ended",
    [
        ([0.5, 0.995], {"max_steps": 1000}, {"stopping_threshold": 0.99}, "at the threshold"),
        ([0.5, 0.6], {"max_steps": 200}, {"stopping_threshold": 0.99}, "at the step cap"),
        ([0.5, 0.7, 0.69, 0.71], {"max_steps": -1}, {"patience": 2, "min_delta": 0.02}, "by patience"),
        ([0.5, 0.7, 0.69, 0.73], {"max_steps": -1}, {"patience": 2, "min_delta": 0.02}, "at the epoch cap"),
        ([0.5, 0.6], {"max_steps": 1000}, {"stopping_threshold": 0.99}, "otherwise"),
    ],
)  # fmt: skip
def test_each_run_is_said_to_stop_by_the_rule_its_records_show(
    tmp_path, series, trainer, stop, ended
):
    (run,) = find_runs(stopping_run(tmp_path / "0", series, trainer, stop).parent)
    assert stopped_by(run, "val/acc") == ended


@pytest.mark.parametrize("last", [0.98, 0.99, 0.995])
def test_a_run_is_said_to_stop_at_the_threshold_exactly_when_lightning_stops_it(tmp_path, last):
    from lightning.pytorch.callbacks import EarlyStopping

    stop = {"stopping_threshold": 0.99, "patience": 1000}
    (run,) = find_runs(stopping_run(tmp_path / "0", [0.5, last], {"max_steps": 1000}, stop).parent)
    lightning = EarlyStopping(monitor="val/acc", mode="max", **stop)
    stops, _ = lightning._evaluate_stopping_criteria(torch.tensor(last))
    assert (stopped_by(run, "val/acc") == "at the threshold") == stops


def test_with_seeds_swept_the_curves_are_configurations_with_their_range(tmp_path, monkeypatch):
    from attnlab.compare import report

    drawn = {}
    monkeypatch.setattr(
        report, "curves_figure", lambda curves, metric: drawn.setdefault(metric, curves)
    )
    monkeypatch.setattr(report, "save", lambda figure, path: path)
    for pe in ("rope", "t5"):
        for seed, losses in enumerate(([3.0, 2.0], [5.0, 4.0])):
            rows = [{"step": s, "val/loss": loss} for s, loss in zip((10, 20), losses, strict=True)]
            fake_run(tmp_path / f"{pe}{seed}", [f"pe={pe}", f"seed={seed}"], rows)
    compare(tmp_path)
    band = ([10, 20], [4.0, 3.0], [3.0, 2.0], [5.0, 4.0])  # steps, mean, smallest, largest
    assert drawn["val/loss"] == {"pe=rope (2 seeds)": band, "pe=t5 (2 seeds)": band}


def against(tmp_path: Path, accuracy: dict[str, tuple[float, ...]], baseline: str | None):
    """The configurations table of runs with these test accuracies by seed, against
    `baseline`: the cell of each configuration by its label."""
    for pe, values in accuracy.items():
        for seed, acc in enumerate(values):
            if not (tmp_path / f"{pe}{seed}").exists():
                fake_run(tmp_path / f"{pe}{seed}", [f"pe={pe}", f"seed={seed}"],
                         [{"step": 1, "test/acc": acc}])  # fmt: skip
    table = configurations_table(configurations(find_runs(tmp_path), ["pe", "seed"]), baseline)
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]
    column = rows[0].index(f"test/acc vs {baseline or 'pe=none'}")
    return table, {row[0].removeprefix("| "): row[column] for row in rows[1:]}


def test_each_configuration_is_compared_with_the_baseline_paired_by_seed(tmp_path):
    # rope − none: 0.8, 0.5, 0.65 (t = 7.5, p = 0.017); t5 − none: 0.7, 0.55, 0.625 (p = 0.005)
    accuracy = {"none": (0.1, 0.2, 0.15), "rope": (0.9, 0.7, 0.8), "t5": (0.8, 0.75, 0.775)}
    table, cells = against(tmp_path, accuracy, "pe=none")
    assert cells == {
        "rope": "+0.650 ± 0.373 (paired by seed, n=3; Holm p = 0.017): ahead",
        "t5": "+0.625 ± 0.186 (paired by seed, n=3; Holm p = 0.010): ahead",
        "none": "baseline",
    }
    assert "vs pe=none (named by the block)" in table
    assert "Holm–Bonferroni over the 2 comparisons of this table." in table
    # without a baseline: the first configuration in the sweep's order, said in the legend
    assert "vs pe=none (the first configuration of the sweep)" in against(tmp_path, {}, None)[0]
    with pytest.raises(ConfigError, match=r"baseline pe=xl is none of the configurations: name "
                       r"one of pe=none; pe=rope; pe=t5"):  # fmt: skip
        configurations_table(configurations(find_runs(tmp_path), ["pe", "seed"]), "pe=xl")


def test_a_standing_against_a_named_baseline_stays_when_a_better_configuration_is_added(tmp_path):
    accuracy = {"none": (0.1, 0.2, 0.15), "rope": (0.9, 0.7, 0.8), "t5": (0.8, 0.75, 0.775)}
    _, before = against(tmp_path, accuracy, "pe=none")
    # xl − none: 0.89, 0.78, 0.835; under the rule of overlapping intervals against the best,
    # rope was best and would now stand below xl
    _, after = against(tmp_path, {**accuracy, "xl": (0.99, 0.98, 0.985)}, "pe=none")
    assert after["xl"].endswith(": ahead")
    for label in ("rope", "t5"):
        assert after[label].split("Holm p")[0] == before[label].split("Holm p")[0]
        assert after[label].rpartition(": ")[2] == before[label].rpartition(": ")[2] == "ahead"
    assert after["none"] == "baseline"


def test_compare_takes_a_baseline_and_names_the_labels_for_an_unknown_one(tmp_path):
    for job, (pe, seed, acc) in enumerate(
        [(pe, seed, acc + 0.01 * seed**2) for pe, acc in (("rope", 0.9), ("t5", 0.5))
         for seed in range(3)]
    ):  # fmt: skip
        fake_run(tmp_path / str(job), [f"pe={pe}", f"seed={seed}"], [{"step": 1, "test/acc": acc}])
    compare(tmp_path, baseline="pe=t5")
    document = (tmp_path / "comparison.md").read_text()
    assert (
        "| test/acc vs pe=t5 |" in document and "every seed differs by exactly +0.400" in document
    )
    with pytest.raises(ConfigError, match=r"--baseline pe=xl is none of the configurations: "
                       r"name one of pe=rope; pe=t5"):  # fmt: skip
        compare(tmp_path, baseline="pe=xl")


def test_a_probe_whose_every_seed_sits_at_the_chance_bound_says_so():
    bound = 16 / 136
    assert token_summary([bound] * 3, bound) == "0.118 (all 3 seeds at the bound)"
    assert token_summary([bound, bound, 0.2], bound) == summary([bound, bound, 0.2])
    assert token_summary([bound], bound) == "0.118 (1 seed: no interval)"
