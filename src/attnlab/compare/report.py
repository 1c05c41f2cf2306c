"""`attnlab compare DIR [--out OUT]`: one table of every run below DIR, with plots, written into
OUT (default: DIR).

    comparison.md    the table (one row per run: the swept overrides, state, final and best
                     optimized metric, the other test metrics, parameters, steps, wall time,
                     and the last line of the error of a run that failed) and the plots
    comparison.csv   the same rows, unrounded
    curves_<metric>.png          every run's validation curve of each metric on one axis
    acc_by_position.png          accuracy by position, runs × positions (the probe)
    and the figures each task family declares for its runs (`attnlab.reports.families`):
    ppl_by_length.png            perplexity by evaluation length (language models)
    loss_by_position.png         loss by position in the longest windows (language models)
    acc_by_length.png            exact match by length (the synthetic tasks)
    acc_longest_bucket.png       exact match in the longest bucket (the synthetic tasks)

When the seed was swept, comparison.md also has a table by configuration: each test metric's
mean and 95% t interval over the seeds, and each configuration's difference from a baseline
(`--baseline LABEL`, else the first configuration) on the optimized metric, paired by seed,
Holm–Bonferroni over the table (`attnlab.compare.differences`);
the accuracy-by-position plot then shows configurations, averaged over seeds. The language
model plots always show configurations: the mean over the seeds, the range shaded. A metric at
an evaluation length the run's model cannot take reads n/a (`attnlab.compare.lengths`).

Rows are sorted by the best value of the optimized metric; runs that failed or never
finished keep their row, marked so. Runs that never trained (a fast_dev_run, a run that
ended before its first step: a config error) have no row and no curve: a note under the
table names them and why. Needs no service: only the run directories.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.compare.differences import (
    baseline_of,
    by_seed,
    corrected,
    difference,
    family_legend,
    formatted,
)
from attnlab.compare.kinds import ComparisonPlot, Kind
from attnlab.compare.lengths import NOT_APPLICABLE, order, seeds_summary, value
from attnlab.compare.runs import BY_POSITION, Run, find_runs
from attnlab.compare.seeds import (
    SEED,
    Configuration,
    best_first,
    configurations,
    summary,
)
from attnlab.compare.table import Row, format_cell, markdown_table
from attnlab.errors import ConfigError
from attnlab.files import write_text, written
from attnlab.plots import curves_figure, heatmap_figure, save

THROUGHPUT = "train/tokens_per_s"  # attnlab.runner.callbacks.TokenThroughput


@dataclass
class Comparison:
    directory: Path
    runs: list[Run]  # those that trained, one row each
    rows: list[Row]
    plots: list[Path]
    by_configuration: list[Configuration]  # when seeds were swept: runs grouped over them
    never_trained: list[Run]

    @property
    def every_run(self) -> list[Run]:
        return [*self.runs, *self.never_trained]

    @property
    def failed(self) -> list[Run]:
        return [run for run in self.every_run if run.state not in ("completed", "running")]

    def table(self) -> str:
        """The table, and the notes naming the damaged runs and those that never trained."""
        parts = [markdown_table(self.rows)] if self.rows else []
        if damaged := [run for run in self.every_run if run.damaged]:
            lines = [f"Damaged: {len(damaged)} runs whose files cannot all be read"]
            parts.append("\n".join(lines + [f"- {r.name}: {r.damaged}" for r in damaged]))
        if self.never_trained:
            parts.append(never_trained_note(self.never_trained))
        return "\n\n".join(parts)


def never_trained_note(runs: list[Run]) -> str:
    lines = [f"Never trained, so not in the table: {len(runs)} runs"]
    for run in runs:
        if run.fast_dev_run:
            why = "a fast_dev_run (debug=fast), a check that the configuration runs"
        else:
            error = run.status.error if run.status and run.state == "failed" else None
            why = f"{run.state} before its first step" + (f": {error}" if error else "")
        lines.append(f"- {run.name}: {format_cell(why)}")
    return "\n".join(lines)


NAMING_ONLY = {"tags"}  # override keys that name runs (for loggers) and configure nothing


def swept_keys(runs: list[Run]) -> list[str]:
    """Override keys whose value differs between runs, in command-line order."""
    keys = list(dict.fromkeys(key for run in runs for key in run.overrides))
    return [k for k in keys if k not in NAMING_ONLY and len({run.value(k) for run in runs}) > 1]


def labels(runs: list[Run], keys: list[str]) -> dict[str, str]:
    """A legend label per run name: its swept overrides (its name where that is ambiguous)."""
    found = {
        run.name: ",".join(f"{k}={run.value(k)}" for k in keys if run.value(k)) for run in runs
    }
    counts = list(found.values()).count
    return {name: text if text and counts(text) == 1 else name for name, text in found.items()}


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def number_or_text(value: str) -> float | str:
    """A swept value as a number where it is one with a fraction (lr=0.000241... prints short)."""
    try:
        return float(value) if any(c in value for c in ".eE") else value
    except ValueError:
        return value


def row(run: Run, keys: list[str], test_metrics: list[str]) -> Row:
    metric = run.setting("optimized_metric") or ""
    mode = run.setting("task.metric_mode") or "max"
    cells: Row = {"run": run.name}
    cells.update({key: number_or_text(run.value(key)) for key in keys})
    if not keys:
        cells["overrides"] = ",".join(f"{k}={v}" for k, v in run.overrides.items())
    cells.update(
        state=run.state,
        metric=metric,
        final=run.last(metric),
        best=run.best(metric, mode),
        **{name: value(run, name) for name in test_metrics},
        **({"test examples": partial} if (partial := scored_examples(run)) else {}),
        params=run.status.params if run.status else None,
        steps=run.steps(),
        wall_time=duration(run.status.wall_time) if run.status else None,
        error=(run.status.error if run.status else None) or "",
    )
    return cells


def sort_key(run: Run, cells: Row) -> tuple[int, float]:
    """Best first by the run's own metric mode; runs without a value last."""
    best = cells["best"]
    if not isinstance(best, float):
        return (1, 0.0)
    return (0, -best if run.setting("task.metric_mode") != "min" else best)


