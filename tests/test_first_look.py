"""`make train`, the first look: the position probe with no encoding and with sinusoidal
positions, which the Makefile announces with its prediction."""

from __future__ import annotations

import csv
import re
import subprocess
import sys

import pytest
from helpers import ROOT, compose_config
from hydra.core.hydra_config import HydraConfig

from attnlab.studies.probe import chance_bound


def make_train_command() -> list[str]:
    """The train.py arguments `make train` runs, read from the Makefile."""
    recipe = (ROOT / "Makefile").read_text().split("\ntrain:", 1)[1].split("\n\n", 1)[0]
    (line,) = [line for line in recipe.splitlines() if "train.py" in line]
    return line.split("train.py", 1)[1].split()


def test_make_train_sweeps_the_probe_for_two_encodings_on_the_tiny_model(tmp_path):
    args = make_train_command()
    assert args[:2] == ["-m", "experiment=first_look"]
    cfg = compose_config(["experiment=first_look"], tmp_path)
    assert (cfg.task.name, cfg.model.name) == ("probe", "tiny")
    assert HydraConfig.get().sweeper.params == {"pe": "none,sinusoidal"}


def test_the_makefile_announces_the_probes_bound_that_no_encoding_sits_at():
    recipe = (ROOT / "Makefile").read_text().split("\ntrain:", 1)[1].split("\n\n", 1)[0]
    bound = chance_bound(range(1, 17))  # task=probe's lengths, 1..16
    assert f"({bound:.3f})" in recipe and "about 30 s" in recipe


@pytest.mark.slow
def test_make_train_finds_what_it_predicts(tmp_path):
    """No encoding at the bound exactly, sinusoidal positions above 0.9: the first look's
    claim, from the sweep's own comparison."""
    done = subprocess.run(
        [sys.executable, "train.py", *make_train_command(), f"hydra.sweep.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with (tmp_path / "comparison.csv").open() as file:
        best = {row["pe"]: float(row["best"]) for row in csv.DictReader(file)}
    assert best["none"] == pytest.approx(chance_bound(range(1, 17)), abs=1e-4)
    assert best["sinusoidal"] > 0.9
    assert re.search(r"\| sinusoidal \| completed \|", done.stdout)
