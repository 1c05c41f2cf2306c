"""The permutation study's facts (attnlab.studies.permutation), asserted."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import SHAPE

from attnlab.config.build import build
from attnlab.config.options import causal_only, options, variant
from attnlab.studies.permutation import EXACT, PROPERTIES, configurations, measure, predict

CONFIGURATIONS = {label: (choice, causal) for label, choice, causal in configurations()}


@pytest.mark.parametrize("label", CONFIGURATIONS)
def test_every_measured_symmetry_is_the_predicted_one(label):
    choice, causal = CONFIGURATIONS[label]
    measured, predicted = measure(choice, causal), predict(choice, causal)
    for name in PROPERTIES:
        if measured[name] is not None:
            assert (measured[name] < EXACT) == predicted[name], (name, measured[name])


def holds(label: str) -> dict[str, bool | None]:
    measured = measure(*CONFIGURATIONS[label])
    return {name: None if value is None else value < EXACT for name, value in measured.items()}


@pytest.mark.parametrize("norm", options("norm"))
def test_without_positions_every_normalizer_keeps_the_set_symmetries(norm):
    found = holds(f"norm={norm}")
    causal = bool(causal_only(norm, "norm"))  # stick-breaking: causal, and reads the order
    assert found["keys"] == found["queries"] == found["stack"] == (not causal)
    assert not found["query bias"]  # b·k_j differs from key to key: a change in every row
    declared = build(
        variant("norm", norm), shape=replace(SHAPE, causal=causal)
    )  # checked against behaviour: test_norm
    assert found["key bias"] == declared.shift_invariant  # invariant to a per-row shift
    assert found["value bias"] == declared.rows_sum_to_one


def test_a_causal_mask_and_every_pe_break_the_stacks_equivariance():
    assert not any(holds("causal mask")[name] for name in ("keys", "queries", "stack"))
    for pe in options("pe"):
        if pe != "none":
            assert not holds(f"pe={pe}")["stack"], pe


def test_position_indexed_synthesizers_break_the_key_symmetry_and_random_the_query_one():
    for synthesizer in [s for s in options("synthesizer") if s != "dot"]:  # dot: the base row
        declared = build(variant("synthesizer", synthesizer), shape=SHAPE)
        assert holds(f"synthesizer={synthesizer}")["keys"] == (not declared.key_positions)
        assert holds(f"synthesizer={synthesizer}")["queries"] == (not declared.query_positions)
    assert holds("synthesizer=dense")["queries"]  # its rows come from the query token alone
    assert not holds("synthesizer=random")["queries"]


def test_a_synthesizer_that_reads_no_query_ignores_the_query_bias():
    assert holds("synthesizer=random")["query bias"] and holds("synthesizer=dense")["query bias"]
    assert not holds("synthesizer=random_vanilla")["query bias"]  # its dot-product component
