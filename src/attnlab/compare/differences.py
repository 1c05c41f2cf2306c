"""One difference between two configurations (first − second) with its 95% interval and
p-value, Holm's correction over the comparisons of one table, and the verdict word.

Pairing: values keyed by seed (or by task) are paired on the keys both have when there are
at least MIN_SEEDS of them; seeds that are not shared fall back to Welch's t when each side
has MIN_SEEDS values; otherwise there is no test ("fewer than 3 seeds").

- Paired t (Student 1908): d_i = a_i − b_i over the n pairs, mean d̄, sd s_d;
  t = d̄ / (s_d / √n) with n − 1 degrees of freedom; interval d̄ ± t_{0.975, n−1} s_d / √n.
- Welch's t (Welch 1947): d = ā − b̄, se = √(s_a²/n_a + s_b²/n_b), degrees of freedom by
  Welch–Satterthwaite, ν = se⁴ / ((s_a²/n_a)²/(n_a − 1) + (s_b²/n_b)²/(n_b − 1)).
- A metric compared as a ratio (perplexity) is tested on its logarithms (the paired mean of
  log(a_i / b_i), or Welch on log a and log b): the ratio first/second is exp of the mean
  log difference, its interval exp of that interval's ends; the difference of the raw values
  is given beside it.
- Holm–Bonferroni (Holm 1979) over a family of m p-values sorted p_(1) ≤ … ≤ p_(m):
  adjusted p_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j)). A table's family is every
  comparison it makes that has a p-value; a verdict word ("ahead"/"behind": better/worse
  given the metric's mode) needs its adjusted p < ALPHA, else "tie".

Degenerate data gives a note and no verdict word: zero spread ("all 3 seeds equal", or
"every seed differs by exactly X"), every value of both at or below a chance level the
caller passes ("every run at chance (...): the budget is too small to compare").
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from attnlab.compare.seeds import MIN_SEEDS, SEED, Configuration, label_pairs, number
from attnlab.errors import ConfigError

ALPHA = 0.05
PAIRED_BY_SEED = "paired by seed"
PAIRED_BY_TASK = "paired by task"
WELCH = "Welch"
TOLERANCE = 1e-9  # relative: values closer than this are equal but for floating-point rounding
AHEAD = ("ahead", "behind", "tie")  # better, worse, neither: the words of most tables


@dataclass(frozen=True)
class Chance:
    """A level no run should be compared at: every value at or below it says nothing."""

    level: float
    name: str  # how the table says it, e.g. "the probe's bound 0.118"


@dataclass(frozen=True)
class Difference:
    """first − second: the estimate, its 95% interval, the sizes (pairs, or both samples),
    the method, the two-sided p-value, and Holm's adjusted p once a family is corrected;
    `note` says why there is no test (degenerate data, too few values)."""

    estimate: float | None
    low: float | None
    high: float | None
    n: tuple[int, ...]
    method: str
    p: float | None = None
    note: str = ""
    ratio: tuple[float, float, float] | None = None  # first/second, its 95% interval
    holm: float | None = None
    family: int = 0

    @property
    def tested(self) -> bool:
        return self.p is not None and not self.note


def t_test(mean: float, se: float, df: float) -> tuple[float, float, float]:
    """The 95% interval's ends and the two-sided p-value of a mean with standard error `se`
    on `df` degrees of freedom."""
    from scipy.stats import t as student_t  # most of a second to import: only when needed

    half = float(student_t.ppf(0.975, df)) * se
    p = 2 * float(student_t.sf(abs(mean) / se, df))
    return mean - half, mean + half, p


def paired_t(differences: Sequence[float]) -> tuple[float, float, float, float]:
    """Student's paired t on `differences` (at least two, not all equal): mean, interval
    ends and p."""
    n, mean = len(differences), statistics.fmean(differences)
    low, high, p = t_test(mean, statistics.stdev(differences) / math.sqrt(n), n - 1)
    return mean, low, high, p


def welch_t(first: Sequence[float], second: Sequence[float]) -> tuple[float, float, float, float]:
    """Welch's t of mean(first) − mean(second): the difference, interval ends and p."""
    a, b = statistics.variance(first) / len(first), statistics.variance(second) / len(second)
    df = (a + b) ** 2 / (a**2 / (len(first) - 1) + b**2 / (len(second) - 1))
    mean = statistics.fmean(first) - statistics.fmean(second)
    low, high, p = t_test(mean, math.sqrt(a + b), df)
    return mean, low, high, p


