"""The learning-rate schedules and weight-decay groups of attnlab.systems.optim."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import OPTIM

from attnlab.errors import ConfigError
from attnlab.systems.optim import lr_factor


def test_warmup_rises_linearly_to_the_peak():
    assert [lr_factor(s, 4, 100, "cosine") for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_cosine_and_linear_decay_from_the_peak_to_the_floor():
    assert lr_factor(10, 10, 110, "cosine") == pytest.approx(1.0)
    assert lr_factor(60, 10, 110, "cosine") == pytest.approx(0.5)
    assert lr_factor(110, 10, 110, "cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(60, 10, 110, "linear") == pytest.approx(0.5)
    assert lr_factor(500, 10, 110, "linear") == pytest.approx(0.0)


def test_inverse_square_root_after_warmup():
    assert lr_factor(399, 100, 10**6, "inverse_sqrt") == pytest.approx(math.sqrt(100 / 400))
    assert lr_factor(50, 0, 10**6, "constant") == 1.0


def test_weight_decay_applies_to_matrices_only_and_bad_schedules_are_refused():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    groups = replace(OPTIM, weight_decay=0.1).configure(model, 10)["optimizer"].param_groups
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model[0].weight)}
    with pytest.raises(ConfigError, match=r"optim\.schedule='cosin'"):
        replace(OPTIM, schedule="cosin")
