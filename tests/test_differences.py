"""The comparison engine (attnlab.compare.differences) on constructed values: pairing by
seed, Welch's t, Holm's correction, the degenerate cases and the formatted cell."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnlab.compare.differences import (
    Chance,
    corrected,
    difference,
    family_legend,
    formatted,
    holm,
    verdict,
)
from attnlab.compare.seeds import interval


def seeds(*values: float, start: int = 0) -> dict[str, float]:
    return {str(start + n): value for n, value in enumerate(values)}


def bounds(values: dict[str, float]) -> tuple[float, float]:
    """The 95% t interval of the mean over the seeds."""
    mean, half = float(np.mean(list(values.values()))), interval(list(values.values()))
    assert half is not None
    return mean - half, mean + half


def test_pairing_by_seed_finds_a_difference_that_overlapping_intervals_tie():
    first, second = seeds(0.80, 0.90, 0.70), seeds(0.78, 0.88, 0.69)
    # the rule of overlapping intervals: 0.800 ± 0.248 against 0.783 ± 0.237 tie
    assert bounds(first)[0] < bounds(second)[1] and bounds(second)[0] < bounds(first)[1]
    (found,) = corrected([difference(first, second)])
    # d = 0.02, 0.02, 0.01: mean 0.01667, s = 0.00577, t = 5.0 on 2 degrees of freedom
    assert found.method == "paired by seed" and found.n == (3,)
    assert found.p == pytest.approx(2 * stats.t.sf(5.0, 2))
    assert found.p == pytest.approx(stats.ttest_rel([0.8, 0.9, 0.7], [0.78, 0.88, 0.69]).pvalue)
    gaps = np.array([0.02, 0.02, 0.01])
    half = stats.t.ppf(0.975, 2) * gaps.std(ddof=1) / math.sqrt(3)
    assert (found.low, found.high) == pytest.approx((gaps.mean() - half, gaps.mean() + half))
    assert verdict(found, "max") == "ahead" and verdict(found, "min") == "behind"
    assert formatted(found, "max") == "+0.017 ± 0.014 (paired by seed, n=3; Holm p = 0.038): ahead"


def test_configurations_without_shared_seeds_are_compared_by_welchs_t():
    a = np.array([0.90, 0.91, 0.92, 0.95], dtype=np.float64)
    b = np.array([0.60, 0.70, 0.80], dtype=np.float64)
    found = difference(seeds(*a), seeds(*b, start=10))
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    assert found.method == "Welch" and found.n == (4, 3)
    assert found.estimate == pytest.approx(a.mean() - b.mean())
    gap = a.mean() - b.mean()
    assert (found.low, found.high) == pytest.approx((gap - half, gap + half))
    assert found.p == pytest.approx(2 * stats.t.sf(abs(t), df))
    assert found.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)


def test_holms_step_down_is_the_hand_computation():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == [0.02]  # a family of one: unadjusted


def test_holm_turns_a_difference_alone_into_a_tie_in_a_family_of_two():
    first, second = seeds(0.80, 0.90, 0.70), seeds(0.78, 0.88, 0.69)
    alone = corrected([difference(first, second)])[0]
    family = corrected([difference(first, second), difference(second, first)])
    assert alone.p < 0.05 and verdict(alone, "max") == "ahead"
    assert [d.holm for d in family] == pytest.approx([2 * alone.p] * 2)
    assert [verdict(d, "max") for d in family] == ["tie", "tie"]
    assert family_legend(family) == "Holm–Bonferroni over the 2 comparisons of this table."


def test_degenerate_values_say_so_and_give_no_verdict():
    equal = difference(seeds(0.5, 0.5, 0.5), seeds(0.5, 0.5, 0.5))
    constant = difference(seeds(0.98, 0.96, 0.94), seeds(0.88, 0.86, 0.84))
    bound = Chance(0.118, "the probe's bound 0.118")
    chance = difference(seeds(0.118, 0.11, 0.118), seeds(0.1, 0.118, 0.09), chance=bound)
    few = difference(seeds(0.9, 0.8), seeds(0.1, 0.2))
    family = corrected([equal, constant, chance, few])
    assert [formatted(d, "max") for d in family] == [
        "all 3 seeds equal",
        "every seed differs by exactly +0.100",  # 0.98 − 0.88 and 0.96 − 0.86 but for rounding
        "every run at chance (the probe's bound 0.118): the budget is too small to compare",
        "fewer than 3 seeds",
    ]
    assert all(d.holm is None and verdict(d, "max") == "" for d in family)
    assert family_legend(family) == "No comparison of this table could be tested."
    zero = Chance(0.0, "exact match 0.000")
    at_zero = difference(seeds(0.0, 0.0, 0.0), seeds(0.0, 0.0, 0.0), chance=zero)
    assert formatted(at_zero, "max").startswith("every run at chance (exact match 0.000)")


def test_a_ratio_metric_is_tested_on_its_logarithms():
    first, second = seeds(5.0, 5.1, 5.3), seeds(5.07, 5.17, 5.39)
    (found,) = corrected([difference(first, second, ratio=True)])
    logs = np.log([5.0, 5.1, 5.3]) - np.log([5.07, 5.17, 5.39])
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert found.ratio == pytest.approx(
        np.exp([logs.mean(), logs.mean() - half, logs.mean() + half])
    )
    assert found.p == pytest.approx(stats.ttest_1samp(logs, 0.0).pvalue)
    words = ("improves", "worsens", "tie")
    assert formatted(found, "min", words) == (
        "−0.077 ± 0.029 ×0.985 [0.981, 0.990] (paired by seed, n=3; Holm p = 0.005): improves"
    )
