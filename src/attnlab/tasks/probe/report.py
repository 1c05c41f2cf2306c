"""The probe's tables in RESULTS.md: its accuracies beside what theory predicts (`probe`), and
accuracy at trained and untrained positions of longer sequences (`extrapolation`)."""

from __future__ import annotations

from typing import Any

from attnlab.compare.kinds import Kind
from attnlab.compare.report import plot_by_position
from attnlab.compare.runs import Run
from attnlab.compare.seeds import Configuration, number, summary
from attnlab.compare.table import Row, markdown_table
from attnlab.config.build import to_dict
from attnlab.config.groups import VARIANTS
from attnlab.config.options import options, variant
from attnlab.studies.probe import chance_bound, predict

SOLVED = 0.99  # token accuracy of every seed at or above this: the probe is solved


def eval_lengths(run: Run) -> range:
    data = run.config.task.data
    low = data.min_len if data.eval_min_len is None else data.eval_min_len
    high = data.max_len if data.eval_max_len is None else data.eval_max_len
    return range(low, high + 1)


def outcome(accuracy: list[float], bound: float) -> str:
    if min(accuracy) >= SOLVED:
        return "solves"
    if max(accuracy) <= bound + 1e-6:
        return f"≤ bound {bound:.3f}"
    return "partly"


def token_summary(accuracy: list[float], bound: float) -> str:
    """The seeds' token accuracy (`summary`); where every seed sits at the chance bound,
    "0.118 (all 3 seeds at the bound)": a spread of 0 there is no measurement's precision."""
    if len(accuracy) > 1 and all(abs(value - bound) <= 1e-6 for value in accuracy):
        return f"{number(bound)} (all {len(accuracy)} seeds at the bound)"
    return summary(accuracy)


def as_now(group: str, recorded: Any) -> dict[str, Any]:
    """A recorded config node of `group` with the options that its run predates (added to
    the option's YAML later, e.g. rope's scaling) at their YAML values."""
    node = to_dict(recorded)
    if node.get("name") not in options(group):
        return node
    return variant(group, node["name"]) | node


def probe_table(configs: list[Configuration]) -> str:
    """Each configuration's accuracies over its seeds, what they amount to (solves: every
    seed ≥ 0.99; ≤ bound: no better than equal outputs at every position), and the
    prediction; a row whose measurement disagrees with the prediction is bold."""
    rows = []
    for config in configs:
        run, accuracy = config.runs[0], config.values("test/acc")
        task = run.config.task
        parts = (as_now(group, run.config[group]) for group in VARIANTS)
        prediction = predict(*parts, task.markers, task.causal)
        bound = chance_bound(eval_lengths(run))
        measured = outcome(accuracy, bound) if accuracy else "no test"
        agrees = measured == "solves" if prediction.distinguishes else measured.startswith("≤")
        cells: Row = {**config.setting, "seeds": len(accuracy), "token acc": token_summary(accuracy, bound),
                      "sequence acc": summary(config.values("test/seq_acc")),
                      "measured": measured,
                      "predicted": "solves" if prediction.distinguishes else "cannot",
                      "why": prediction.why}  # fmt: skip
        if not agrees:
            cells = {key: f"**{value}**" for key, value in cells.items()}
        rows.append(cells)
    return markdown_table(rows)


def weighted_accuracy(run: Run, positions: range) -> float | None:
    """Token accuracy over `positions`, each weighted by the test tokens there."""
    accuracy, lengths = run.by_position(), eval_lengths(run)
    weights = {p: sum(1 for n in lengths if n >= p) for p in positions if p in accuracy}
    total = sum(weights.values())
    return sum(accuracy[p] * w for p, w in weights.items()) / total if total else None


def extrapolation_table(configs: list[Configuration]) -> str:
    """Per configuration: validation accuracy of the chosen checkpoint (the best), and the
    test's accuracy at trained positions of longer sequences and at untrained positions."""
    trained = configs[0].runs[0].config.task.data.max_len
    tested = eval_lengths(configs[0].runs[0])
    within = f"positions 1..{trained} of lengths {tested.start}..{tested.stop - 1}"
    beyond = f"positions {trained + 1}..{tested.stop - 1}"
    rows = []
    for config in configs:
        measured = {
            f"val acc (lengths 1..{trained})": [run.best("val/acc", "max") for run in config.runs],
            within: [weighted_accuracy(run, range(1, trained + 1)) for run in config.runs],
            beyond: [
                weighted_accuracy(run, range(trained + 1, tested.stop)) for run in config.runs
            ],
        }
        found = {name: [v for v in values if v is not None] for name, values in measured.items()}
        rows.append({**config.setting, "seeds": len(config.runs),
                     **{name: summary(values) for name, values in found.items()}})  # fmt: skip
    return markdown_table(rows)


KINDS = {
    "probe": Kind(probe_table, plot_by_position, "accuracy by position", "probe"),
    "extrapolation": Kind(extrapolation_table, plot_by_position, "accuracy by position", "probe"),
}
