"""A language model's perplexity by evaluation length, and its loss by position: RESULTS.md's
`lengths` kind and `attnlab compare`'s plots of language-model runs.

An evaluation logs `<stage>/<measure>@L` for each evaluation length L (loss, ppl,
ppl_sliding; bpc and bpc_sliding with the char tokenizer) and writes, into the run
directory, lengths/<stage>.json (each length's numbers) and
lengths/<stage>_loss_by_position.csv (the mean loss at each position of the non-overlapping
windows of each length), with one run's figures of both (`lm_length_figures`); see
`attnlab.tasks.lm.system`.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from attnlab.compare.differences import (
    AHEAD,
    Difference,
    baseline_of,
    by_seed,
    corrected,
    difference,
    family_legend,
    formatted,
)
from attnlab.compare.kinds import ComparisonPlot, Kind
from attnlab.compare.lengths import (
    NOT_APPLICABLE,
    STAGE,
    applicable,
    band,
    by_length,
    lengths,
    past_bound,
    seeds_summary,
    training_length,
)
from attnlab.compare.runs import Run
from attnlab.compare.seeds import Configuration
from attnlab.compare.table import Row, markdown_table
from attnlab.data.task import WINDOWS
from attnlab.plots import Band, bands_figure, curve_style, fitted_legend, new_figure, save
from attnlab.tasks.lm.sinks import plot_sinks, sinks_table

LENGTH_WORDS = ("improves", "worsens", "tie")  # lower perplexity at L than at training: better


def loss_by_position(run: Run, stage: str = STAGE) -> dict[int, dict[int, float]]:
    """length -> position -> mean loss there, from lengths/<stage>_loss_by_position.csv (only
    the lengths the model could take are in it); {} where the run has no such file."""
    curves: dict[int, dict[int, float]] = {}
    try:
        with (run.path / "lengths" / f"{stage}_loss_by_position.csv").open(newline="") as file:
            for row in csv.DictReader(file):
                curves.setdefault(int(row["length"]), {})[int(row["position"])] = float(row["loss"])
    except FileNotFoundError:
        return {}
    return curves


def ppl_bands(configs: list[Configuration], measure: str) -> dict[str, Band]:
    """Per configuration label: its `measure` by evaluation length, mean and range over seeds."""
    found = {
        config.label + past_bound(config, measure): band(
            [by_length(run, measure) for run in config.runs]
        )
        for config in configs
    }
    return {label: values for label, values in found.items() if values}


def plot_ppl_by_length(configs: list[Configuration], path: Path) -> list[Path]:
    """Perplexity by evaluation length, non-overlapping and sliding windows side by side: one
    line per configuration, the mean over its seeds, the range shaded."""
    panels = {
        f"{windows.name} windows": ppl_bands(configs, f"{STAGE}/{windows.perplexity}")
        for windows in WINDOWS
    }
    panels = {title: bands for title, bands in panels.items() if bands}
    if not panels:
        return []
    figure = bands_figure(
        panels, "evaluation length (tokens)", f"{STAGE} perplexity", training_length(configs)
    )
    return [save(figure, path)]


def position_bands(configs: list[Configuration]) -> dict[str, Band]:
    """Per configuration: its loss by position in the windows of the longest length every
    seed's model could take, mean and range over the seeds; labelled with that length."""
    bands: dict[str, Band] = {}
    for config in configs:
        curves = [loss_by_position(run) for run in config.runs]
        common = set.intersection(*(set(curve) for curve in curves))
        found = band([curve[max(common)] for curve in curves]) if common else None
        if found:
            bands[f"{config.label} (L = {max(common)})"] = found
    return bands


def plot_loss_by_position(configs: list[Configuration], path: Path) -> list[Path]:
    """Each configuration's test loss at each position of its longest windows
    (`position_bands`): the mean over its seeds, the range shaded."""
    bands = position_bands(configs)
    if not bands:
        return []
    panels = {"loss at each position of the non-overlapping windows": bands}
    figure = bands_figure(
        panels, "position in the window", f"{STAGE} loss (nats per token)",
        training_length(configs), log_y=False,
    )  # fmt: skip
    return [save(figure, path)]


def lengths_table(configs: list[Configuration], baseline: str | None = None) -> str:
    """Per configuration and kind of windows: the test perplexity at each evaluation length,
    the mean and the half-width of its 95% t interval over the seeds; n/a at a length the
    configuration's model cannot take. Then, from which length on it changes: each length's
    perplexity against the training length's (`length_differences`); with a `baseline` (a
    block's), each configuration against it at each length (`baseline_differences`)."""
    runs = [run for config in configs for run in config.runs]
    rows = []
    for config in configs:
        for windows in WINDOWS:
            measure = f"{STAGE}/{windows.perplexity}"
            cells: Row = {**config.setting, "seeds": len(config.runs), "windows": windows.name}
            for length in lengths(runs, measure):
                metric = f"{measure}@{length}"
                cells[f"L={length}"] = seeds_summary(config, metric)
            rows.append(cells)
    legend = (
        "Test perplexity at each evaluation length L: the mean ± the half-width of its 95% t "
        "interval over the seeds; n/a: longer than the model's positions."
    )
    text = f"{legend}\n\n{markdown_table(rows)}" + length_differences(configs)
    return text + (baseline_differences(configs, baseline) if baseline is not None else "")


def trained_on(config: Configuration) -> int | None:
    """The length every run of the configuration trained on (`task.data.block_size`), where
    they agree."""
    found = {run.setting("task.data.block_size") for run in config.runs}
    length = found.pop() if len(found) == 1 else None
    return int(length) if length is not None and length.isdigit() else None