def alike(values: Sequence[float]) -> bool:
    """Whether `values` are one value but for rounding (0.9 − 0.8 against 0.8 − 0.7)."""
    return max(values) - min(values) <= TOLERANCE * max(1.0, *map(abs, values))


def constant_gap(first: Sequence[float], second: Sequence[float], paired: bool) -> float | None:
    """The one value first − second takes where the tested values have no spread (every pair
    differs alike, or each side is constant); None where they spread."""
    if paired:
        gaps = [a - b for a, b in zip(first, second, strict=True)]
        return statistics.fmean(gaps) if alike(gaps) else None
    if not (alike(first) and alike(second)):
        return None
    return statistics.fmean(first) - statistics.fmean(second)


def spread_note(first: Sequence[float], second: Sequence[float], unit: str, paired: bool) -> str:
    """What zero spread of the values means ("all 3 seeds equal", "every seed differs by
    exactly +0.010"), or "" where they spread."""
    gap = constant_gap(first, second, paired)
    if gap is None:
        return ""
    if alike([*first, *second]):
        return f"all {len(first)} {unit}s equal" if paired else f"all {unit}s equal"
    if alike([gap, 0.0]):
        return f"equal in each of the {len(first)} {unit}s"
    return f"every {unit} differs by exactly {signed(gap)}"


