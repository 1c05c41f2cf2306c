"""The paired bootstrap of test BLEU against a baseline (attnlab.compare.significance), on
run records written here, with references in a directory of their own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_compare import fake_run

from attnlab.compare.differences import corrected, verdict
from attnlab.compare.runs import find_runs
from attnlab.compare.seeds import configurations, equivalence
from attnlab.compare.significance import (
    bootstrap_table,
    located,
    paired,
    references,
    seed_paired,
)
from attnlab.errors import ConfigError
from attnlab.reports.results import archive, regenerate

REFERENCES = [f"ein kleiner hund nummer {n} läuft über die grüne wiese" for n in range(60)]
WORSE = [f"ein hund {n}" for n in range(60)]


def translation_run(directory: Path, synthesizer: str, seed: int, data: Path, lines: list[str]):
    run = fake_run(directory, [f"synthesizer={synthesizer}", f"seed={seed}"], [{"step": 1}])
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    config["seed"] = seed
    config["task"]["data"] = {"source": "local", "dir": str(data), "tgt_lang": "de"}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "hypotheses").mkdir()
    (run / "hypotheses" / "test.txt").write_text("".join(f"{line}\n" for line in lines))
    return run


def study(tmp_path: Path, seeds=(0, 1, 2)) -> tuple[list, Path]:
    data = tmp_path / "data" / "multi30k"
    data.mkdir(parents=True)
    (data / "test.de").write_text("".join(f"{line}\n" for line in REFERENCES))
    runs = tmp_path / "runs"
    for seed in seeds:  # dot gets 40 + seed sentences right, near one more or one fewer
        right, near = 40 + seed, (39, 42, 41)[seed]
        translation_run(runs / f"dot{seed}", "dot", seed, data, REFERENCES[:right] + WORSE[right:])
        translation_run(
            runs / f"near{seed}", "random", seed, data, REFERENCES[:near] + WORSE[near:]
        )
        translation_run(
            runs / f"worse{seed}", "dense", seed, data, WORSE[:10] + REFERENCES[10:20] + WORSE[20:]
        )
    return configurations(find_runs(runs), ["synthesizer", "seed"]), data


def test_a_clearly_worse_system_is_behind_and_a_nearly_identical_one_ties(tmp_path):
    configs, _ = study(tmp_path)
    table = bootstrap_table(configs, "synthesizer=dot", tmp_path)
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in table.splitlines()}
    assert rows["synthesizer=dense"].endswith(": behind |")
    assert "(paired by seed, n=3; Holm p < 0.001): behind" in rows["synthesizer=dense"]
    assert rows["synthesizer=dense"].count("(p = 0.001)") == 3  # 1 / (1,000 + 1), rounded
    assert rows["synthesizer=random"].endswith(": tie |")
    p_values = [float(p) for p in re.findall(r"\(p = ([0-9.]+)\)", rows["synthesizer=random"])]
    assert len(p_values) == 3 and min(p_values) > 0.05  # one sentence of sixty differs
    assert "synthesizer=dot |" not in table  # the baseline has no row of its own


def test_the_bootstrap_is_the_same_every_time(tmp_path):
    configs, _ = study(tmp_path)
    dense = next(c for c in configs if c.label == "synthesizer=dense").runs[0]
    dot = next(c for c in configs if c.label == "synthesizer=dot").runs[0]
    refs = references(dot, tmp_path)
    assert paired(dense, dot, refs) == paired(dense, dot, refs)
    assert paired(dense, dot, refs)[0] < -10  # BLEU points


def test_fewer_than_three_seeds_give_no_verdict(tmp_path):
    configs, _ = study(tmp_path, seeds=(0, 1))
    table = bootstrap_table(configs, "synthesizer=dot", tmp_path)
    assert table.count("| fewer than 3 seeds |") == 2


def test_the_verdict_is_the_seed_paired_t_test_of_the_bleu_differences_with_holm():
    # BLEU gain per seed (the bootstrap's p-values are not combined)
    behind = {"0": -5.0, "1": -4.0, "2": -6.0}
    noisy = {"0": 1.0, "1": -0.9, "2": 0.2}
    alone = corrected([seed_paired(behind)])
    assert verdict(alone[0], "max") == "behind"  # d = −5, −4, −6: t = −8.66, p = 0.013
    assert [verdict(d, "max") for d in corrected([seed_paired(behind), seed_paired(noisy)])] == [
        "behind",  # Holm: 2 × 0.013 = 0.026
        "tie",
    ]
    same = dict.fromkeys(behind, 0.0)
    # sacreBLEU gives identical outputs p = 1 / (resamples + 1), "not attributed to chance"
    assert verdict(corrected([seed_paired(same)])[0], "max") == ""
    assert seed_paired(same).note == "equal in each of the 3 seeds"


def test_references_recorded_on_another_machine_are_found_in_shared_data(tmp_path):
    repository = tmp_path / "repo"
    shared = tmp_path / "shared" / "data" / "multi30k"
    shared.mkdir(parents=True)
    (shared / "test.de").write_text("a\n")
    assert located("/elsewhere/data/multi30k/test.de", repository) == shared / "test.de"
    assert located("/elsewhere/data/other/test.de", repository) is None


def test_missing_hypotheses_are_said_and_missing_references_named_not_guessed(tmp_path):
    configs, data = study(tmp_path)
    for name in ("near0", "worse0"):  # seed 0 of two configurations
        (tmp_path / "runs" / name / "hypotheses" / "test.txt").unlink()
    table = bootstrap_table(configs, "synthesizer=dot", tmp_path)
    assert table.count("0: no hypotheses or references") == 2
    (data / "test.de").unlink()  # a clone without the data: no table, the file named
    with pytest.raises(ConfigError, match=r"needs its test references .*multi30k/test\.de"):
        bootstrap_table(configs, "synthesizer=dot", tmp_path)
    with pytest.raises(ConfigError, match=r"baseline synthesizer=nope is none of .*: name one"):
        bootstrap_table(configs, "synthesizer=nope", tmp_path)
    dot = [config for config in configs if config.label == "synthesizer=dot"]
    assert bootstrap_table(dot, "synthesizer=dot", tmp_path) == (
        "Paired bootstrap: one configuration only, so nothing to compare with synthesizer=dot."
    )


def test_a_results_block_with_a_baseline_archives_hypotheses_and_adds_the_bootstrap(tmp_path):
    study(tmp_path)
    root = tmp_path / "repo"
    archive(tmp_path / "runs", root / "docs" / "results" / "runs" / "synth")
    assert len(list(root.rglob("hypotheses/test.txt"))) == 9
    results_md = root / "RESULTS.md"
    results_md.write_text(
        "<!-- results:synth configurations baseline=synthesizer=dot -->\n<!-- /results:synth -->\n"
    )
    text = regenerate(results_md, draw=False)
    assert "Paired bootstrap resampling of test BLEU against synthesizer=dot" in text
    assert "| synthesizer=dense |" in text and text.count(": behind |") == 1


def test_equivalence_is_two_one_sided_tests_on_the_paired_differences():
    assert equivalence([0.10, -0.05, 0.02], 0.4).startswith("equivalent (90% interval")
    # study 5b's Random against dot product, seed-paired: mean −0.95, 90% interval −1.86..−0.04
    assert equivalence([-1.21, -0.33, -1.31], 0.4) == "inconclusive (90% interval -1.86 to -0.04)"
    assert equivalence([-2.0, -2.1, -1.9], 0.4).startswith("not equivalent")
    assert equivalence([0.1, 0.1], 0.4) == "fewer than 3 seeds"


def test_a_margin_adds_the_equivalence_test_to_the_bootstrap_table(tmp_path):
    configs, _ = study(tmp_path)
    table = bootstrap_table(configs, "synthesizer=dot", tmp_path, margin=5.0)
    assert "| verdict | within ±5 BLEU (two one-sided tests) |" in table
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in table.splitlines()}
    assert ": tie | equivalent (90% interval" in rows["synthesizer=random"]  # one sentence
    assert ": behind | not equivalent (90% interval" in rows["synthesizer=dense"]


@pytest.mark.parametrize(
    "options,message",
    [
        ("margin=0.4", "has margin=0.4 but no baseline: the equivalence test compares"),
        ("baseline=synthesizer=dot margin=abc", "has margin=abc: write a positive number"),
    ],
)
def test_a_margin_without_a_baseline_or_a_number_is_one_sentence(tmp_path, options, message):
    study(tmp_path)
    (tmp_path / "docs" / "results" / "runs").mkdir(parents=True)
    (tmp_path / "runs").rename(tmp_path / "docs" / "results" / "runs" / "mt")
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text(f"<!-- results:mt configurations {options} -->\n<!-- /results:mt -->\n")
    with pytest.raises(ConfigError, match=message):
        regenerate(results_md, draw=False)
