"""The seed article's claim (Su 2022, kexue.fm/archives/9105), checked on the model itself.

With n identical tokens and no markers, a PE that only changes pre-softmax scores keeps the
rows of softmax attention stochastic, so every position gets the same output in every
layer: the model cannot tell positions apart. Absolute PEs, markers and normalizers whose
rows do not sum to 1 (nor to another number fixed whatever the scores, as differential
attention's 1 − λ) break the symmetry.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import SHAPE, every_combination, refused_unless
from omegaconf import DictConfig

from attnlab.config.build import build
from attnlab.config.options import causal_only, options, variant
from attnlab.errors import ConfigError
from attnlab.runner.plan import Plan, build_datamodule, build_system
from attnlab.studies.probe import chance_bound, predict
from attnlab.tasks.probe.data import ZERO, probe_example

# q·k must vary visibly with position for a difference to show: a larger init than training uses.
WIDE_INIT = ["model=tiny", "model.init_std=0.3", "model.dropout=0.0"]
SCORE_ONLY_PES = ["none", "rope", "t5", "alibi", "xl", "deberta"]
# rows that sum to 1, or to another number whatever the scores (differential's 1 − λ): over
# identical values every position gets the same output
FIXED_ROW_SUMS = [
    n
    for n in options("norm")
    if build(
        variant("norm", n), shape=replace(SHAPE, causal=bool(causal_only(n, "norm")))
    ).fixed_row_sums
]
# softpick's rows sum to 1 (less an ε/i) when every score is positive and to less where some
# are not: whether a configuration tells positions apart depends on the scores' signs, which
# the prediction's one question, do rows sum to 1, does not capture (left out here)
SIGN_DEPENDENT = ["softpick"]


def position_spread(make_config, overrides: list[str], perturb_pe: bool = False) -> float:
    return spread_of(make_config([*WIDE_INIT, *overrides]), perturb_pe)


def spread_of(cfg: DictConfig, perturb_pe: bool = False) -> float:
    """Largest difference between the encoder outputs of the scored positions.

    perturb_pe moves the PE's parameters away from their init, as training would (URPE
    starts at C = 1, where it equals its base PE exactly)."""
    torch.manual_seed(0)
    datamodule = build_datamodule(cfg)
    system = build_system(Plan.from_config(cfg), datamodule).eval().double()
    if perturb_pe:
        with torch.no_grad():
            for param in system.net.stack.parts.pe.parameters():
                param.add_(torch.randn_like(param) * 0.5)
    tokens, targets = probe_example(12, cfg.task.markers)
    with torch.no_grad():
        hidden = system.net.hidden(tokens[None], None)[0]
    hidden = hidden[(targets >= 0) & (tokens == ZERO)]
    return (hidden - hidden[0]).abs().max().item()


@pytest.mark.parametrize(
    "pe,synthesizer,causal",
    every_combination(SCORE_ONLY_PES, options("synthesizer"), [False, True], strength=1),
)
def test_score_only_pes_and_synthesizers_give_identical_outputs_under_softmax(
    pe, synthesizer, causal, make_config
):
    spread = position_spread(
        make_config, [f"pe={pe}", f"synthesizer={synthesizer}", f"task.causal={causal}"]
    )
    assert spread < 1e-9


@pytest.mark.parametrize(
    "overrides",
    [
        ["pe=learned"],
        ["pe=sinusoidal"],
        ["pe=shaw"],
        ["pe=rope", "task.markers=true"],
        *[
            ["pe=rope", f"norm={norm}", f"task.causal={bool(causal_only(norm, 'norm'))}"]
            for norm in options("norm")
            if norm not in FIXED_ROW_SUMS
        ],
    ],
    ids=lambda overrides: " ".join(overrides),
)
def test_what_breaks_the_symmetry_gives_position_dependent_outputs(overrides, make_config):
    assert position_spread(make_config, overrides) > 1e-4


def test_urpe_breaks_the_symmetry_once_its_toeplitz_matrix_moves_from_one(make_config):
    assert position_spread(make_config, ["pe=urpe"]) < 1e-9  # C = 1: exactly its base
    assert position_spread(make_config, ["pe=urpe"], perturb_pe=True) > 1e-4


@pytest.mark.parametrize(
    "pe,norm,markers,causal",
    every_combination(
        options("pe"),
        [n for n in options("norm") if n not in SIGN_DEPENDENT],
        [False, True],
        [False, True],
        strength=1,
    ),
)
def test_the_studies_prediction_says_which_configurations_give_position_dependent_outputs(
    pe, norm, markers, causal, make_config
):
    overrides = [f"pe={pe}", f"norm={norm}", f"task.markers={markers}", f"task.causal={causal}"]
    cfg = make_config([*WIDE_INIT, *overrides])  # the init leaves pe, norm and synthesizer alone
    with refused_unless(causal, pe, norm):
        prediction = predict(cfg.pe, cfg.norm, cfg.synthesizer, markers, causal)
    if not causal and (causal_only(pe) or causal_only(norm, "norm")):
        return
    # "can tell positions apart" needs one instance, "cannot" must hold for every one: the
    # init, and the PE moved as training would (which can also silence a relu² layer, whose
    # weights are 0 wherever every score is negative: FIRE's perturbed biases do that)
    spread = max(spread_of(cfg, perturb_pe=moved) for moved in (False, True))
    if prediction.distinguishes:
        assert spread > 1e-4, prediction.why
    else:
        assert spread < 1e-9, prediction.why


@pytest.mark.parametrize(("lengths", "bound"), [(range(1, 2), 1.0), (range(1, 17), 16 / 136)])
def test_the_chance_bound_is_one_right_position_per_sequence(lengths, bound):
    assert chance_bound(lengths) == pytest.approx(bound)


def test_the_prediction_refuses_a_synthesizer_it_does_not_cover(make_config):
    cfg = make_config(["synthesizer=random"])
    with pytest.raises(ConfigError, match="covers synthesizer=dot only, not synthesizer=random"):
        predict(cfg.pe, cfg.norm, cfg.synthesizer, False, False)
