"""The benchmark scripts run end to end in smoke mode (tiny sizes, on the CPU), and only a
run at the documented settings writes BENCHMARKS.md."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, SHARED_DATA

sys.path.insert(0, str(ROOT / "benchmarks"))
from benchmarks_common import NOT_WRITING, documented, report

from attnlab.config.options import causal_only, options

TRACKED = ROOT / "BENCHMARKS.md"


def run_smoke(script: str, *arguments: str, tmp_path) -> subprocess.CompletedProcess:
    """Run a benchmark on a copy of BENCHMARKS.md; neither the copy nor the tracked file
    may change."""
    copy = tmp_path / "BENCHMARKS.md"
    shutil.copyfile(TRACKED, copy)
    before = TRACKED.read_bytes()
    result = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "ATTNLAB_BENCHMARKS_MD": str(copy)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert copy.read_bytes() == before and TRACKED.read_bytes() == before
    assert NOT_WRITING in result.stdout
    return result


def table_rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("| ")]


@pytest.mark.slow  # the speed benchmark compiles a model (about 20 s)
@pytest.mark.parametrize("what", ["check", "speed", "variants", "decode"])
def test_the_gpu_benchmarks_run_in_smoke_mode_on_the_cpu(what, tmp_path):
    result = run_smoke("gpu.py", what, "--smoke", "--repeats", "1", tmp_path=tmp_path)
    expected_rows = {"check": 6, "speed": 4, "variants": 2, "decode": 2}[what]
    assert len(table_rows(result.stdout)) >= expected_rows + 1  # the header, then the rows
    if what == "check":
        assert result.stdout.count("skipped on the CPU") == 6


@pytest.mark.slow
def test_the_attention_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_smoke("attention.py", "--smoke", tmp_path=tmp_path)
    labels = {row.split(" | ")[0].removeprefix("| ") for row in table_rows(result.stdout)}
    for pe in set(options("pe")) - {"none"}:  # a causal-only pe in a causal stack, marked so
        assert f"pe={pe}" + " (causal)" * (causal_only(pe) is not None) in labels
    assert "pe=cope (causal)" in labels
    assert "baseline (none, softmax, dot) (causal)" in labels  # what the causal rows divide by


def test_the_attention_benchmark_compares_the_term_path_with_the_plain_one(tmp_path):
    result = run_smoke("attention.py", "--smoke", "--term-path", "--rows", "xl", tmp_path=tmp_path)
    lines = [line for line in result.stdout.splitlines() if line.startswith("pe=")]
    assert len(lines) == 1 and lines[0].startswith("pe=xl ")
    assert "term path" in lines[0] and "plain" in lines[0] and "time" in lines[0]


@pytest.mark.slow
def test_the_attention_benchmark_at_other_sizes_leaves_benchmarks_md_alone(tmp_path):
    run_smoke("attention.py", "--lengths", "16", "--repeats", "1", tmp_path=tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    not (SHARED_DATA / "multi30k").is_dir(), reason="the shared Multi30k files are absent"
)
@pytest.mark.parametrize(
    "arguments", [["speed", "--smoke"], ["quality", "--smoke", "--only", "pe=rope norm=l2"]]
)
def test_the_translation_benchmarks_run_in_smoke_mode(arguments, tmp_path):
    result = run_smoke("translation.py", *arguments, tmp_path=tmp_path)
    assert len(table_rows(result.stdout)) >= 2


@pytest.mark.slow
@pytest.mark.skipif(
    not (SHARED_DATA / "tinyshakespeare").is_dir(), reason="the shared Tiny Shakespeare is absent"
)
@pytest.mark.parametrize("what", ["anchor", "speed"])
def test_the_lm_benchmarks_run_in_smoke_mode(what, tmp_path):
    result = run_smoke("lm.py", what, "--smoke", tmp_path=tmp_path)
    rows = table_rows(result.stdout)
    if what == "anchor":  # the seed's row, the mean's and nanoGPT's
        assert rows[1].startswith("| 0 | ") and rows[-1].startswith("| nanoGPT")
    else:  # from the same weights on the same batches the two loops train alike
        assert len(rows) == 4
        difference = re.search(r"\(difference ([\d.e+-]+)\)", result.stdout).group(1)
        assert float(difference) < 1e-4


@pytest.mark.slow
def test_the_causal_stack_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_smoke("causal.py", "--smoke", tmp_path=tmp_path)
    _header, row = table_rows(result.stdout)
    assert row.split(" | ")[1] == "eager"  # compiling is left to the documented run
    attnlab, baseline = (float(cell) for cell in row.split(" | ")[3:5])
    assert attnlab > 0 and baseline > 0  # both networks trained


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.slow
def test_the_dialogue_test_phase_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_smoke("dialogue.py", "--smoke", tmp_path=tmp_path)
    _header, row = table_rows(result.stdout)
    assert row.startswith("| 82 |")  # the pairs of two test batches of the Chit-Chat split


def make_rules() -> dict[str, tuple[str, str]]:
    """The Makefile's targets: (prerequisites, recipe) of each."""
    rule = re.compile(r"^([^\s:#=]+):([^#\n]*)[^\n]*\n((?:\t[^\n]*\n)*)", re.M)
    makefile = (ROOT / "Makefile").read_text()
    return {m[1]: (m[2].strip(), m[3]) for m in rule.finditer(makefile)}


