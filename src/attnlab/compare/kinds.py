"""What a task family declares for its reports (`attnlab.reports.families` merges them):

    Kind            a kind of RESULTS.md block (`<!-- results:<study> <kind> -->`): its
                    table of the study's configurations, its figure and that figure's caption
    ComparisonPlot  a figure `attnlab compare` draws into its output directory, by file name

Both read configurations (`attnlab.compare.seeds.Configuration`: a configuration's runs over
seeds) and nothing of a task's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnlab.compare.seeds import Configuration

Table = Callable[..., str]  # configurations (and, where `baseline`, the block's) -> text
Plot = Callable[[list[Configuration], Path], list[Path]]  # the paths it drew ([]: none)


@dataclass(frozen=True)
class Kind:
    table: Table
    plot: Plot
    caption: str
    task: str | None = None  # the task whose runs it reads; None: any
    contrasts: Table | None = None  # an `among=` block's table
    figure: str = ""  # added to the study's name to name its figure
    baseline: bool = False  # its tables take the block's `baseline=` (a label, or None)


@dataclass(frozen=True)
class ComparisonPlot:
    name: str  # its file in the comparison's directory, e.g. "ppl_by_length.png"
    plot: Plot