def write_csv(rows: list[Row], path: Path) -> None:
    columns = list(dict.fromkeys(key for cells in rows for key in cells))
    with written(path) as partial, partial.open("w", newline="") as file:
        writer = csv.DictWriter(file, columns)
        writer.writeheader()
        writer.writerows(rows)


def plot_curves(
    runs: list[Run], names: dict[str, str], directory: Path, configs: list[Configuration]
) -> list[Path]:
    """A plot per validation metric: every run's curve, or, where seeds were swept
    (`configs`), every configuration's mean over its seeds with their range shaded."""
    paths = []
    for metric in metric_names(runs, "val/"):
        if configs:
            bands = {f"{c.label} ({len(c.runs)} seeds)": c.band(metric) for c in configs}
            curves = {label: band for label, band in bands.items() if band[0]}
        else:
            curves = {
                names[run.name]: tuple(zip(*run.metrics[metric], strict=True))
                for run in runs
                if run.metrics.get(metric)
            }
        name = f"curves_{metric.replace('/', '_')}.png"
        if curves:  # not a metric every run logged only as NaN
            paths.append(save(curves_figure(curves, metric), directory / name))
    return paths


def plot_by_position(configs: list[Configuration], path: Path) -> list[Path]:
    """Accuracy by position (the probe), configurations × positions, mean over seeds."""
    accuracy = {config.label: config.by_position() for config in configs}
    accuracy = {label: values for label, values in accuracy.items() if values}
    if not accuracy:
        return []
    positions = sorted({p for values in accuracy.values() for p in values})
    matrix = np.array([[values.get(p, np.nan) for p in positions] for values in accuracy.values()])
    seeds = " (mean over seeds)" if any(len(config.runs) > 1 for config in configs) else ""
    tested = any(BY_POSITION.fullmatch(m) and m.startswith("test/") for c in configs
                 for run in c.runs for m in run.metrics)  # fmt: skip
    split = "test" if tested else "validation (its last evaluation)"
    title = f"token accuracy by position, {split} split{seeds}"
    columns = [str(p) for p in positions]
    figure = heatmap_figure(
        matrix, list(accuracy), columns, title, ("position", "configuration"), "token accuracy"
    )
    return [save(figure, path)]