def test_make_install_leaves_the_bench_extras_to_the_bench_targets():
    rules = make_rules()
    assert "-e '.[dev]'" in rules["$(VENV)/.installed"][1]
    assert rules["install-bench"][0] == "$(VENV)/.installed-bench"
    assert "-e '.[dev,bench]'" in rules["$(VENV)/.installed-bench"][1]
    needs = {target: rule[0] for target, rule in rules.items() if target.startswith("bench-")}
    assert len(needs) > 1 and set(needs.values()) == {"install-bench"}, needs


def test_without_a_gpu_the_benchmarks_say_they_need_one():
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", "check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1 and "needs a CUDA GPU" in result.stderr


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("what")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--smoke", action="store_true")
    return parser


@pytest.mark.parametrize(
    "arguments,expected",
    [
        (["check"], True),
        (["speed", "--lengths", "512", "2048"], True),  # the defaults, spelled out
        (["check", "--smoke"], False),
        (["check", "--lengths", "512"], False),
    ],
)
def test_only_the_default_settings_are_the_documented_ones(arguments, expected):
    p = parser()
    assert documented(p, p.parse_args(arguments), free=("what",)) == expected


def test_a_report_writes_its_section_only_at_the_documented_settings(tmp_path, monkeypatch, capsys):
    target = tmp_path / "BENCHMARKS.md"
    target.write_text("# Benchmarks\n\n<!-- x:start -->\nold\n<!-- x:end -->\n\ntail\n")
    monkeypatch.setenv("ATTNLAB_BENCHMARKS_MD", str(target))
    report("x", "smoke figures", False)
    assert "old" in target.read_text() and NOT_WRITING in capsys.readouterr().out
    report("x", "new figures", True)
    assert target.read_text() == (
        "# Benchmarks\n\n<!-- x:start -->\nnew figures\n<!-- x:end -->\n\ntail\n"
    )


@pytest.mark.slow
def test_the_disk_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_smoke("disk.py", "--smoke", tmp_path=tmp_path)
    rows = table_rows(result.stdout)[1:]  # after the header
    ratios = [float(row.rstrip(" |").rsplit("| ", 1)[1]) for row in rows]
    assert len(rows) == 4 and ratios[0] == 1.0 and max(ratios[1:]) < 1.0


@pytest.mark.slow
def test_the_extrapolation_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_smoke("extrapolation.py", "--smoke", tmp_path=tmp_path)
    rows = [row.split(" | ") for row in table_rows(result.stdout)[1:]]
    assert [row[0].strip("| ") for row in rows] == ["none", "t5", "xl"]
    losses = [float(row[3].strip(" |")) for row in rows]
    assert all(0 < loss < 10 for loss in losses)  # a window was scored by each


def test_the_extrapolation_benchmark_needs_none_for_its_ratios():
    done = subprocess.run(
        [sys.executable, "benchmarks/extrapolation.py", "--smoke", "--pe", "t5"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "--pe must include none" in done.stderr


def test_the_gpt2_benchmark_runs_in_smoke_mode_beside_nanogpts_model(tmp_path):
    result = run_smoke("gpt2.py", "--smoke", tmp_path=tmp_path)
    race, fsdp = result.stdout.split("### trainer=fsdp")
    rows = table_rows(race)[1:]
    labels = [row.split(" | ")[0].lstrip("| ") for row in rows]
    expected = ["attnlab pe=learned", "attnlab pe=rope", "attnlab pe=alibi", "attnlab pe=t5"]
    if (ROOT.parent / "shared" / "peers" / "nanogpt" / "model.py").is_file():
        expected.insert(1, "nanoGPT GPT")
    assert labels == expected and all("n/a" in row for row in rows)  # no MFU on a CPU
    unsharded, sharded = table_rows(fsdp)[1:]
    assert float(unsharded.split(" | ")[1]) > 0 and "needs a GPU" in sharded


@pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is None,
    reason="tokenizers, which the benchmark compares SentencePiece with, is not installed (the "
    "bench extra: make install-bench)",
)
def test_the_lm_data_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_smoke("lm_data.py", "--smoke", tmp_path=tmp_path)
    rows = table_rows(result.stdout)
    assert any(row.startswith("| attnlab tokenize |") for row in rows)
    assert any(row.startswith("| attnlab tokenize, tokenizer trained first |") for row in rows)
    assert any(row.startswith("| nanoGPT's prepare.py approach |") for row in rows)
    assert "a run of 5 steps trains at" in result.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("litdata") is None,
    reason="LitData is not installed (not one of attnlab's dependencies: see benchmarks/lm_litdata.py)",
)
def test_the_litdata_comparison_runs_in_smoke_mode(tmp_path):
    result = run_smoke("lm_litdata.py", "--smoke", tmp_path=tmp_path)
    rows = table_rows(result.stdout)[1:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == ["attnlab", "litdata"]
