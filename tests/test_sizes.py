"""A size that cannot fit is refused in one sentence before anything is allocated: the
network's parameters are counted on one network built on the meta device, each stack only
as deep as it must be to hold every kind of layer the full one has, and checked against
the memory this machine has free, for training (train.py) and for a model read back (an
export's or a checkpoint's config). That meta network is also the run's check of its
variants: before training, each variant is built once on the meta device and once for real."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from helpers import ROOT
from test_export import exported  # noqa: F401  (a fixture)
from torch import nn

from attnlab.commands.cli import main
from attnlab.config.options import options, variant
from attnlab.errors import ConfigError
from attnlab.memory import meta_network, parameters_of
from attnlab.model.architecture import Architecture, AttentionConfig, ModelConfig
from attnlab.model.transformer import Tagger
from attnlab.pe.sinusoidal import SinusoidalPE
from attnlab.runner.plan import Plan, build_datamodule, build_system
from attnlab.stored import CONFIG
from attnlab.systems import base

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
        Plan.from_config(make_config(overrides))


def planned_network(
    config, monkeypatch
) -> tuple[Callable[[Architecture], nn.Module], Architecture]:
    """The network a run of `config` is planned with (what `System.check_network` checks,
    with its stand-in vocabulary) and its architecture."""
    seen = []
    monkeypatch.setattr(base, "check_fits", lambda network, arch, _: seen.append((network, arch)))
    Plan.from_config(config)
    return seen[0]


def count_of_full_build(network: Callable[[Architecture], nn.Module], arch: Architecture) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in network(arch).parameters())


# a schedule of three kinds of later layers, one with an encoding of its own (shaw's tables
# are one a layer of the stack, whichever layers use them)
SCHEDULED_SHAW = ["pe=rope", "schedule=rnope_swa", "+pe@model.schedule.encodings.rel=shaw",
                  "model.schedule.pattern=[{pe: pe}, {pe: rel, window: 4}, {pe: nope}]",
                  "model.n_layers=7"]  # fmt: skip
COUNTED = [
    [],
    ["model=tiny", "model.n_layers=5"],
    ["model.n_layers=1"],
    ["pe=learned"],
    ["task=lm", "pe=learned", "model.tie_embeddings=false"],
    ["block=gau", "model.n_layers=4"],
    ["model=gau"],  # norm=relu2, 6 layers
    ["pe=shaw", "norm=differential", "synthesizer=mixture", "model.n_layers=4"],  # per layer
    ["pe=rope", "schedule=nope_every_4", "model.n_layers=9"],
    SCHEDULED_SHAW,
    ["task=multi30k", "model.n_layers=4", "model.n_decoder_layers=3"],  # one shared embedding
    ["task=multi30k", "block=gau", "pe=t5", "model.n_decoder_layers=5"],
    ["task=multi30k", "pe=rope", "schedule=irope", "model.n_layers=6"],
]


@pytest.mark.parametrize("overrides", COUNTED, ids=" ".join)
def test_the_count_is_that_of_the_network_built(overrides, make_config, monkeypatch):
    network, architecture = planned_network(make_config(overrides), monkeypatch)
    counted = parameters_of(meta_network(network, architecture), architecture.model)
    assert counted == count_of_full_build(network, architecture)


@pytest.mark.parametrize(
    ("overrides", "encodings"),
    [
        (["model.n_layers=12"], ["SinusoidalPE"] * 2),  # the first layer and a repeated one
        (["pe=rope", "schedule=nope_every_4", "model.n_layers=12"], ["RoPE"] * 3 + ["NoPE"]),
        (["pe=rope", "schedule=nope_every_4", "model.n_layers=3"], ["RoPE"] * 2),
        (SCHEDULED_SHAW, ["RoPE", "ShawPE", "NoPE", "RoPE"]),
    ],
)
def test_the_meta_network_holds_every_kind_of_layer_at_the_fewest_layers(
    overrides, encodings, make_config, monkeypatch
):
    network, architecture = planned_network(make_config(overrides), monkeypatch)
    [(stack, _)] = meta_network(network, architecture).stacks(architecture.model)
    assert [type(parts.pe).__name__ for parts in stack.layer_parts] == encodings


@pytest.mark.parametrize(
    ("group", "option"),
    [(group, option) for group in ("pe", "norm", "synthesizer") for option in options(group)],
)
def test_every_variants_parameters_for_each_layer_are_counted(group, option):
    nodes = {"pe": variant("pe", "none"), "norm": variant("norm", "softmax"),
             "synthesizer": variant("synthesizer", "dot"), group: variant(group, option)}  # fmt: skip
    model = ModelConfig.from_config(
        {**variant("model", "tiny"), "n_layers": 5}, variant("block", "standard")
    )
    architecture = Architecture(model, AttentionConfig(**nodes), {})

    def network(arch: Architecture) -> nn.Module:
        return Tagger(arch.model, arch.attention, 8, 8, causal=True)

    counted = parameters_of(meta_network(network, architecture), model)
    assert counted == count_of_full_build(network, architecture)


def test_a_parameter_the_layers_share_is_counted_once(make_config):
    architecture = Architecture.from_config(make_config(["model=tiny", "model.n_layers=5"]))

    def tied(arch: Architecture) -> nn.Module:
        net = Tagger(arch.model, arch.attention, 8, 8, causal=False)
        for block in net.stack.blocks:
            block.ff_in.weight = net.stack.blocks[0].ff_in.weight
        return net

    counted = parameters_of(meta_network(tied, architecture), architecture.model)
    assert counted == count_of_full_build(tied, architecture)


def test_a_run_builds_each_variant_once_on_the_meta_device_and_once_for_real(
    make_config, monkeypatch
):
    devices = []
    init = SinusoidalPE.__init__

    def counted(self, *args, **kwargs):
        devices.append(torch.get_default_device().type)
        init(self, *args, **kwargs)

    monkeypatch.setattr(SinusoidalPE, "__init__", counted)
    config = make_config([])  # pe=sinusoidal
    build_system(Plan.from_config(config), build_datamodule(config))
    assert devices == ["meta", "cpu"]


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
        build_datamodule(make_config(overrides))


@pytest.mark.parametrize("markers", [False, True])
def test_the_probes_estimate_counts_the_sequences_and_positions_it_makes(markers, make_config):
    data = build_datamodule(
        make_config([f"task.markers={str(markers).lower()}", "task.data.min_len=3",
                     "task.data.max_len=9", "task.data.eval_max_len=20", "task.data.train_size=500"])
    )  # fmt: skip
    data.setup()
    made = [*data.train_set, *data.val_set, *data.test_set]
    sequences, positions = data.extent()
    assert sequences == len(made)
    trained = sum(len(tokens) for tokens, _ in data.train_set)  # drawn: near its mean
    assert positions - sum(len(tokens) for tokens, _ in made) == pytest.approx(0, abs=trained / 20)


def test_a_pass_counts_the_mask_logits_and_hidden_states_the_network_makes(make_config):
    from attnlab.memory import forward_bytes
    from attnlab.model.transformer import DecoderLM, attention_mask

    architecture = Architecture.from_config(make_config(["task=lm", "model=tiny"]))
    net = DecoderLM(architecture.model, architecture.attention, vocab_size=11)
    batch, length = 3, 40
    positions = torch.arange(length)
    mask = attention_mask(positions, positions, None, causal=True)
    logits = net(torch.zeros(batch, length, dtype=torch.long))
    hidden = batch * length * architecture.model.d_model * 4  # one layer's input, fp32
    made = mask.numel() * mask.element_size() + logits.numel() * logits.element_size()
    assert forward_bytes(net, batch, length, training=False) == made + hidden
    layers = net.stack.n_layers
    trained = made + logits.numel() * 4 + layers * hidden  # the logits' gradient, every layer
    assert forward_bytes(net, batch, length, training=True) == trained


@pytest.mark.slow
def test_windows_too_long_to_train_or_evaluate_are_one_sentence_before_their_first_batch(
    tmp_path,
):
    """Before: the first training step's causal mask (810 GB) was the allocator's traceback,
    after the sanity check's minutes; a test length of 10^6 tokens the same at the test."""
    text = tmp_path / "text"
    text.mkdir()
    line = "the quick brown fox jumps over the lazy dog\n"
    for split, size in (("train", 1_000_000), ("valid", 10_000), ("test", 1_100_000)):
        (text / f"{split}.txt").write_text(line * (size // len(line)), encoding="utf-8")
    lm = ["task=lm", "model=tiny", "task.data.source=local", f"task.data.dir={text}",
          "task.data.tokenizer=char", f"paths.data_dir={tmp_path / 'cache'}",
          "extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]  # fmt: skip
    runs = {
        "training": (["task.data.block_size=900000"], "training on 16 sequences of 900,000"),
        "testing": (
            ["task.data.block_size=32", "task.data.eval_lengths=[32,1000000]",
             "trainer.max_steps=2", "task.system.samples=0"],
            "a pass over 1 sequence of 1,000,000",
        ),
    }  # fmt: skip
    for name, (overrides, sentence) in runs.items():
        result = subprocess.run(
            [sys.executable, "train.py", *lm, *overrides, f"hydra.run.dir={tmp_path / name}"],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode != 0 and "Traceback" not in result.stderr, name
        assert last.startswith(f"attnlab: {sentence} tokens (a "), last
        assert "GiB where this machine has" in last, last
