"""Figures for runs and comparisons (matplotlib's object API: no pyplot, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

CELL = 1.7  # inches per heat-map panel


def save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90, bbox_inches="tight")
    return path


def attention_figure(maps: Mapping[str, np.ndarray], title: str) -> Figure:
    """One panel per layer (rows) and head (columns) of weights [H, Lq, Lk]."""
    heads = max(weights.shape[0] for weights in maps.values())
    figure = Figure(figsize=(CELL * heads + 1.5, CELL * len(maps) + 0.6))
    axes = figure.subplots(len(maps), heads, squeeze=False)
    for row, (name, weights) in zip(axes, maps.items(), strict=True):
        for head, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            if head < weights.shape[0]:
                ax.imshow(weights[head], cmap="viridis", interpolation="nearest")
            else:
                ax.set_axis_off()
        row[0].set_ylabel(name, fontsize=7)
    for head, ax in enumerate(axes[0]):
        ax.set_title(f"head {head}", fontsize=8)
    figure.suptitle(title, fontsize=9)
    return figure


def curves_figure(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], metric: str
) -> Figure:
    """Every run's (steps, values) of one metric on one axis; past the 10 colours of the
    cycle, curves are told apart by their line style."""
    figure = Figure(figsize=(7.5, 4.0))
    ax = figure.subplots()
    for index, (label, (steps, values)) in enumerate(curves.items()):
        style = ("-", "--", ":", "-.")[index // 10 % 4]
        marker = "." if len(steps) < 30 else None
        ax.plot(steps, values, linestyle=style, marker=marker, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return figure


def heatmap_figure(
    matrix: np.ndarray, rows: Sequence[str], columns: Sequence[str], title: str
) -> Figure:
    """A [rows, columns] matrix of values in [0, 1]; NaN (not measured) stays blank. Wide
    matrices get narrower columns and a label on every few of them."""
    width = min(0.42, 14.0 / len(columns))
    figure = Figure(figsize=(1.0 + width * len(columns) + 2.0, 0.8 + 0.3 * len(rows)))
    ax = figure.subplots()
    image = ax.imshow(matrix, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    every = max(1, round(0.3 / width))
    ticks = range(0, len(columns), every)
    ax.set_xticks(ticks, [columns[i] for i in ticks], fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_title(title, fontsize=9)
    figure.colorbar(image, ax=ax, fraction=0.03)
    return figure
