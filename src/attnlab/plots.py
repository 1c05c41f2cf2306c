"""Figures for runs and comparisons (matplotlib's object API: no pyplot, no display needed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter
from PIL import Image, PngImagePlugin

from attnlab.files import written

LABELLED = 16  # an example this long or shorter gets its positions on the axes
CELL = 1.7  # inches per heat-map panel
PANELS_PER_ROW = 4  # of a figure of bands: seven tasks side by side were too wide to read
CROWDED = 6  # more curves than this to a figure of bands: their shaded ranges are fainter
SOURCE = "attnlab-source"  # a PNG text field: what the figure was drawn from
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")
# x, and the mean, smallest and largest value (over seeds) at each x
Band = tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]]


def save(figure: Figure, path: Path) -> Path:
    """`figure` as the PNG `path`, whole or not at all (attnlab.files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with written(path) as partial:
        figure.savefig(partial, dpi=90, bbox_inches="tight", format="png")
    return path


def stamp(path: Path, source: str) -> None:
    """Write `source` (what `path` was drawn from) into the PNG's text fields."""
    with Image.open(path) as image:
        image.load()
    info = PngImagePlugin.PngInfo()
    info.add_text(SOURCE, source)
    with written(path) as partial:
        image.save(partial, format="png", pnginfo=info)


def stamped(path: Path) -> str | None:
    """What the PNG at `path` says it was drawn from (None: it does not say)."""
    try:
        with Image.open(path) as image:
            is_png = isinstance(image, PngImagePlugin.PngImageFile)
            return image.text.get(SOURCE) if is_png else None
    except OSError:  # not an image at all
        return None


def attention_figure(maps: Mapping[str, np.ndarray], title: str) -> Figure:
    """One panel per layer (rows) and head (columns) of weights [H, Lq, Lk], one colour scale
    per layer (0 to its largest weight) with its colour bar; positions on the axes of an
    example of at most LABELLED positions."""
    heads = max(weights.shape[0] for weights in maps.values())
    figure = Figure(figsize=(CELL * heads + 2.2, CELL * len(maps) + 0.8))
    axes = figure.subplots(len(maps), heads, squeeze=False)
    for row, (name, weights) in zip(axes, maps.items(), strict=True):
        largest = float(weights.max()) or 1.0
        image = None
        for head, ax in enumerate(row):
            if head >= weights.shape[0]:
                ax.set_axis_off()
                continue
            image = ax.imshow(
                weights[head], cmap="viridis", interpolation="nearest", vmin=0.0, vmax=largest
            )
            queries, keys = weights[head].shape
            labelled = max(queries, keys) <= LABELLED
            ax.set_xticks(range(keys) if labelled else [])
            ax.set_yticks(range(queries) if labelled else [])
            ax.tick_params(labelsize=5, length=0)
        row[0].set_ylabel(f"{name}\nquery position", fontsize=7)
        figure.colorbar(image, ax=list(row), fraction=0.02, pad=0.01).ax.tick_params(labelsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("key position", fontsize=7)
    for head, ax in enumerate(axes[0]):
        ax.set_title(f"head {head}", fontsize=8)
    figure.suptitle(title, fontsize=9)
    return figure


def line_style(index: int) -> str:
    """The line style of the index-th curve: past the 10 colours of the cycle, curves are
    told apart by their line style."""
    return ("-", "--", ":", "-.")[index // 10 % 4]


def marker_of(index: int) -> str:
    """The marker of the index-th curve of few points: past the 10 colours of the cycle, a
    second shape beside the second line style (a dash is hard to see on a short segment)."""
    return ("o", "s", "^", "D")[index // 10 % 4]


SPLITS = {"val": "validation", "test": "test", "train": "training"}


def curves_figure(curves: Mapping[str, Sequence[Sequence[float]]], metric: str) -> Figure:
    """Each curve's (steps, values), or (steps, mean, smallest, largest) with the range
    shaded, of one metric on one axis, titled with its split; past the 10 colours of the
    cycle, curves are told apart by their line style."""
    figure = Figure(figsize=(7.5, 4.0))
    ax = figure.subplots()
    for index, (label, (steps, values, *spread)) in enumerate(curves.items()):
        marker = "." if len(steps) < 30 else None
        line = ax.plot(steps, values, linestyle=line_style(index), marker=marker, label=label)
        if spread:
            ax.fill_between(steps, *spread, color=line[0].get_color(), alpha=0.2, linewidth=0)
    split = SPLITS.get(metric.split("/")[0], metric.split("/")[0])
    ax.set_title(f"{metric.split('/', 1)[-1]} on the {split} split", fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return figure


def heatmap_figure(
    matrix: np.ndarray,
    rows: Sequence[str],
    columns: Sequence[str],
    title: str,
    axes: tuple[str, str] = ("", ""),
) -> Figure:
    """A [rows, columns] matrix of values in [0, 1]; NaN (not measured) stays blank. Wide
    matrices get narrower columns and a label on every few of them; `axes` labels the
    columns' axis and the rows'."""
    width = min(0.42, 14.0 / len(columns))
    figure = Figure(figsize=(1.0 + width * len(columns) + 2.0, 0.8 + 0.3 * len(rows)))
    ax = figure.subplots()
    image = ax.imshow(matrix, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    every = max(1, round(0.3 / width))
    ticks = range(0, len(columns), every)
    ax.set_xticks(ticks, [columns[i] for i in ticks], fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel(axes[0], fontsize=8)
    ax.set_ylabel(axes[1], fontsize=8)
    ax.set_title(title, fontsize=9)
    figure.colorbar(image, ax=ax, fraction=0.03)
    return figure


def log2_axis(ax: Axes, label: str) -> None:
    """A log-2 x axis labelled in plain numbers (64, not 2^6)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.set_xlabel(label)


def log10_y_axis(ax: Axes) -> None:
    """A log-10 y axis labelled in plain numbers (300, not 3 × 10^2), its minor ticks too
    where it spans less than a few decades."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def bands_figure(
    panels: Mapping[str, Mapping[str, Band]],
    xlabel: str,
    ylabel: str,
    marks: Mapping[float, str],
    log_y: bool = True,
    references: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> Figure:
    """One panel per title of `panels`, PANELS_PER_ROW to a row on a shared y axis; in each,
    one line per label: the mean, the range from smallest to largest shaded (or whatever
    interval the band gives). x is on a log-2 scale (y too with `log_y`); `marks` draws a
    dotted vertical line at each x, `references` a dashed black curve (xs, ys) in every
    panel, each labelled in the legend. A label keeps its colour in every panel."""
    columns = min(len(panels), PANELS_PER_ROW)
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(1.5 + 4.5 * columns, 4.0 * rows))
    grid = figure.subplots(rows, columns, squeeze=False, sharey=True, gridspec_kw={"hspace": 0.4})
    for ax in grid.flat[len(panels) :]:
        ax.set_visible(False)
    axes = list(grid.flat[: len(panels)])
    labels = list(dict.fromkeys(label for bands in panels.values() for label in bands))
    shade = 0.2 if len(labels) <= CROWDED else 0.08
    for ax, (title, bands) in zip(axes, panels.items(), strict=True):
        for label, (xs, mean, low, high) in bands.items():
            index = labels.index(label)
            colour, style = f"C{index % 10}", line_style(index)
            marker = marker_of(index) if len(xs) < 30 else None
            ax.plot(xs, mean, color=colour, linestyle=style, marker=marker, label=label)
            ax.fill_between(xs, low, high, color=colour, alpha=shade, linewidth=0)
        for x, text in marks.items():
            ax.axvline(x, color="grey", linestyle=":", label=text)
        for text, (xs, ys) in (references or {}).items():
            ax.plot(xs, ys, color="black", linestyle="--", linewidth=1, label=text)
        log2_axis(ax, xlabel)
        if log_y:
            log10_y_axis(ax)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, which="both")
    for row in grid:
        row[0].set_ylabel(ylabel)
    handles = [ax.get_legend_handles_labels() for ax in axes]
    legend = {
        text: line for lines, texts in handles for line, text in zip(lines, texts, strict=True)
    }
    grid[0][-1].legend(
        legend.values(), legend.keys(), fontsize=7, loc="center left",
        bbox_to_anchor=(1.01, 0.5), frameon=False,
    )  # fmt: skip
    return figure
