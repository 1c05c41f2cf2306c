"""The budget line that opens each RESULTS.md block: what the runs' records say they were
given (steps or epochs, learning rate, schedule, precision, checkpoint, early stopping) and
did (steps run, validations made, and how each run stopped), so that the text cannot drift
from what ran and a reader sees when configurations trained for different lengths."""

from __future__ import annotations

from collections import Counter

from attnlab.compare.runs import Run, is_number_text

BUDGET = {  # what a block's budget line names, and the config key each run holds it at
    "lr": "task.optim.lr",
    "warm-up steps": "task.optim.warmup_steps",
    "schedule": "task.optim.schedule",
    "precision": "trainer.precision",
}


def values(runs: list[Run], key: str) -> str:
    """The runs' values of a config key, each once, in order ("inverse_sqrt"; "500 / 1000")."""
    found = {value for run in runs if (value := run.setting(key)) is not None}
    return " / ".join(sorted(found, key=lambda value: (not is_number_text(value), value.zfill(20))))


def budget(runs: list[Run]) -> str:
    """One line: what the runs' records say they were given and did."""
    limit = values(runs, "trainer.max_steps")
    parts = [f"at most {limit} steps" if limit != "-1" else
             f"at most {values(runs, 'trainer.max_epochs')} epochs"]  # fmt: skip
    steps = sorted(step for run in runs if (step := run.steps()) is not None)
    if steps:
        parts.append(f"ran {spread(steps)} steps")
    parts += [f"{label} {found}" for label, key in BUDGET.items() if (found := values(runs, key))]
    if devices := sorted({run.status.device for run in runs if run.status and run.status.device}):
        unrecorded = sum(1 for run in runs if not (run.status and run.status.device))
        parts.append(f"on {' / '.join(devices)}" + (
            f" ({unrecorded} of {len(runs)} runs did not record theirs)" if unrecorded else ""))  # fmt: skip
    generated = values(runs, "task.system.val_generate")
    if generated:
        parts.append(f"validation generates for the first {generated} examples only")
    metric, mode = values(runs, "optimized_metric"), values(runs, "task.metric_mode")
    parts.append(f"checkpoint tested: best {metric} ({mode}) on validation")
    parts.append(stopping(runs))
    return "Budget, from the runs' records: " + "; ".join(parts) + "."


def spread(counts: list[int]) -> str:
    """The smallest and largest of `counts` ("4,655" or "4,655–5,880")."""
    low, high = min(counts), max(counts)
    return f"{low:,}" + (f"–{high:,}" if high != low else "")


def stopping(runs: list[Run]) -> str:
    """The early-stopping rule the runs' records hold ("no early stopping" where none does;
    how many runs ran without it where only some do), and how each run stopped."""
    monitor = values(runs, "callbacks.early_stopping.monitor")
    ruled = [run for run in runs if run.setting("callbacks.early_stopping.monitor")]
    rule = early_stopping(ruled, monitor) if ruled else "no early stopping"
    if ruled and len(ruled) < len(runs):
        rule += f"; {len(runs) - len(ruled)} of {len(runs)} runs without early stopping"
    ends = Counter(stopped_by(run, monitor) for run in runs)
    order = ("at the threshold", "by patience", "at the step cap", "at the epoch cap", "otherwise")
    return rule + "; runs stopped: " + ", ".join(f"{ends[e]} {e}" for e in order if ends[e])


def early_stopping(runs: list[Run], monitor: str) -> str:
    """The stopping rule the runs' records hold, in Lightning's EarlyStopping's terms (it stops
    once the monitor passes stopping_threshold, or after `patience` validations in a row none
    of which beat the best by more than min_delta), and how many validations each run made."""
    threshold = values(runs, "callbacks.early_stopping.stopping_threshold")
    delta = values(runs, "callbacks.early_stopping.min_delta")
    patience = values(runs, "callbacks.early_stopping.patience")
    mode = values(runs, "callbacks.early_stopping.mode") or "min"  # Lightning's default
    rules = [f"once {monitor} {'rose above' if mode == 'max' else 'fell below'} {threshold}"]
    rules = rules if threshold else []
    if patience:
        gain = f"beating the best by more than {delta}" if delta and float(delta) else "a new best"
        rules.append(f"after {patience} validations in a row without {gain}")
    rule = "stopped " + ", or ".join(rules) if rules else f"stopped early on {monitor}"
    made = [len(series) for run in runs if (series := run.metrics.get(monitor))]
    if made:
        rule += f" (runs made {spread(made)} validation{'s' if max(made) > 1 else ''})"
    return rule


def setting_number(run: Run, key: str) -> float | None:
    value = run.setting(key)
    return float(value) if value is not None and is_number_text(value) else None


def stopped_by(run: Run, monitor: str) -> str:
    """How a run's training ended, from its config and its monitor's series: "at the
    threshold" (its last validation passed early stopping's threshold, strictly, as
    Lightning's EarlyStopping compares), "at the step cap"
    (it ran trainer.max_steps), "by patience" (none of its last `patience` validations
    improved on the best before them by more than min_delta, as Lightning's EarlyStopping
    counts), "at the epoch cap" (none of these, with no step cap: it ran trainer.max_epochs),
    else "otherwise" (before its step cap, by no rule its records show)."""
    series = [value for _, value in run.metrics.get(monitor, [])]
    sign = 1.0 if run.setting("callbacks.early_stopping.mode") == "max" else -1.0
    threshold = setting_number(run, "callbacks.early_stopping.stopping_threshold")
    if series and threshold is not None and sign * series[-1] > sign * threshold:
        return "at the threshold"
    max_steps = setting_number(run, "trainer.max_steps")
    if max_steps is not None and max_steps > 0 and (run.steps() or 0) >= max_steps:
        return "at the step cap"
    patience = int(setting_number(run, "callbacks.early_stopping.patience") or 0)
    delta = setting_number(run, "callbacks.early_stopping.min_delta") or 0.0
    if patience and len(series) > patience:
        best = max(sign * value for value in series[:-patience])
        if all(sign * value <= best + delta for value in series[-patience:]):
            return "by patience"
    return "otherwise" if max_steps is not None and max_steps > 0 else "at the epoch cap"
