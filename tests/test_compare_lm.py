"""`attnlab compare` and `attnlab results` on language-model runs: perplexity by evaluation
length, loss by position, and n/a where a length is past the model's positions.

The runs are fakes laid out as attnlab.tasks.lm.system leaves them: test metrics `test/<m>@L` in
csv/metrics.csv (NaN at a length the model cannot take), lengths/test.json and
lengths/test_loss_by_position.csv.
"""

from __future__ import annotations

import csv
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib.image import imread
from scipy import stats
from test_compare import fake_run, read_csv

from attnlab.compare.lengths import applicable
from attnlab.compare.runs import find_runs
from attnlab.compare.seeds import configurations, interval, number, summary
from attnlab.errors import ConfigError
from attnlab.reports.families import compare
from attnlab.reports.results import archive, regenerate
from attnlab.tasks.lm.report import lengths_table, position_bands, ppl_bands
from attnlab.tasks.lm.sinks import sink_band, sinks_by_layer, sinks_table

LENGTHS = (32, 64, 128)
NAN = math.nan


def fake_lm_run(
    directory: Path,
    overrides: list[str],
    ppl: dict[int, float],
    bound: int | None = None,
    record: bool = True,
    position_loss: float = 0.0,
    sinks: dict[int, list[float]] | None = None,
) -> Path:
    """A tested language-model run: perplexity `ppl[L]` at each length L in non-overlapping
    windows (one less in sliding ones), NaN past `bound` (its pe.max_len, if any), which
    lengths/test.json (written if `record`) marks not applicable. The loss at position p of
    the windows of each applicable length is `position_loss` + p / 100. `sinks[L]`: the
    attention sink of each layer measured at L (task.system.sink_windows=4)."""
    test: dict[str, float] = {"step": 11}
    for length, value in ppl.items():
        test.update({f"test/loss@{length}": math.log(value), f"test/ppl@{length}": value,
                     f"test/ppl_sliding@{length}": value - 1})  # fmt: skip
    for length, shares in (sinks or {}).items():
        test[f"test/sink@{length}"] = sum(shares) / len(shares)
    fake_run(directory, overrides, [{"step": 10, "val/loss": 3.0}, test], mode="min")
    config_file = directory / ".hydra" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    pe = {"name": "learned", "max_len": bound} if bound else {"name": "rope"}
    task = {"name": "lm", "metric": "val/loss", "data": {"block_size": 32}}
    if sinks:
        task["system"] = {"sink_windows": 4}
    config.update(pe=pe, task={**config["task"], **task})
    config_file.write_text(yaml.safe_dump(config))
    (directory / "lengths").mkdir()
    fits = [length for length in ppl if bound is None or length <= bound]
    lengths = {str(n): {"ppl": ppl[n]} if n in fits else {"applicable": False} for n in ppl}
    for length, shares in (sinks or {}).items():
        lengths[str(length)].update(sink=sum(shares) / len(shares), sink_by_layer=shares)
    if record:
        text = json.dumps({"max_positions": bound, "lengths": lengths})
        (directory / "lengths" / "test.json").write_text(text)
    with (directory / "lengths" / "test_loss_by_position.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["length", "position", "loss", "tokens"])
        writer.writerows((n, p, position_loss + p / 100, 10) for n in fits for p in range(1, n + 1))
    return directory


def study(directory: Path, record: bool = True) -> Path:
    """Two seeds each of rope (every length) and learned with 64 positions."""
    for job, (seed, scale) in enumerate(((0, 1.0), (1, 2.0))):
        ppl = {32: 10.0 * scale, 64: 12.0 * scale, 128: 20.0 * scale}
        fake_lm_run(directory / str(job), ["pe=rope", f"seed={seed}"], ppl, None, record, seed)
        learned = ["pe=learned", f"seed={seed}", "pe.max_len=64"]
        ppl = {32: 8.0 * scale, 64: 9.0 * scale, 128: NAN}
        fake_lm_run(directory / str(job + 2), learned, ppl, 64, record, seed)
    return directory


def is_png_image(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and min(imread(path).shape[:2]) > 100


def test_compare_draws_perplexity_by_length_and_loss_by_position_and_lists_them(tmp_path):
    comparison = compare(study(tmp_path))
    names = [path.name for path in comparison.plots]
    assert "ppl_by_length.png" in names and "loss_by_position.png" in names
    document = (tmp_path / "comparison.md").read_text()
    for name in ("ppl_by_length.png", "loss_by_position.png"):
        assert is_png_image(tmp_path / name)
        assert f"]({name})" in document


def test_a_length_past_the_models_positions_reads_n_a_and_every_other_a_number(tmp_path):
    compare(study(tmp_path))
    rows = {(row["pe"], row["seed"]): row for row in read_csv(tmp_path / "comparison.csv")}
    lengths = [key for key in rows["rope", "0"] if key.startswith("test/ppl@")]
    assert lengths == ["test/ppl@32", "test/ppl@64", "test/ppl@128"], "in length order"
    for seed in ("0", "1"):
        assert rows["learned", seed]["test/ppl@128"] == "n/a"
        assert rows["learned", seed]["test/ppl_sliding@128"] == "n/a"
        assert float(rows["learned", seed]["test/ppl@64"]) == 9.0 * (1 + int(seed))
        assert [float(rows["rope", seed][key]) for key in lengths] == [
            value * (1 + int(seed)) for value in (10.0, 12.0, 20.0)
        ]
    document = (tmp_path / "comparison.md").read_text()
    assert "| learned | 0 | 64 | completed | val/loss | 3 | 3 | 2.079 | 2.197 | n/a |" in document
    assert "n/a: an evaluation length longer than the run's model has positions for" in document


def test_the_table_by_configuration_gives_the_mean_and_interval_over_seeds_and_n_a(tmp_path):
    compare(study(tmp_path))
    document = (tmp_path / "comparison.md").read_text()
    rope = next(line for line in document.splitlines() if line.startswith("| rope |"))
    learned = next(line for line in document.splitlines() if line.startswith("| learned |"))
    # two seeds: t(0.975, 1) = 12.706 times s / √2, half their difference
    assert "| 15.000 ± 63.531 | 18.000 ± 76.237 | 30.000 ± 127.062 |" in rope
    assert "| 12.000 ± 50.825 | 13.500 ± 57.178 | n/a |" in learned
    assert "nan" not in learned


def test_the_plots_mean_and_range_over_seeds_are_right(tmp_path):
    configs = configurations(find_runs(study(tmp_path)), ["pe", "seed", "pe.max_len"])
    bands = ppl_bands(configs, "test/ppl")
    assert bands["pe=rope"] == ([32, 64, 128], [15.0, 18.0, 30.0], [10.0, 12.0, 20.0],
                                [20.0, 24.0, 40.0])  # fmt: skip
    learned = "pe=learned,pe.max_len=64 (n/a past 64)"
    assert bands[learned] == ([32, 64], [12.0, 13.5], [8.0, 9.0], [16.0, 18.0])
    sliding = ppl_bands(configs, "test/ppl_sliding")
    assert sliding["pe=rope"][1] == [14.0, 17.0, 29.0]


def test_loss_by_position_shows_each_configuration_at_its_longest_length(tmp_path):
    configs = configurations(find_runs(study(tmp_path)), ["pe", "seed", "pe.max_len"])
    bands = position_bands(configs)
    assert list(bands) == ["pe=rope (L = 128)", "pe=learned,pe.max_len=64 (L = 64)"]
    xs, mean, low, high = bands["pe=rope (L = 128)"]
    assert xs == list(range(1, 129))  # seeds 0 and 1: the loss at p is seed + p / 100
    assert mean[:2] == pytest.approx([0.51, 0.52]) and low[0] == 0.01 and high[0] == 1.01
    assert bands["pe=learned,pe.max_len=64 (L = 64)"][0] == list(range(1, 65))


def test_a_nan_at_a_length_the_model_can_take_is_nan_not_n_a(tmp_path):
    """A run that diverged logs NaN too; only a length past the model's positions is n/a."""
    ppl = {32: 10.0, 64: NAN, 128: NAN}
    fake_lm_run(tmp_path / "0", ["pe=rope", "seed=0"], ppl)
    fake_lm_run(tmp_path / "1", ["pe=rope", "seed=1"], {32: 12.0, 64: 13.0, 128: NAN})
    compare(tmp_path)
    rows = {row["seed"]: row for row in read_csv(tmp_path / "comparison.csv")}
    assert [rows["0"][f"test/ppl@{n}"] for n in LENGTHS] == ["10.0", "nan", "nan"]
    assert [rows["1"][f"test/ppl@{n}"] for n in LENGTHS] == ["12.0", "13.0", "nan"]
    document = (tmp_path / "comparison.md").read_text()
    assert "n/a" not in document
    assert "| 11.000 ± 12.706 | 13.000 (1 seed: no interval); 1 nan | nan |" in document


def test_without_lengths_json_the_configs_max_len_decides_what_is_n_a(tmp_path):
    runs = find_runs(study(tmp_path, record=False))
    learned = next(run for run in runs if run.value("pe") == "learned")
    rope = next(run for run in runs if run.value("pe") == "rope")
    assert [applicable(learned, f"test/ppl@{n}") for n in LENGTHS] == [True, True, False]
    assert [applicable(rope, f"test/ppl@{n}") for n in LENGTHS] == [True, True, True]
    compare(tmp_path)
    rows = read_csv(tmp_path / "comparison.csv")
    assert {row["pe"] for row in rows if row["test/ppl@128"] == "n/a"} == {"learned"}


def test_a_synthesizers_max_len_bounds_the_positions_too(tmp_path):
    run_dir = fake_lm_run(tmp_path, ["pe=rope"], {32: 5.0, 64: NAN}, record=False)
    config_file = run_dir / ".hydra" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    components = [{"name": "dense", "max_len": 48}, {"name": "dot"}]
    config["synthesizer"] = {"name": "mixture", "components": components}
    config_file.write_text(yaml.safe_dump(config))
    (run,) = find_runs(tmp_path)
    assert [applicable(run, f"test/ppl@{n}") for n in (32, 48, 64)] == [True, True, False]
    assert applicable(run, "test/acc"), "a metric at no length always applies"


@pytest.mark.parametrize(
    ("values", "half", "text"),
    [
        ([5.0], None, "5.000 (1 seed: no interval)"),
        ([10.0, 14.0], 25.412, "12.000 ± 25.412"),  # t(0.975, 1) = 12.706, s / √2 = 2
        ([10.0, 12.0, 14.0], 4.968, "12.000 ± 4.968"),  # t(0.975, 2) = 4.303, s / √3 = 1.155
    ],
)
def test_the_95_percent_interval_is_students_t(values, half, text):
    assert interval(values) == (None if half is None else pytest.approx(half, abs=1e-3))
    assert summary(values) == text


def results_md(root: Path, kind: str = "lengths") -> Path:
    path = root / "RESULTS.md"
    path.write_text(f"# Results\n\n<!-- results:lm {kind} -->\n<!-- /results:lm -->\n")
    return path


def test_a_lengths_block_gives_each_configurations_interval_and_n_a_and_draws_the_plot(tmp_path):
    sweep = study(tmp_path / "sweep")
    assert archive(sweep, tmp_path / "docs" / "results" / "runs" / "lm") == 4
    assert (tmp_path / "docs/results/runs/lm/2/lengths/test.json").is_file(), "archived"
    text = regenerate(results_md(tmp_path), draw=True)
    assert "| pe | pe.max_len | seeds | windows | L=32 | L=64 | L=128 |" in text
    # rope: 10 and 20 at L=32: mean 15, s = 7.071, t(0.975, 1) · s / √2 = 63.531
    assert "| rope |  | 2 | non-overlapping | 15.000 ± 63.531 | 18.000 ± 76.237 |" in text
    assert "| rope |  | 2 | sliding | 14.000 ± 63.531 |" in text
    assert (
        "| learned | 64 | 2 | non-overlapping | 12.000 ± 50.825 | 13.500 ± 57.178 | n/a |" in text
    )
    assert is_png_image(tmp_path / "lm.png")
    assert "![lm: perplexity by evaluation length](lm.png)" in text


def test_a_lengths_block_over_runs_of_another_task_is_one_sentence(tmp_path):
    fake_run(tmp_path / "docs" / "results" / "runs" / "lm" / "0", ["seed=0"], [])
    with pytest.raises(ConfigError, match="kind lengths, which reads lm runs, but its records"):
        regenerate(results_md(tmp_path))


# the attention sink (task.system.sink_windows): RESULTS.md's `sinks` kind


def shares(length: int, seed: int, layers: int = 2) -> list[float]:
    """A fake run's sink in each layer at `length`: a different number per layer, length and
    seed (seeds 0, 1, 2 add 0, 0.01, 0.04: unevenly spaced, so that only Student's t interval
    of these values gives the half-width the tests compute)."""
    return [0.2 * (layer + 1) / length**0.5 + 0.01 * seed**2 for layer in range(layers)]


def sinks_study(directory: Path) -> Path:
    """rope with 3 seeds measured at every length; learned with 64 positions, 2 seeds measured
    at 32 and 64 (n/a at 128); t5 measured by seed 0 alone; alibi measured by neither seed."""
    ppl = {32: 10.0, 64: 12.0, 128: 20.0}
    for seed in range(3):
        sinks = {n: shares(n, seed) for n in LENGTHS}
        fake_lm_run(directory / f"rope{seed}", ["pe=rope", f"seed={seed}"], ppl, sinks=sinks)
    for seed in range(2):
        learned = ["pe=learned", f"seed={seed}", "pe.max_len=64"]
        sinks = {n: shares(n, seed) for n in (32, 64)}
        fake_lm_run(directory / f"learned{seed}", learned, {**ppl, 128: NAN}, 64, sinks=sinks)
        sinks = {n: shares(n, seed) for n in LENGTHS} if seed == 0 else None
        fake_lm_run(directory / f"t5{seed}", ["pe=t5", f"seed={seed}"], ppl, sinks=sinks)
        fake_lm_run(directory / f"alibi{seed}", ["pe=alibi", f"seed={seed}"], ppl)
    return directory


def t_interval(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% Student's t interval, computed here."""
    from scipy.stats import t as student_t

    n = len(values)
    mean = sum(values) / n
    deviation = math.sqrt(sum((value - mean) ** 2 for value in values) / (n - 1))
    return mean, float(student_t.ppf(0.975, n - 1)) * deviation / math.sqrt(n)


def expected_cell(length: int, layer: int, seeds: range) -> str:
    mean, half = t_interval([shares(length, seed)[layer] for seed in seeds])
    assert half > 0.001, "four decimals show it"
    return f"{mean:.4f} ± {half:.4f}"


def uniform_reference(length: int) -> float:
    """(H_L − 1)/(L − 1): queries 1..L−1 attending uniformly give the first key 1/(i + 1)."""
    harmonic = sum(Fraction(1, k) for k in range(1, length + 1))
    return float((harmonic - 1) / (length - 1))


def sinks_block(tmp_path: Path) -> str:
    sinks_study(tmp_path / "sweep")
    archive(tmp_path / "sweep", tmp_path / "docs" / "results" / "runs" / "lm")
    return regenerate(results_md(tmp_path, "sinks"), draw=True)


def test_a_sinks_block_gives_each_layers_mean_and_interval_over_seeds_at_each_length(tmp_path):
    text = sinks_block(tmp_path)
    assert "| pe | pe.max_len | seeds | layer | L=32 | L=64 | L=128 |" in text
    for layer in (0, 1):
        cells = " | ".join(expected_cell(n, layer, range(3)) for n in LENGTHS)
        assert f"| rope |  | 3 | {layer + 1} | {cells} |" in text
        cells = " | ".join(expected_cell(n, layer, range(2)) for n in (32, 64))
        assert f"| learned | 64 | 2 | {layer + 1} | {cells} | n/a |" in text
    assert "| rope |  | 3 | 3 |" not in text, "one row per layer measured"
    assert "the mean ± the half-width of its 95% t interval over the seeds" in text
    assert "over the first 4 whole test windows of length L" in text


def test_a_study_with_a_lengths_and_a_sinks_block_keeps_both_figures(tmp_path):
    sinks_study(tmp_path / "sweep")
    archive(tmp_path / "sweep", tmp_path / "docs" / "results" / "runs" / "lm")
    both = results_md(tmp_path, "lengths")
    both.write_text(both.read_text() + "\n<!-- results:lm sinks -->\n<!-- /results:lm -->\n")
    text = regenerate(both, draw=True)
    for name in ("lm.png", "lm_sinks.png"):
        assert is_png_image(tmp_path / name)
        assert f"({name})" in text
    both.write_text(text)
    assert regenerate(both, draw=False) == text, "each figure keeps the stamp of its own block"


def test_runs_without_sink_records_read_not_measured(tmp_path):
    text = sinks_block(tmp_path)
    assert "| alibi |  | 2 |  | not measured | not measured | not measured |" in text
    one = [f"{shares(n, 0)[0]:.4f} (1 seed: no interval); 1 seed not measured" for n in LENGTHS]
    assert f"| t5 |  | 2 | 1 | {' | '.join(one)} |" in text
    assert " 0.0000" not in text and "| 0 |" not in text


def test_the_first_row_is_uniform_attentions_share_of_the_first_token(tmp_path):
    text = sinks_block(tmp_path)
    assert f"{uniform_reference(32):.4f}" == "0.0987"  # (H_32 − 1)/31 = 0.098661
    references = " | ".join(f"{uniform_reference(n):.4f}" for n in LENGTHS)
    lines = text.splitlines()
    first = lines[next(i for i, line in enumerate(lines) if line.startswith("|---|")) + 1]
    assert first == f"|  |  |  | uniform attention (no sink) | {references} |"


def test_the_sinks_plot_is_drawn_with_the_mean_and_interval_over_seeds(tmp_path):
    text = sinks_block(tmp_path)
    assert is_png_image(tmp_path / "lm_sinks.png")
    assert "![lm: attention sink by evaluation length](lm_sinks.png)" in text
    configs = configurations(find_runs(tmp_path / "sweep"), ["pe", "seed", "pe.max_len"])
    rope = next(config for config in configs if config.setting["pe"] == "rope")
    for layer in (0, 1):
        xs, mean, low, high = sink_band([sinks_by_layer(run) for run in rope.runs], layer)
        assert list(xs) == list(LENGTHS)
        found = [t_interval([shares(n, seed)[layer] for seed in range(3)]) for n in LENGTHS]
        assert mean == pytest.approx([m for m, _ in found])
        assert low == pytest.approx([max(0.0, m - h) for m, h in found])
        assert high == pytest.approx([m + h for m, h in found])
    first_layer_low = sink_band([sinks_by_layer(run) for run in rope.runs], 0)[2]
    mean, half = t_interval([shares(128, seed)[0] for seed in range(3)])
    assert mean - half < 0 and first_layer_low[-1] == 0.0, "cut at 0, the least a share can be"


def test_past_six_lengths_the_table_shows_the_shortest_and_the_longest(tmp_path):
    many = [32 * 2**k for k in range(7)]
    sinks = {n: shares(n, 0) for n in many}
    fake_lm_run(tmp_path / "0", ["pe=rope", "seed=0"], dict.fromkeys(many, 9.0), sinks=sinks)
    configs = configurations(find_runs(tmp_path), ["pe", "seed"])
    text = sinks_table(configs)
    assert "| seeds | layer | L=32 | L=2048 |" in text
    assert f"| {uniform_reference(2048):.4f} |" in text
    assert "the shortest and the longest of the lengths (32, 64, 128, 256, 512, 1024, 2048)" in text


def test_compare_shows_the_sink_at_each_length(tmp_path):
    compare(sinks_study(tmp_path))
    rows = {row["run"]: row for row in read_csv(tmp_path / "comparison.csv")}
    for n in LENGTHS:
        assert float(rows["rope2"][f"test/sink@{n}"]) == pytest.approx(sum(shares(n, 2)) / 2)
    assert rows["alibi0"]["test/sink@32"] == ""


def test_each_length_is_compared_with_the_training_length_paired_by_seed(tmp_path):
    at_32, at_64, at_128 = (6.0, 6.3, 6.5), (5.92, 6.235, 6.43), (6.5, 6.2, 7.0)
    for seed in range(3):
        ppl = {32: at_32[seed], 64: at_64[seed], 128: at_128[seed]}
        fake_lm_run(tmp_path / f"alibi{seed}", ["pe=alibi", f"seed={seed}"], ppl)
        fake_lm_run(tmp_path / f"learned{seed}", ["pe=learned", f"seed={seed}"], ppl, bound=32)
    table = lengths_table(configurations(find_runs(tmp_path), ["pe", "seed"]))
    differences = table.split("From which length on")[1]
    assert "| pe | windows | trained on | L=64 | L=128 |" in differences
    # 64 − 32: −0.08, −0.065, −0.07, lower in every seed; the ratio from the mean log ratio
    logs = np.log(at_64) - np.log(at_32)
    p = stats.ttest_1samp(logs, 0.0).pvalue
    ratio = number(math.exp(logs.mean()))
    assert f"| alibi | non-overlapping | 32 | −0.072 ± 0.019 ×{ratio} [" in differences
    assert f"(paired by seed, n=3; Holm p = {min(1.0, 4 * p):.3f}): improves |" in differences
    row = next(line for line in differences.splitlines() if "| alibi | non-overlapping" in line)
    assert row.endswith("): tie |")  # 128 − 32: +0.5, −0.1, +0.5
    assert "| learned | non-overlapping | 32 | n/a | n/a |" in differences
    assert "Holm–Bonferroni over the 4 comparisons of this table." in differences


def test_with_a_baseline_each_configuration_is_compared_with_it_at_each_length(tmp_path):
    rope = {32: (6.0, 6.3, 6.5), 64: (7.0, 7.6, 7.9)}
    fox = {32: (5.9, 6.25, 6.38), 64: (5.8, 6.1, 6.3)}
    for seed in range(3):
        for name, ppl in (("rope", rope), ("fox", fox)):
            values = {length: found[seed] for length, found in ppl.items()}
            fake_lm_run(tmp_path / f"{name}{seed}", [f"pe={name}", f"seed={seed}"], values)
    configs = configurations(find_runs(tmp_path), ["pe", "seed"])
    assert "Against" not in lengths_table(configs)  # no baseline: no such table
    against = lengths_table(configs, "pe=rope").split("Against pe=rope")[1]
    assert "| pe | windows | L=32 | L=64 |" in against and "| rope |" not in against
    # fox − rope at 64, paired by seed: −1.2, −1.5, −1.6; Holm over 4 (2 lengths × 2 windows)
    gaps = np.array(fox[64]) - np.array(rope[64])
    half = stats.t.ppf(0.975, 2) * gaps.std(ddof=1) / math.sqrt(3)
    row = next(line for line in against.splitlines() if line.startswith("| fox | non-overlapping"))
    assert f"{number(gaps.mean())} ± {number(half)}".replace("-", "−") in row
    assert row.endswith("): ahead |")  # lower perplexity than the baseline's
    assert "Holm–Bonferroni over the 4 comparisons of this table." in against
    with pytest.raises(ConfigError, match="pe=t5 is none of the configurations"):
        lengths_table(configs, "pe=t5")
