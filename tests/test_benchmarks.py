"""The GPU benchmark script runs end to end (at tiny sizes, on the CPU, writing nothing)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow  # the speed benchmark compiles a model (about 20 s)


@pytest.mark.parametrize("what", ["speed", "variants", "decode"])
def test_the_gpu_benchmarks_run_in_smoke_mode(what):
    before = (ROOT / "BENCHMARKS.md").read_text()
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", what, "--smoke", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    expected_rows = {"speed": 4, "variants": 2, "decode": 2}[what]
    assert len(table) >= expected_rows + 1  # the header, then the rows
    assert (ROOT / "BENCHMARKS.md").read_text() == before


def test_without_a_gpu_the_benchmarks_say_they_need_one():
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", "check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1 and "needs a CUDA GPU" in result.stderr
