"""Paired bootstrap resampling of test BLEU against a baseline configuration (Koehn 2004), by
sacreBLEU's `PairedTest` (1,000 resamples, a fixed seed): seed by seed, each run's test
hypotheses (`hypotheses/test.txt`, archived with its record) against the baseline run of the
same seed, on the references of the test split.

References are never archived (they are the corpus's): they are read where the run read
them, its `task.data.test_tgt` or `{task.data.dir}/test.{tgt_lang}`, or, where that path
does not exist on this machine, the directory of the same name in `../shared/data` beside
the repository; where neither exists (a clone without `../shared`), the table is not made
and one sentence names the file it needs. A run whose hypotheses cannot be found, whose data
names no references (a hub dataset), or whose hypotheses and references do not match in
number, is left out of the test, and the table says so.

The verdict is the comparison engine's (`attnlab.compare.differences`): the per-seed BLEU
differences from the baseline, paired by seed (Student's t over at least MIN_SEEDS seeds),
ahead or behind where Holm's adjusted p over the table's configurations is below ALPHA;
otherwise a tie. The per-seed bootstrap p-values are shown beside it, not combined. A tie is not equivalence: with a `margin` (BLEU,
stated before looking), the seed-paired BLEU differences also go through two one-sided
tests (`seeds.equivalence`), which say whether the configuration is within ±margin of the
baseline.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from attnlab.compare.differences import (
    ALPHA,
    Difference,
    corrected,
    difference,
    family_legend,
    formatted,
)
from attnlab.compare.runs import Run
from attnlab.compare.seeds import MIN_SEEDS, Configuration, equivalence
from attnlab.data.text import read_lines
from attnlab.errors import ConfigError

SAMPLES = 1000
RESAMPLING_SEED = 12345  # sacreBLEU's default: the same resamples for every pair
HYPOTHESES = "hypotheses/test.txt"
Pair = tuple[float, float]  # this system's BLEU minus the baseline's, and the p-value
Test = Callable[[list[str], list[str], list[str]], Pair]  # system, baseline, references


def located(path: str, root: Path) -> Path | None:
    """`path` if it exists here, else the file of the same name below the directory of the
    same name in root/../shared/data (a record made on another machine)."""
    recorded = Path(path)
    if recorded.is_file():
        return recorded
    shared = root.parent / "shared" / "data" / recorded.parent.name / recorded.name
    return shared if shared.is_file() else None


def references(run: Run, root: Path) -> list[str] | None:
    """The test references the run was scored on; None where its data names no file; a
    ConfigError naming the file where it is on neither this machine nor ../shared/data."""
    data = run.config.task.data
    if data.get("test_tgt"):
        path = str(data.test_tgt)
    elif data.get("source") == "local" and data.get("dir"):
        path = os.path.join(str(data.dir), f"test.{data.tgt_lang}")
    else:
        return None
    found = located(path, root)
    if found is None:
        shared = root.parent / "shared" / "data" / Path(path).parent.name / Path(path).name
        raise ConfigError(
            f"the paired bootstrap of {run.path.name} needs its test references {path} (or "
            f"{shared}), which this machine lacks: put them there and run `attnlab results` again"
        )
    return list(read_lines(found))


def hypotheses(run: Run) -> list[str] | None:
    path = run.path / HYPOTHESES
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8").splitlines()


def bootstrap(system: list[str], base: list[str], refs: list[str]) -> Pair:
    """(the system's BLEU minus the baseline's, the paired bootstrap's p-value), by sacreBLEU."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    previous = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(RESAMPLING_SEED)  # read once, by the constructor
    try:
        systems = [("baseline", base), ("system", system)]
        test = PairedTest(systems, {"BLEU": BLEU()}, [refs], "bs", SAMPLES)
    finally:
        if previous is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = previous
    _, scores = test()
    base_score, system_score = scores["BLEU"]
    return system_score.score - base_score.score, float(system_score.p_value)


def paired(run: Run, baseline: Run, refs: list[str], test: Test = bootstrap) -> Pair | None:
    """`test` of this run's hypotheses against the baseline's, or None where the hypotheses
    are missing or do not match the references in number."""
    system, base = hypotheses(run), hypotheses(baseline)
    if system is None or base is None or not len(system) == len(base) == len(refs):
        return None
    return test(system, base, refs)


def seed_paired(gains: dict[str, float]) -> Difference:
    """The configuration's test BLEU minus the baseline's, paired by seed: Student's t of the
    per-seed differences `gains` (`attnlab.compare.differences`). The paired test reads
    only the differences, so each seed's baseline stands at its own index (0, 1, 2, ...):
    distinct across seeds, as BLEU scores are, so that identical outputs read "equal in each
    of the n seeds" and not "all n seeds equal"."""
    base = {seed: float(index) for index, seed in enumerate(gains)}
    return difference({seed: base[seed] + gain for seed, gain in gains.items()}, base)


def bootstrap_table(
    configs: list[Configuration],
    baseline: str,
    root: Path,
    margin: float | None = None,
    test: Test = bootstrap,
) -> str:
    """Per configuration: each paired seed's BLEU gain over `baseline` (a configuration's
    label) and its p-value by `test` (sacreBLEU's, or results kept of it), and the verdict
    (the seed-paired t test of the gains, Holm over the table); with `margin`, the
    equivalence test's answer."""
    found = {config.label: config for config in configs}
    if len(found) == 1:
        return f"Paired bootstrap: one configuration only, so nothing to compare with {baseline}."
    named = [config for config in configs if config.answers_to(baseline)]
    if not named:
        raise ConfigError(
            f"the paired bootstrap's baseline {baseline} is none of the configurations: name "
            f"one of {'; '.join(sorted(found))}"
        )
    base = {run.setting("seed"): run for run in named[0].runs}
    rows: list[tuple[str, list[str], dict[str, float]]] = []
    for label, config in found.items():
        if config is named[0]:
            continue
        cells, gains = [], {}
        for run in config.runs:
            seed, other = run.setting("seed"), base.get(run.setting("seed"))
            refs = references(run, root) if other else None
            result = paired(run, other, refs, test) if other and refs else None
            if result is None:
                why = "no baseline run" if other is None else "no hypotheses or references"
                cells.append(f"{seed}: {why}")
                continue
            gains[str(seed)] = result[0]
            cells.append(f"{seed}: {result[0]:+.2f} (p = {result[1]:.3f})")
        rows.append((label, cells, gains))
    verdicts = corrected([seed_paired(gains) for _, _, gains in rows])
    lines = [
        f"Paired bootstrap resampling of test BLEU against {baseline} (sacreBLEU, {SAMPLES} "
        f"resamples), seed by seed: BLEU difference and p-value. The verdict: the difference "
        f"in test BLEU paired by seed (Student's t over the n seeds both ran, at least "
        f"{MIN_SEEDS}), ahead or behind where Holm's adjusted p < {ALPHA}, else tie; "
        + family_legend(verdicts),
        "",
        "| configuration | seed: Δ BLEU (p) | verdict |" + equivalent_header(margin),
        "|---|---|---|" + ("---|" if margin is not None else ""),
    ]
    for (label, cells, gains), found_verdict in zip(rows, verdicts, strict=True):
        within = "" if margin is None else f" {equivalence(list(gains.values()), margin)} |"
        text = formatted(found_verdict, "max", digits=2)
        lines.append(f"| {label} | {'; '.join(cells)} | {text} |{within}")
    return "\n".join(lines)


def equivalent_header(margin: float | None) -> str:
    return "" if margin is None else f" within ±{margin:g} BLEU (two one-sided tests) |"