def ranked(configs: list[Configuration]) -> tuple[list[Configuration], str, str]:
    """The configurations best first on the test value of the optimized metric, that metric
    and its mode (max or min)."""
    first = configs[0].runs[0]
    metric = (first.setting("optimized_metric") or "").replace("val/", "test/", 1)
    mode = first.setting("task.metric_mode") or "max"
    return best_first(configs, metric, mode), metric, mode


def plot_configuration_curves(configs: list[Configuration], metric: str, path: Path) -> list[Path]:
    """Each configuration's validation curve of `metric`, the mean over its seeds, in the
    order of the configurations table."""
    curves = {config.label: config.curve(metric) for config in ranked(configs)[0]}
    curves = {label: curve for label, curve in curves.items() if curve[0]}
    if not curves:
        return []
    seeds = " (mean over seeds)" if any(len(config.runs) > 1 for config in configs) else ""
    return [save(curves_figure(curves, f"{metric}{seeds}"), path)]


def configurations_table(configs: list[Configuration], baseline: str | None = None) -> str:
    """One row per configuration, best first on the test value of the optimized metric: each
    test metric's mean and 95% interval over its seeds, its difference from the `baseline`
    configuration (a label; None: the first in the sweep's order) on that metric
    (`attnlab.compare.differences`, Holm over the table), its parameters and, where runs
    measured it, its training throughput (tokens/s over the whole run)."""
    runs = [run for config in configs for run in config.runs]
    ordered, metric, mode = ranked(configs)
    base_label = baseline_of([c.label for c in configs], baseline, "the baseline")
    base = next(config for config in configs if config.label == base_label)
    found = corrected([
        difference(by_seed(config, metric), by_seed(base, metric), ratio="ppl" in metric)
        for config in ordered if config is not base
    ])  # fmt: skip
    tested = any(not d.note.startswith("fewer than") for d in found)
    cells_by_label = dict(zip([c.label for c in ordered if c is not base], found, strict=True))
    rows: list[Row] = []
    for config in ordered:
        cells: Row = {**config.setting, "seeds": len(config.runs)}
        cells.update({name: seeds_summary(config, name) for name in metric_names(runs, "test/")})
        if tested:
            gap = cells_by_label.get(config.label)
            cells[f"{metric} vs {base_label}"] = "baseline" if gap is None else formatted(gap, mode)
        status = config.runs[0].status
        cells["params"] = status.params if status else None
        if config.values(THROUGHPUT):
            cells["train tokens/s"] = summary(config.values(THROUGHPUT), digits=0)
        rows.append(cells)
    if not tested:
        return markdown_table(rows)
    chosen = "named by the block" if baseline else "the first configuration of the sweep"
    legend = (
        f"vs {base_label} ({chosen}): each configuration's {metric} minus the "
        f"baseline's, with its 95% interval, paired by seed on the seeds both ran (n pairs), "
        f"else Welch's t (n of each); {'×: the ratio, on logs; ' if 'ppl' in metric else ''}"
        f"ahead or behind ({mode} is better) where Holm's adjusted p < 0.05, else tie. "
        + family_legend(found)
    )
    return f"{legend}\n\n{markdown_table(rows)}"