Cells = dict[str, Difference | str]  # column -> a difference, or text (n/a)


def corrected_rows(
    found: list[tuple[Row, Cells]], words: tuple[str, str, str] = AHEAD
) -> tuple[list[Row], list[Difference]]:
    """The rows of a table of perplexity differences (lower is better), Holm over all their
    differences, and that family."""
    family = corrected([d for _, cells in found for d in cells.values() if not isinstance(d, str)])
    tested = iter(family)
    rows = [
        {**row, **{k: d if isinstance(d, str) else formatted(next(tested), "min", words)
                   for k, d in cells.items()}}
        for row, cells in found
    ]  # fmt: skip
    return rows, family


def length_differences(configs: list[Configuration]) -> str:
    """Per configuration and kind of windows, at each evaluation length past the training
    length: the perplexity there minus at the training length, and their ratio, paired by
    seed (`attnlab.compare.differences`), Holm over the table; "" where no configuration
    was evaluated at its training length and beyond."""
    runs = [run for config in configs for run in config.runs]
    found: list[tuple[Row, Cells]] = []
    for config in configs:
        trained = trained_on(config)
        for windows in WINDOWS:
            measure = f"{STAGE}/{windows.perplexity}"
            measured = lengths(config.runs, measure)
            if trained is None or trained not in measured:
                continue
            base = by_seed(config, f"{measure}@{trained}")
            cells: Cells = {}
            for length in (n for n in lengths(runs, measure) if n > trained):
                metric = f"{measure}@{length}"
                if not any(applicable(run, metric) for run in config.runs):
                    cells[f"L={length}"] = NOT_APPLICABLE
                else:
                    cells[f"L={length}"] = difference(by_seed(config, metric), base, ratio=True)
            if cells:
                row: Row = {**config.setting, "windows": windows.name, "trained on": trained}
                found.append((row, cells))
    rows, family = corrected_rows(found, LENGTH_WORDS)
    if not rows:
        return ""
    legend = (
        "From which length on: each configuration's test perplexity at L minus at the length it "
        "trained on, and × their ratio (on logs), paired by seed (n seeds); improves or worsens "
        "where Holm's adjusted p < 0.05 (lower is better), else tie. " + family_legend(family)
    )
    return f"\n\n{legend}\n\n{markdown_table(rows)}"


def baseline_differences(configs: list[Configuration], baseline: str) -> str:
    """Per configuration but the `baseline` (a label) and kind of windows, at each evaluation
    length: its test perplexity minus the baseline's, and their ratio, paired by seed
    (`attnlab.compare.differences`), Holm over the table."""
    base_label = baseline_of([config.label for config in configs], baseline, "the baseline")
    base = next(config for config in configs if config.label == base_label)
    runs = [run for config in configs for run in config.runs]
    found: list[tuple[Row, Cells]] = []
    for config in (config for config in configs if config is not base):
        for windows in WINDOWS:
            measure = f"{STAGE}/{windows.perplexity}"
            cells: Cells = {}
            for length in lengths(runs, measure):
                metric = f"{measure}@{length}"
                both = (config, base)
                if not all(any(applicable(run, metric) for run in c.runs) for c in both):
                    cells[f"L={length}"] = NOT_APPLICABLE
                else:
                    gap = difference(by_seed(config, metric), by_seed(base, metric), ratio=True)
                    cells[f"L={length}"] = gap
            found.append(({**config.setting, "windows": windows.name}, cells))
    rows, family = corrected_rows(found)
    legend = (
        f"Against {base_label} (named by the block): each configuration's test perplexity at L "
        "minus the baseline's, and × their ratio (on logs), paired by seed (n seeds), else "
        "Welch's t; ahead or behind where Holm's adjusted p < 0.05 (lower is better), else "
        "tie. " + family_legend(family)
    )
    return f"\n\n{legend}\n\n{markdown_table(rows)}"


def lm_length_figures(
    curves: Mapping[int, Sequence[float]],
    ppl: Mapping[str, Mapping[int, float]],
    bound: int | None,
) -> tuple[Figure, Figure]:
    """A language model's loss by position in windows of each evaluation length, and its
    perplexity by evaluation length (non-overlapping and sliding windows); lengths past the
    model's positions (`bound`) are marked not applicable."""
    by_position = new_figure(7.5, 4.6)
    ax = by_position.subplots()
    for index, (length, loss) in enumerate(sorted(curves.items())):
        style = curve_style(index, len(loss))
        ax.plot(range(1, len(loss) + 1), loss, label=f"L = {length}", **style)
    ax.set_xscale("log")
    ax.set_xlabel("position in the window")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    fitted_legend(ax, *ax.get_legend_handles_labels())
    marks = {} if bound is None else {bound: f"positions end ({bound}): n/a past it"}
    bands = {}
    for mode, values in ppl.items():
        lengths = sorted(values)
        line = [values[n] for n in lengths]
        bands[mode] = (lengths, line, line, line)  # one run: no range to shade
    title = "perplexity by evaluation length"
    by_length = bands_figure({title: bands}, "evaluation length (tokens)", "perplexity", marks)
    return by_position, by_length


KINDS = {
    "lengths": Kind(
        lengths_table, plot_ppl_by_length, "perplexity by evaluation length", "lm", baseline=True
    ),
    "sinks": Kind(
        sinks_table, plot_sinks, "attention sink by evaluation length", "lm", figure="_sinks"
    ),
}
FIGURES = (
    ComparisonPlot("ppl_by_length.png", plot_ppl_by_length),
    ComparisonPlot("loss_by_position.png", plot_loss_by_position),
)
