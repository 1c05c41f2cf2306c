"""A size that cannot fit is refused in one sentence before anything is allocated: the
network's parameters are estimated from networks of one and two layers on the meta device
and checked against the memory this machine has free, for training (train.py) and for a
model read back (an export's or a checkpoint's config)."""

from __future__ import annotations

import json

import pytest
from test_export import exported  # noqa: F401  (a fixture)

from attnlab.commands.cli import main
from attnlab.errors import ConfigError
from attnlab.memory import estimated_parameters
from attnlab.model.architecture import Architecture
from attnlab.runner import run
from attnlab.stored import CONFIG
from attnlab.tasks.probe.system import TaggerSystem

OVERSIZED = [  # (overrides, what the sentence names)
    (["model.d_model=32768"], r"model\.d_model=32768, .* make [\d,]+ parameters, and training"),
    (["model.n_layers=100000000"], r"model\.n_layers=100000000 make [\d,]+ parameters"),
    (["model.d_model=1000000000000"], r"model\.d_model=1000000000000, .* larger than any machine"),
    (["pe=learned", "pe.max_len=1000000000"], r"make [\d,]+ parameters.*pe's table"),
    (["task=multi30k", "model.n_decoder_layers=100000000"], r"n_decoder_layers=100000000 make"),
]


@pytest.mark.parametrize(("overrides", "sentence"), OVERSIZED)
def test_a_network_too_large_to_train_is_one_sentence_before_any_allocation(
    overrides, sentence, make_config
):
    with pytest.raises(ConfigError, match=sentence):
        run.Plan.from_config(make_config(overrides))


@pytest.mark.parametrize("overrides", [[], ["model=tiny", "model.n_layers=5"], ["pe=learned"]])
def test_the_estimate_is_the_count_of_the_network_built(overrides, make_config):
    architecture = make_config(overrides)  # the probe's tagger
    arguments = {"vocab_size": 8, "num_classes": 8, "causal": False}
    estimated = estimated_parameters(
        lambda arch: TaggerSystem.network(arch, **arguments), Architecture.from_config(architecture)
    )
    built = TaggerSystem.network(Architecture.from_config(architecture), **arguments)
    assert estimated == sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize(
    ("key", "value", "sentence"),
    [
        (
            "n_layers",
            100_000_000,
            r"model\.n_layers=100000000 make [\d,]+ parameters, and evaluating",
        ),
        ("d_model", 10**12, r"larger than any machine can index"),
    ],
)
def test_an_export_too_large_to_load_is_one_sentence(key, value, sentence, exported):  # noqa: F811
    _, out = exported
    config = json.loads((out / CONFIG).read_text())
    config["hyper_parameters"]["architecture"]["model"][key] = value
    (out / CONFIG).write_text(json.dumps(config))
    with pytest.raises(SystemExit, match=sentence):
        main(["generate", f"ckpt_path={out}", "prompt=A"])


DATA_OVERSIZED = [  # (overrides, what the sentence names)
    (
        ["experiment=length_generalization", "task=copy", "task.data.train_max_len=1000000000"],
        r"train_max_len=1000000000, .* symbols, which needs",
    ),
    (["task.data.train_size=10000000000"], r"train_size=10000000000 and the lengths .* needs"),
    (["task.data.max_len=100000000"], r"\(max_len=100000000, eval_max_len=100000000\) make"),
    (["task.data.eval_max_len=3000000"], r"eval_max_len=3000000\) make probe sets of 3,"),
]


@pytest.mark.parametrize(("overrides", "sentence"), DATA_OVERSIZED)
def test_data_sets_too_large_to_make_are_one_sentence_before_any_is_made(
    overrides, sentence, make_config
):
    with pytest.raises(ConfigError, match=sentence):
        run.build_datamodule(make_config(overrides))


@pytest.mark.parametrize("markers", [False, True])
def test_the_probes_estimate_counts_the_sequences_and_positions_it_makes(markers, make_config):
    data = run.build_datamodule(
        make_config([f"task.markers={str(markers).lower()}", "task.data.min_len=3",
                     "task.data.max_len=9", "task.data.eval_max_len=20", "task.data.train_size=500"])
    )  # fmt: skip
    data.setup()
    made = [*data.train_set, *data.val_set, *data.test_set]
    sequences, positions = data.extent()
    assert sequences == len(made)
    trained = sum(len(tokens) for tokens, _ in data.train_set)  # drawn: near its mean
    assert positions - sum(len(tokens) for tokens, _ in made) == pytest.approx(0, abs=trained / 20)