def metric_names(runs: list[Run], prefix: str) -> list[str]:
    """The scores some run logged under `prefix` (a number or NaN), those at evaluation
    lengths in length order: neither accuracy by position nor how many examples were scored
    (`test examples` says that, where a test scored fewer)."""
    found = {m for run in runs for m in (*run.metrics, *run.nan) if m.startswith(prefix)}
    counts = (f"{prefix}examples", f"{prefix}examples_total")
    kept = (m for m in found if not BY_POSITION.fullmatch(m) and m not in counts)
    return sorted(kept, key=order)


def scored_examples(run: Run) -> str:
    """`N of M` where the run's test scored N of its split's M examples, else blank."""
    scored, total = run.last("test/examples"), run.last("test/examples_total")
    if scored is None or total is None or scored >= total:
        return ""
    return f"{scored:,.0f} of {total:,.0f}"


def compare(
    directory: Path,
    out: Path | None = None,
    figures: Sequence[ComparisonPlot] = (),
    baseline: str | None = None,
) -> Comparison:
    """Read every run below `directory`, write the comparison files into `out` (default: it),
    with the task families' `figures` (`attnlab.reports.families.FIGURES`) after its own; the
    table by configuration compares each with `baseline` (a label; None: the first)."""
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory: pass a run or a sweep directory")
    found = find_runs(directory)
    if not found:
        raise ConfigError(
            f"{directory} holds no runs (no .hydra/config.yaml below it): pass a run or sweep "
            "directory, e.g. logs/probe/multiruns/<time>"
        )
    out = directory if out is None else out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"cannot write the comparison into {out} ({error.strerror}): pass a directory you "
            "can write to"
        ) from None
    runs = [run for run in found if run.trained]
    keys = swept_keys(runs)
    test_metrics = metric_names(runs, "test/")
    pairs = sorted(
        ((run, row(run, keys, test_metrics)) for run in runs), key=lambda p: sort_key(*p)
    )
    runs, rows = [run for run, _ in pairs], [cells for _, cells in pairs]
    configs = configurations(runs, keys)
    if baseline is not None:
        baseline_of([config.label for config in configs], baseline, "--baseline")
    plots = plot_curves(runs, labels(runs, keys), out, configs if SEED in keys else [])
    plots += plot_by_position(configs, out / "acc_by_position.png")
    plots += [path for figure in figures for path in figure.plot(configs, out / figure.name)]
    never_trained = [run for run in found if not run.trained]
    by_configuration = configs if SEED in keys else []
    comparison = Comparison(directory, runs, rows, plots, by_configuration, never_trained)
    write_csv(rows, out / "comparison.csv")
    write_text(out / "comparison.md", document(comparison, baseline))
    return comparison


def not_applicable_note(comparison: Comparison) -> str:
    """What n/a means, where a cell of the table says it."""
    if not any(NOT_APPLICABLE in cells.values() for cells in comparison.rows):
        return ""
    return " n/a: an evaluation length longer than the run's model has positions for."


def document(comparison: Comparison, baseline: str | None = None) -> str:
    lines = [
        f"# Comparison of {len(comparison.every_run)} runs in `{comparison.directory}`",
        "",
        "Sorted by the best value of each run's optimized metric (`metric`); `final` is its "
        "last value. Test metrics are those of the best checkpoint."
        + not_applicable_note(comparison),
        "",
        comparison.table(),
        "",
    ]
    if comparison.by_configuration:
        lines += [
            "## By configuration: mean ± 95% t interval over seeds",
            "",
            configurations_table(comparison.by_configuration, baseline),
            "",
        ]
    lines += [f"![{path.stem}]({path.name})\n" for path in comparison.plots]
    return "\n".join(lines)


def validation_loss(configs: list[Configuration], path: Path) -> list[Path]:
    return plot_configuration_curves(configs, "val/loss", path)


KINDS = {
    "configurations": Kind(
        configurations_table, validation_loss, "validation loss by step", baseline=True
    )
}
