"""The attention sink by layer and evaluation length, over seeds: RESULTS.md's `sinks` kind.

A language-model run tested with `task.system.sink_windows=N` records in lengths/test.json,
at each evaluation length L, `sink_by_layer`: per layer, the share of attention weight that
queries 1..L−1 give their window's first token, averaged over heads and queries, over the
first N whole test windows of length L (`attnlab.tasks.lm.system`). Uniform causal attention gives
the first token (H_L − 1)/(L − 1), H_L the L-th harmonic number: the share without a sink.
"""

from __future__ import annotations

import math
from pathlib import Path

from attnlab.compare.lengths import (
    NOT_APPLICABLE,
    STAGE,
    applicable,
    lengths,
    record,
    training_length,
)
from attnlab.compare.runs import Run
from attnlab.compare.seeds import Configuration, interval, number, summary
from attnlab.compare.table import Row, markdown_table
from attnlab.plots import Band, bands_figure, save

MEASURE = f"{STAGE}/sink"  # logged at each length L as test/sink@L (the mean over layers)
NOT_MEASURED = "not measured"
DIGITS = 4  # uniform attention gives 0.0128 at L = 512: three decimals would blur it
WIDEST = 6  # the most lengths the table shows; past it, the shortest and the longest
UNIFORM = "uniform attention (no sink)"
Sinks = dict[int, list[float]]  # one run's: length -> the sink of each layer there


def sinks_by_layer(run: Run, stage: str = STAGE) -> dict[int, list[float]]:
    """length -> the attention sink of each layer there (`sink_by_layer`), as the run's
    lengths/<stage>.json records it; {} where it measured none (no task.system.sink_windows)."""
    found = record(run, stage).get("lengths")
    entries = found.items() if isinstance(found, dict) else []
    return {
        int(length): [float(share) for share in entry["sink_by_layer"]]
        for length, entry in entries
        if isinstance(entry, dict) and isinstance(entry.get("sink_by_layer"), list)
    }


def uniform_share(length: int) -> float:
    """The first key's share under uniform causal attention over `length` keys, averaged over
    queries 1..L−1 (query i gives it 1/(i+1)): (H_L − 1)/(L − 1); NaN below 2 keys."""
    if length < 2:
        return math.nan
    return sum(1 / keys for keys in range(2, length + 1)) / (length - 1)


def sink_lengths(measured: list[Sinks]) -> list[int]:
    """The lengths at which some run measured the sink."""
    return sorted({length for sinks in measured for length in sinks})


def shown(measured: list[int]) -> list[int]:
    """The table's lengths: all, or the shortest and the longest where there are more than
    WIDEST."""
    return measured if len(measured) <= WIDEST else [measured[0], measured[-1]]


def layer_count(measured: list[Sinks]) -> int:
    """The most layers any of the runs measured a sink in."""
    return max((len(shares) for sinks in measured for shares in sinks.values()), default=0)


def sink_cell(config: Configuration, measured: list[Sinks], length: int, layer: int | None) -> str:
    """Layer `layer`'s (from 0) sink at `length` over the configuration's seeds (`measured`,
    one per run): the mean and its 95% t interval, and how many seeds did not measure it;
    "n/a" where no seed's model can take the length, "not measured" where no seed has it."""
    if not any(applicable(run, f"{MEASURE}@{length}") for run in config.runs):
        return NOT_APPLICABLE
    found = [sinks.get(length, []) for sinks in measured]
    values = [] if layer is None else [shares[layer] for shares in found if layer < len(shares)]
    if not values:
        return NOT_MEASURED
    missing = len(config.runs) - len(values)
    plural = "s" if missing > 1 else ""
    return summary(values, DIGITS) + (f"; {missing} seed{plural} {NOT_MEASURED}" if missing else "")


def configuration_rows(config: Configuration, shown_lengths: list[int]) -> list[Row]:
    """A row per layer its runs measured the sink in (one reading "not measured" where they
    measured none), a column per length."""
    measured = [sinks_by_layer(run) for run in config.runs]
    rows = []
    for layer in range(layer_count(measured)) or [None]:
        cells: Row = {**config.setting, "seeds": len(config.runs)}
        cells["layer"] = "" if layer is None else layer + 1
        for length in shown_lengths:
            cells[f"L={length}"] = sink_cell(config, measured, length, layer)
        rows.append(cells)
    return rows


