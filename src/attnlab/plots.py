"""Figures for runs and comparisons (matplotlib's object API: no pyplot, no display needed).

A figure is meant for a paper: at most 8 curves to a panel (`attnlab.plot_labels`), each in a
colour of Okabe and Ito's palette, safe for colour-blind readers (Okabe & Ito 2008, "Color
Universal Design"), with a line style and marker of its own so that it reads in grey print,
and later curves thinner on top so that coinciding curves all show; heat maps in viridis, a
perceptually uniform map (van der Walt & Smith 2015); an axis of an accuracy or exact match
(its name says "acc" or "exact match") spans [0, 1]; legends sit below their panels, in as
many columns as fit their width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure
from matplotlib.legend import Legend
from matplotlib.ticker import FuncFormatter, LogFormatter
from PIL import Image, PngImagePlugin

from attnlab.files import written
from attnlab.plot_labels import families, layer_name, short_labels

LABELLED = 16  # an example this long or shorter gets its positions on the axes
CELL = 1.7  # inches per heat-map panel
PANELS_PER_ROW = 4  # of a figure of bands: seven tasks side by side were too wide to read
CROWDED = 6  # more curves than this to a figure of bands: their shaded ranges are fainter
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MARKED = 12  # markers on a curve of more points than this: about this many, evenly spaced
HEAT = "viridis"
REFERENCE = "0.45"  # the grey of a reference curve and of marks
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
        row[0].set_ylabel(f"{layer_name(name)}\nquery position", fontsize=7)
        figure.colorbar(image, ax=list(row), fraction=0.02, pad=0.01).ax.tick_params(labelsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("key position", fontsize=7)
    for head, ax in enumerate(axes[0]):
        ax.set_title(f"head {head}", fontsize=8)
    figure.suptitle(title, fontsize=9)
    return figure


def new_figure(width: float, height: float) -> Figure:
    """A figure of `width` x `height` inches, laid out so that titles and legends outside the
    panels keep their room, on a canvas that can measure its text (`fitted_legend`)."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def curve_style(index: int, points: int) -> dict:
    """How the index-th curve of a panel (of at most 8) of `points` points is drawn: its
    colour, line style and marker its own, each curve a little thinner and on top of those
    before it, so that one drawn over another leaves the other showing."""
    return {
        "color": PALETTE[index % len(PALETTE)],
        "linestyle": LINE_STYLES[index % len(LINE_STYLES)],
        "marker": MARKERS[index % len(MARKERS)],
        "markevery": max(1, points // MARKED),
        "linewidth": 2.4 - 0.15 * (index % len(PALETTE)),
        "markersize": 7.0 - 0.4 * (index % len(PALETTE)),
        "markeredgecolor": "black",
        "markeredgewidth": 0.4,
        "alpha": 0.9,
        "zorder": 3 + index,
    }


def is_accuracy(name: str) -> bool:
    """Whether an axis named `name` measures an accuracy or exact match, a share in [0, 1]."""
    return "acc" in name.lower() or "exact match" in name.lower()


def share_axis(ax: Axes) -> None:
    """A y axis on [0, 1] with a small margin, that the curves at 0 and 1 show."""
    ax.set_ylim(-0.03, 1.03)


def fitted_legend(owner: Figure | SubFigure | Axes, handles: list, labels: list[str],
                  title: str = "") -> Legend:  # fmt: skip
    """A legend below `owner`'s panels, in as many columns as its width takes (one at least,
    then a smaller font)."""
    width = owner.bbox.width
    renderer = owner.get_figure(root=True).canvas.get_renderer()
    for size, columns in [(8, n) for n in range(min(len(labels), 4), 0, -1)] + [(5, 1)]:
        if isinstance(owner, Axes):
            legend = owner.legend(handles, labels, loc="upper center", ncols=columns,
                                  bbox_to_anchor=(0.5, -0.14), fontsize=size, frameon=False,
                                  title=title or None, title_fontsize=size)  # fmt: skip
        else:
            legend = owner.legend(handles, labels, loc="outside lower center", ncols=columns,
                                  fontsize=size, frameon=False, title=title or None,
                                  title_fontsize=size)  # fmt: skip
        if legend.get_window_extent(renderer).width <= width:
            break
        legend.remove()
    return legend


SPLITS = {"val": "validation", "test": "test", "train": "training"}


def curves_figure(curves: Mapping[str, Sequence[Sequence[float]]], metric: str) -> Figure:
    """Each curve's (steps, values), or (steps, mean, smallest, largest) with the range
    shaded, of one metric, titled with its split: a panel per family of at most 8 curves
    (`attnlab.plot_labels.families`), two to a row, each with its legend below it."""
    panels = families(list(curves))
    columns = min(len(panels), 2)
    rows = math.ceil(len(panels) / columns)
    figure = new_figure(6.0 * columns, 4.6 * rows)
    grid = figure.subplots(rows, columns, squeeze=False, sharey=True)
    for ax in grid.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (family, labels) in zip(grid.flat, panels, strict=False):
        key, notes, named = short_labels(labels)
        for index, label in enumerate(labels):
            steps, values, *spread = curves[label]
            style = curve_style(index, len(steps))
            ax.plot(steps, values, label=named[label], **style)
            if spread:
                ax.fill_between(steps, *spread, color=style["color"], alpha=0.15, linewidth=0)
        ax.set_title(" ".join(text for text in (family, notes) if text), fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        if is_accuracy(metric):
            share_axis(ax)
        ax.grid(alpha=0.3)
        fitted_legend(ax, *ax.get_legend_handles_labels(), title=key)
    split = SPLITS.get(metric.split("/")[0], metric.split("/")[0])
    figure.suptitle(f"{metric.split('/', 1)[-1]} on the {split} split", fontsize=10)
    return figure


def heatmap_figure(
    matrix: np.ndarray,
    rows: Sequence[str],
    columns: Sequence[str],
    title: str,
    axes: tuple[str, str] = ("", ""),
    measure: str = "",
) -> Figure:
    """A [rows, columns] matrix of values in [0, 1], `measure` (an accuracy), on a colour bar
    from 0 to 1; NaN (not measured) stays blank. Wide matrices get narrower columns and a
    label on every few of them; `axes` labels the columns' axis and the rows'. Labels of
    configurations keep the keys that vary among them."""
    row_key, _, row_names = short_labels(rows)
    column_key, _, column_names = short_labels(columns)
    width = min(0.42, 14.0 / len(columns))
    turned = max(map(len, column_names.values())) > 3
    figure = new_figure(
        2.5 + width * len(columns) + 0.08 * max(map(len, row_names.values())),
        1.2 + 0.3 * len(rows) + (0.07 * max(map(len, column_names.values())) if turned else 0),
    )
    ax = figure.subplots()
    image = ax.imshow(matrix, cmap=HEAT, vmin=0.0, vmax=1.0, aspect="auto")
    every = max(1, round(0.3 / width))
    ticks = range(0, len(columns), every)
    ax.set_xticks(ticks, [column_names[columns[i]] for i in ticks], fontsize=7,
                  rotation=45 if turned else 0, ha="right" if turned else "center")  # fmt: skip
    ax.set_yticks(range(len(rows)), [row_names[row] for row in rows], fontsize=7)
    ax.set_xlabel(f"{axes[0]} ({column_key})" if column_key else axes[0], fontsize=8)
    ax.set_ylabel(f"{axes[1]} ({row_key})" if row_key else axes[1], fontsize=8)
    ax.set_title(title, fontsize=9)
    figure.colorbar(image, ax=ax, fraction=0.03).set_label(measure, fontsize=8)
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
    dotted vertical line at each x, `references` a dashed grey curve (xs, ys) in every
    panel, each labelled in the legend. Past 8 labels, the labels are split into families
    (`attnlab.plot_labels.families`), a row of panels each; a label keeps its style in every
    panel of its family, whose legend is below its panels."""
    groups = families(list(dict.fromkeys(label for bands in panels.values() for label in bands)))
    columns = min(len(panels), PANELS_PER_ROW)
    rows = math.ceil(len(panels) / columns)
    figure = new_figure(1.5 + 4.5 * columns, (4.0 * rows + 1.2) * len(groups))
    parts = figure.subfigures(len(groups), 1, squeeze=False).flat
    for part, (family, labels) in zip(parts, groups, strict=True):
        kept = {title: {k: v for k, v in bands.items() if k in labels}
                for title, bands in panels.items()}  # fmt: skip
        family_panels(part, kept, labels, xlabel, ylabel, marks, log_y, references or {})
        if family:
            part.suptitle(family, fontsize=10)
    return figure


def family_panels(
    part: SubFigure,
    panels: Mapping[str, Mapping[str, Band]],
    labels: list[str],
    xlabel: str,
    ylabel: str,
    marks: Mapping[float, str],
    log_y: bool,
    references: Mapping[str, tuple[Sequence[float], Sequence[float]]],
) -> None:
    """`bands_figure`'s panels of one family of `labels`, and their legend below them."""
    columns = min(len(panels), PANELS_PER_ROW)
    grid = part.subplots(math.ceil(len(panels) / columns), columns, squeeze=False, sharey=True)
    for ax in grid.flat[len(panels) :]:
        ax.set_visible(False)
    key, notes, named = short_labels(labels)
    shade = 0.2 if len(labels) <= CROWDED else 0.1
    for ax, (panel, bands) in zip(grid.flat, panels.items(), strict=False):
        for label, (xs, mean, low, high) in bands.items():
            style = curve_style(labels.index(label), len(xs))
            ax.plot(xs, mean, label=named[label], **style)
            ax.fill_between(xs, low, high, color=style["color"], alpha=shade, linewidth=0)
        for x, text in marks.items():
            ax.axvline(x, color=REFERENCE, linestyle=":", label=text)
        for text, (xs, ys) in references.items():
            ax.plot(xs, ys, color=REFERENCE, linestyle=(0, (6, 2)), linewidth=1.5, label=text)
        log2_axis(ax, xlabel)
        if log_y:
            log10_y_axis(ax)
        elif is_accuracy(ylabel):
            share_axis(ax)
        ax.set_title(" ".join(text for text in (panel, notes) if text), fontsize=9)
        ax.grid(alpha=0.3, which="both")
    for row in grid:
        row[0].set_ylabel(ylabel)
    legend: dict[str, object] = {}
    for ax in grid.flat:
        for line, text in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(text, line)
    order = [named[label] for label in labels if named[label] in legend]
    order += [text for text in legend if text not in order]
    fitted_legend(part, [legend[text] for text in order], order, title=key)