def difference(
    first: Mapping[str, float],
    second: Mapping[str, float],
    unit: str = "seed",
    chance: Chance | None = None,
    ratio: bool = False,
) -> Difference:
    """first − second from values keyed by seed (or by `unit`, e.g. task): paired on the
    shared keys when at least MIN_SEEDS, else (seeds only) Welch's t when each side has
    MIN_SEEDS values, else no test. `ratio`: tested on logs, with the ratio first/second."""
    shared = [key for key in first if key in second]
    if len(shared) >= MIN_SEEDS:
        a, b = [first[k] for k in shared], [second[k] for k in shared]
        method, n = (PAIRED_BY_SEED if unit == "seed" else f"paired by {unit}"), (len(shared),)
    elif unit == "seed" and min(len(first), len(second)) >= MIN_SEEDS:
        a, b = list(first.values()), list(second.values())
        method, n = WELCH, (len(a), len(b))
    else:
        note = f"fewer than {MIN_SEEDS} {unit}s"
        return Difference(None, None, None, (len(shared),), "", note=note)
    paired = method != WELCH
    estimate = statistics.fmean(a) - statistics.fmean(b)
    if chance is not None and max(*a, *b) <= chance.level:
        note = f"every run at chance ({chance.name}): the budget is too small to compare"
        return Difference(estimate, None, None, n, method, note=note)
    if note := spread_note(a, b, unit, paired):
        return Difference(estimate, None, None, n, method, note=note)
    ratio = ratio and min(*a, *b) > 0  # a ratio of values at or below 0 means nothing
    logs = ([math.log(v) for v in a], [math.log(v) for v in b]) if ratio else (a, b)
    if ratio and (gap := constant_gap(*logs, paired)) is not None:
        note = f"every {unit}'s ratio is exactly ×{number(math.exp(gap))}"
        return Difference(estimate, None, None, n, method, note=note)
    test = paired_t if paired else welch_t
    args = ([x - y for x, y in zip(a, b, strict=True)],) if paired else (a, b)
    _, low, high, p = test(*args)
    found = Difference(estimate, low, high, n, method, p)
    if not ratio:
        return found
    log_args = ([x - y for x, y in zip(*logs, strict=True)],) if paired else logs
    log_mean, log_low, log_high, log_p = test(*log_args)
    return dataclasses.replace(
        found, p=log_p, ratio=(math.exp(log_mean), math.exp(log_low), math.exp(log_high))
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (the module docstring), in the order given."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def corrected(differences: Sequence[Difference]) -> list[Difference]:
    """The differences with Holm's adjusted p over those of them that were tested (the
    family), in the order given; the untested as they were."""
    family = [d for d in differences if d.tested]
    adjusted = iter(holm([d.p for d in family if d.p is not None]))
    return [
        dataclasses.replace(d, holm=next(adjusted), family=len(family)) if d.tested else d
        for d in differences
    ]


def better(difference: Difference, mode: str) -> float:
    """The tested estimate's sign, positive where first is better given `mode` (max | min)."""
    shown = math.log(difference.ratio[0]) if difference.ratio else (difference.estimate or 0.0)
    return shown if mode == "max" else -shown


def verdict(difference: Difference, mode: str, words: tuple[str, str, str] = AHEAD) -> str:
    """The better/worse/neither word by Holm's adjusted p; "" without a corrected test."""
    if difference.holm is None or not difference.tested:
        return ""
    if difference.holm >= ALPHA or better(difference, mode) == 0:
        return words[2]
    return words[0] if better(difference, mode) > 0 else words[1]


def signed(value: float, digits: int = 3) -> str:
    """ "+0.071" or "−0.071" (a minus sign, not a hyphen)."""
    return ("−" if value < 0 else "+") + number(abs(value), digits)


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def formatted(
    difference: Difference, mode: str, words: tuple[str, str, str] = AHEAD, digits: int = 3
) -> str:
    """ "−0.071 ± 0.014 (paired by seed, n=3; Holm p = 0.012): ahead", with a ratio
    "×0.988 [0.985, 0.991]" after the interval; the note where there is no test."""
    d = difference
    if d.note or d.estimate is None or d.low is None or d.high is None:
        return d.note
    text = f"{signed(d.estimate, digits)} ± {number((d.high - d.low) / 2, digits)}"
    if d.ratio:
        value, low, high = (number(r, digits) for r in d.ratio)
        text += f" ×{value} [{low}, {high}]"
    sizes = ", ".join(map(str, d.n))
    p = f"Holm p {p_text(d.holm)}" if d.holm is not None else f"p {p_text(d.p or 0.0)}"
    word = verdict(d, mode, words)
    return f"{text} ({d.method}, n={sizes}; {p})" + (f": {word}" if word else "")


def family_legend(differences: Sequence[Difference]) -> str:
    """The legend's sentence on the correction: "Holm–Bonferroni over the N comparisons of
    this table"."""
    found = max((d.family for d in differences), default=0)
    if not found:
        return "No comparison of this table could be tested."
    noun = "comparison" if found == 1 else f"{found} comparisons"
    return f"Holm–Bonferroni over the {noun} of this table."


def by_seed(config: Configuration, metric: str) -> dict[str, float]:
    """The configuration's last value of `metric` in each run that ended on a number, keyed
    by the run's seed."""
    found = {run.value(SEED): run.last(metric) for run in config.runs if metric not in run.nan}
    return {seed: v for seed, v in found.items() if v is not None and math.isfinite(v)}


def baseline_of(labels: Sequence[str], label: str | None, what: str) -> str:
    """The one of `labels` that `label` names (its keys in any order), or the first where
    `label` is None; a ConfigError listing the labels where it names none."""
    if label is None:
        return labels[0]
    for found in labels:
        if label_pairs(found) == label_pairs(label):
            return found
    raise ConfigError(
        f"{what} {label} is none of the configurations: name one of {'; '.join(sorted(labels))}"
    )
