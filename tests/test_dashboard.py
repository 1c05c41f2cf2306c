"""`attnlab dashboard`: the W&B report's content, built offline (never saved here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import wandb_workspaces.reports.v2 as wr
from wandb_workspaces import expr

from attnlab.compare.dashboard import build_report, swept_keys
from attnlab.config.build import flatten


def report() -> wr.Report:
    return build_report(
        project="attnlab",
        entity="lab",
        group="probe_table",
        metric="val/acc",
        mode="max",
        swept=["pe.name", "norm.name", "task.markers"],
        val_metrics=["val/acc", "val/loss", "val/seq_acc"],
    )


def test_the_report_groups_the_groups_runs_by_variant():
    (grid,) = [block for block in report().blocks if isinstance(block, wr.PanelGrid)]
    (runset,) = grid.runsets
    assert (runset.entity, runset.project) == ("lab", "attnlab")
    assert runset.groupby == ["config.pe.name", "config.norm.name", "config.synthesizer.name"]
    (condition,) = expr.string_to_filterexpr_list(runset.filters)
    assert (condition.key, condition.op, condition.value) == (
        expr.Metric("Group"),
        "=",
        "probe_table",
    )
    assert runset.pinned_columns == [
        "config:pe.name.value", "config:norm.name.value", "config:synthesizer.name.value",
        "summary:val/acc.max", "summary:val/acc.last",
    ]  # fmt: skip


def test_the_report_has_curves_parallel_coordinates_and_bars():
    (grid,) = [block for block in report().blocks if isinstance(block, wr.PanelGrid)]
    curves = [p for p in grid.panels if isinstance(p, wr.LinePlot)]
    assert [(p.x, p.y) for p in curves] == [
        ("trainer/global_step", [m]) for m in ("val/acc", "val/loss", "val/seq_acc")
    ]
    (parallel,) = [p for p in grid.panels if isinstance(p, wr.ParallelCoordinatesPlot)]
    assert [c.metric for c in parallel.columns] == [
        wr.Config("pe.name"), wr.Config("norm.name"), wr.Config("task.markers"),
        wr.SummaryMetric("val/acc.max"),
    ]  # fmt: skip
    bars = [p for p in grid.panels if isinstance(p, wr.BarPlot)]
    assert [p.metrics for p in bars] == [
        [wr.SummaryMetric("val/acc.last")],
        [wr.SummaryMetric("val/acc.max")],
    ]
    assert all(p.groupby_aggfunc == "mean" for p in [*curves, *bars])


def test_swept_keys_are_the_config_keys_that_differ():
    configs = [
        {"pe": {"name": "rope"}, "norm": {"name": "l2"}, "seed": 1, "_wandb": {"x": 1}},
        {"pe": {"name": "t5"}, "norm": {"name": "l2"}, "seed": 1, "_wandb": {"x": 2}},
    ]
    assert flatten(configs[0]) == {"pe.name": "rope", "norm.name": "l2", "seed": 1, "_wandb.x": 1}
    assert swept_keys(configs) == ["pe.name"]


@pytest.mark.slow
def test_without_network_the_dashboard_stops_within_seconds_with_one_sentence(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_API_KEY="x" * 40, WANDB_BASE_URL="http://127.0.0.1:9")
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.commands.cli", "dashboard", "--group", "probe_table"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "attnlab: attnlab dashboard needs W&B online, but the W&B server http://127.0.0.1:9 "
        "does not answer"
    )
    assert "attnlab compare" in last and "Traceback" not in result.stderr