def reference_row(keys: list[str], shown_lengths: list[int]) -> Row:
    """The table's first row: uniform causal attention's share of the first token."""
    cells: Row = {**dict.fromkeys(keys, ""), "seeds": "", "layer": UNIFORM}
    return cells | {f"L={n}": number(uniform_share(n), DIGITS) for n in shown_lengths}


def sinks_legend(runs: list[Run], measured: list[int], shown_lengths: list[int]) -> str:
    """What the table's numbers are, and which lengths it leaves out."""
    windows = {run.setting("task.system.sink_windows") for run in runs if sinks_by_layer(run)}
    count = " / ".join(sorted(str(n) for n in windows)) or "N"
    text = (
        "Attention sink at each evaluation length L, per layer: the share of attention weight "
        "that queries 1..L−1 give their window's first token, averaged over heads and queries "
        f"and over the first {count} whole test windows of length L "
        "(`task.system.sink_windows`); the mean ± the half-width of its 95% t interval over the "
        f"seeds. The first row, {UNIFORM}, is the share that uniform causal attention gives "
        "the first token, (H_L − 1)/(L − 1) with H_L the L-th harmonic number: a layer above "
        f'it gives the first token more than an even share. "{NOT_MEASURED}": runs without '
        "`task.system.sink_windows`; n/a: longer than the model's positions."
    )
    if shown_lengths != measured:
        listed = ", ".join(map(str, measured))
        text += f" The table shows the shortest and the longest of the lengths ({listed})."
    return text


def sinks_table(configs: list[Configuration]) -> str:
    """Per configuration and layer: the attention sink at each evaluation length (mean and 95%
    t interval over the seeds), under a first row of uniform attention's share."""
    runs = [run for config in configs for run in config.runs]
    measured = sink_lengths([sinks_by_layer(run) for run in runs])
    shown_lengths = shown(measured or lengths(runs, f"{STAGE}/ppl"))
    keys = list(dict.fromkeys(key for config in configs for key in config.setting))
    rows = [reference_row(keys, shown_lengths)]
    rows += [row for config in configs for row in configuration_rows(config, shown_lengths)]
    legend = sinks_legend(runs, measured, shown_lengths)
    return f"{legend}\n\n{markdown_table(rows)}"


def sink_band(measured: list[Sinks], layer: int) -> Band | None:
    """One configuration's sink in `layer` (from 0) at each length every seed measured it in:
    the mean over the seeds and its 95% t interval (none with one seed), clipped to [0, 1],
    a share's range; None where there is no such length."""
    at = [{n for n, shares in sinks.items() if layer < len(shares)} for sinks in measured]
    xs = sorted(set.intersection(*at)) if at else []
    if not xs:
        return None
    columns = [[sinks[n][layer] for sinks in measured] for n in xs]
    means = [sum(column) / len(column) for column in columns]
    halves = [interval(column) or 0.0 for column in columns]
    low = [max(0.0, mean - half) for mean, half in zip(means, halves, strict=True)]
    high = [min(1.0, mean + half) for mean, half in zip(means, halves, strict=True)]
    return xs, means, low, high


def plot_sinks(configs: list[Configuration], path: Path) -> list[Path]:
    """The attention sink by evaluation length, a panel per layer: one line per configuration,
    the mean over its seeds with its 95% t interval shaded, and uniform attention's share
    dashed."""
    measured = {config.label: [sinks_by_layer(run) for run in config.runs] for config in configs}
    panels = {
        f"layer {layer + 1}": {
            label: band for label, sinks in measured.items() if (band := sink_band(sinks, layer))
        }
        for layer in range(max(map(layer_count, measured.values()), default=0))
    }
    panels = {title: bands for title, bands in panels.items() if bands}
    if not panels:
        return []
    xs = sink_lengths([sinks for found in measured.values() for sinks in found])
    reference = {f"{UNIFORM}: (H_L − 1)/(L − 1)": (xs, [uniform_share(n) for n in xs])}
    figure = bands_figure(
        panels, "evaluation length (tokens)", "share of attention on the window's first token",
        training_length(configs), log_y=False, references=reference,
    )  # fmt: skip
    figure.suptitle("attention sink: mean over seeds, 95% t interval shaded", fontsize=9)
    return [save(figure, path)]
