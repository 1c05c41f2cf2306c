"""`attnlab dashboard`: a W&B report comparing the runs of one group (wandb-workspaces).

For the runs of `group` in `entity/project` the report holds:
- the runs table, grouped by pe × norm × synthesizer, with the best and the final value of the
  optimized metric pinned beside the variant;
- every validation metric's curves, runs of one variant averaged (min-max band);
- a parallel-coordinates panel from the swept config keys to the best value of the metric;
- bar charts of the final and the best value by variant.
Saving it needs W&B online: without a login or an answer from the server it stops within
seconds, with one sentence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from attnlab.config.build import flatten
from attnlab.errors import ConfigError
from attnlab.logger.wandb import BY_POSITION, why_offline

VARIANT = ("pe.name", "norm.name", "synthesizer.name")


def swept_keys(configs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The config keys whose value differs between runs (W&B's own keys aside)."""
    flats = [flatten(config) for config in configs]
    keys = dict.fromkeys(key for flat in flats for key in flat if not key.startswith("_"))
    return [k for k in keys if len({repr(flat.get(k)) for flat in flats}) > 1]


def build_report(
    project: str,
    entity: str,
    group: str,
    metric: str,
    mode: str,
    swept: list[str],
    val_metrics: list[str],
) -> Any:
    """The report object (not saved: `.save()` publishes it)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    best, final = f"{metric}.{mode}", f"{metric}.last"
    runset = wr.Runset(
        entity=entity,
        project=project,
        name=group,
        filters=expr.And(expr.Metric("Group") == group),
        groupby=[f"config.{key}" for key in VARIANT],
        pinned_columns=[
            *(f"config:{key}.value" for key in VARIANT),
            f"summary:{best}",
            f"summary:{final}",
        ],
    )
    grouped = {"groupby_aggfunc": "mean", "groupby_rangefunc": "minmax"}
    curves = [
        wr.LinePlot(title=name, x="trainer/global_step", y=[name], **grouped)
        for name in val_metrics
    ]
    axes = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(key)) for key in swept]
    axes.append(
        wr.ParallelCoordinatesPlotColumn(
            metric=wr.SummaryMetric(best), display_name=f"best {metric}"
        )
    )
    panels = [
        *curves,
        wr.ParallelCoordinatesPlot(title=f"swept settings -> best {metric}", columns=axes),
        wr.BarPlot(title=f"final {metric}", metrics=[wr.SummaryMetric(final)], **grouped),
        wr.BarPlot(title=f"best {metric}", metrics=[wr.SummaryMetric(best)], **grouped),
    ]
    return wr.Report(
        project=project,
        entity=entity,
        title=f"attnlab: {group}"[:128],
        description=f"The runs of group {group}, by pe × norm × synthesizer; {metric} ({mode}).",
        blocks=[
            wr.H1(text=f"{group}: {metric} by variant"),
            wr.P(text="Runs grouped by pe × norm × synthesizer; curves averaged per variant."),
            wr.PanelGrid(runsets=[runset], panels=panels),
        ],
    )


def dashboard(project: str, group: str, entity: str | None = None, timeout: float = 5.0) -> str:
    """Build and save the report of `group`; returns its URL."""
    if reason := why_offline(timeout):
        raise ConfigError(
            f"attnlab dashboard needs W&B online, but {reason}: compare the runs without W&B "
            "(`attnlab compare <sweep dir>`), or sync them (`wandb sync`) and run this where "
            "W&B is reachable"
        )
    import wandb

    api = wandb.Api(timeout=int(timeout) + 10)
    entity = entity or api.default_entity
    runs = list(api.runs(f"{entity}/{project}", filters={"group": group}))
    if not runs:
        raise ConfigError(
            f"{entity}/{project} has no runs in group {group!r}: check --group, or upload "
            "offline runs first (`wandb sync <run dir>/wandb/offline-run-*`)"
        )
    config = runs[0].config
    val_metrics = sorted(
        {
            key
            for run in runs
            for key in run.summary.keys()  # noqa: SIM118 (a W&B summary, not a dict)
            if key.startswith("val/")
            and not BY_POSITION.fullmatch(key)
            and not key.endswith("_by_position")
        }
    )
    report = build_report(
        project,
        entity,
        group,
        config["optimized_metric"],
        config["task"]["metric_mode"],
        swept_keys(run.config for run in runs),
        val_metrics,
    )
    report.save()
    return report.url
