"""The task families' declarations for their reports, merged: RESULTS.md's kinds of block
(`KINDS`, read by `attnlab.reports.results`) and the figures `attnlab compare` draws of their
runs (`FIGURES`). Each family's `tasks/<family>/report.py` declares its own (the contract:
`attnlab.compare.kinds`); a new family adds its line to each of the two below.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.compare import report
from attnlab.compare.kinds import ComparisonPlot, Kind
from attnlab.tasks.lm import report as lm
from attnlab.tasks.probe import report as probe
from attnlab.tasks.synthetic import report as synthetic

KINDS: dict[str, Kind] = {
    **probe.KINDS,
    **report.KINDS,  # any task's runs
    **lm.KINDS,
    **synthetic.KINDS,
}
FIGURES: tuple[ComparisonPlot, ...] = (
    *lm.FIGURES,
    *synthetic.FIGURES,
)


def compare(
    directory: Path, out: Path | None = None, baseline: str | None = None
) -> report.Comparison:
    """`attnlab compare DIR [--out OUT] [--baseline LABEL]`: `attnlab.compare.report.compare`
    with every family's figures."""
    return report.compare(directory, out, FIGURES, baseline)
