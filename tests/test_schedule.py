"""Hybrid stacks (`model.schedule`): a schedule of one encoding everywhere is that encoding's
plain stack, a window or chunk as long as the sequence is global attention, each layer gets
its encoding and span (checked against masks built by hand), cached decoding equals the full
pass, the presets compose from the command line, and a wrong schedule is one sentence."""

from __future__ import annotations

import pytest
import torch
from helpers import compose_config, decoded_one_at_a_time
from test_combinations import attention, tiny, tokens

from attnlab.config.build import to_dict
from attnlab.config.options import options, variant
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture
from attnlab.model.schedule import LayerPlan
from attnlab.model.transformer import DecoderLM

VOCAB = 11


def schedule(*layers: dict, **encodings: str) -> dict:
    return {
        "pattern": [{"pe": "pe", "window": None, "chunk": None, **layer} for layer in layers],
        "encodings": {name: variant("pe", option) for name, option in encodings.items()},
    }


def model(pe: str, plan: dict | None = None, seed: int = 0, **changes) -> DecoderLM:
    torch.manual_seed(seed)
    built = DecoderLM(
        tiny(init_std=0.3, schedule=plan, **changes), attention(pe, "softmax", "dot"), VOCAB
    )
    return built.double().eval()


@pytest.mark.parametrize("pe", ["rope", "alibi", "t5", "fox"])
def test_one_encoding_everywhere_is_the_plain_stack(pe):
    x, plain = tokens(), model(pe)
    named = {"pe": "again"}  # the same encoding built again under its own name
    for plan in (schedule({}), schedule(named, {}, again=pe)):
        scheduled = model(pe, plan)
        missing = scheduled.load_state_dict(plain.state_dict(), strict=False).missing_keys
        assert all(key.startswith("stack.encodings.again.") for key in missing)
        for encoding in scheduled.stack.encodings.values():
            encoding.load_state_dict(plain.stack.parts.pe.state_dict())
        torch.testing.assert_close(scheduled(x), plain(x))


@pytest.mark.parametrize("span", [{"window": 64}, {"chunk": 64}, {"window": 9, "chunk": 9}])
def test_a_span_as_long_as_the_sequence_is_global_attention(span):
    x = tokens(length=9)
    torch.testing.assert_close(model("rope", schedule(span))(x), model("rope")(x))


def test_a_span_shorter_than_the_sequence_changes_the_output():
    x = tokens(length=9)
    assert not torch.allclose(model("rope", schedule({"window": 3}))(x), model("rope")(x))


def test_each_layer_gets_its_encoding_and_span():
    plan = schedule({"window": 3}, {"pe": "nope", "chunk": 4}, nope="none")
    built = model("rope", plan, n_layers=4)
    stack = built.stack
    names = [type(parts.pe).__name__ for parts in stack.layer_parts]
    assert names == ["RoPE", "NoPE", "RoPE", "NoPE"]
    assert all(parts.norm is stack.parts.norm for parts in stack.layer_parts)
    pos = torch.arange(8)
    window = LayerPlan(window=3).span_mask(pos, pos)
    chunk = LayerPlan(chunk=4).span_mask(pos, pos)
    for i in range(8):
        for j in range(8):
            assert bool(window[i, j]) == (abs(i - j) < 3)
            assert bool(chunk[i, j]) == (i // 4 == j // 4)


def test_layers_see_only_their_span():
    """A token outside every span of the only layer cannot change a later output: with a
    window of 2 in one layer, position 5's output ignores the tokens before 4."""
    built = model("rope", schedule({"window": 2}), n_layers=1)
    x = tokens(batch=1, length=6)
    changed = x.clone()
    changed[0, :4] = (x[0, :4] % (VOCAB - 1)) + 1
    torch.testing.assert_close(built(changed)[0, 5], built(x)[0, 5])
    assert not torch.allclose(built(changed)[0, 3], built(x)[0, 3])


@pytest.mark.parametrize("pe", ["rope", "alibi", "fox"])
def test_decoding_one_token_at_a_time_is_the_full_pass(pe):
    plan = schedule({"window": 3}, {"pe": "nope"}, {"chunk": 4}, nope="none")
    built = model(pe, plan, n_layers=3)
    x = tokens(length=9)
    torch.testing.assert_close(decoded_one_at_a_time(built, x), built(x))


@pytest.mark.parametrize("preset", options("schedule"))
def test_the_presets_compose_and_build(preset, tmp_path):
    cfg = compose_config([f"schedule={preset}", "pe=rope", "task.causal=true"], tmp_path)
    architecture = Architecture.from_config(cfg)
    plans = architecture.model.layer_schedule
    assert plans is not None and [p.pe for p in plans.pattern] == ["pe", "pe", "pe", "nope"]
    assert to_dict(cfg.model.schedule)["encodings"]["nope"]["_target_"] == "attnlab.pe.none.NoPE"


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"pattern": []}, "must be a list of layers"),
        (schedule({"pe": "other"}), "names no encoding of the schedule"),
        (schedule({"window": 0}), "must be a positive number of tokens"),
        (schedule({"stride": 2}), "has no key stride"),
        ({**schedule({}), "period": 4}, "model.schedule has no key period"),
    ],
)
def test_a_wrong_schedule_is_one_sentence(plan, message):
    with pytest.raises(ConfigError, match=message):
        tiny(schedule=plan)


def test_an_encoding_that_is_no_positional_encoding_is_one_sentence():
    plan = schedule({}, {"pe": "other"})
    plan["encodings"]["other"] = variant("norm", "softmax")
    with pytest.raises(ConfigError, match=r"attnlab\.norm\.softmax\.Softmax"):
        model("rope", plan)


def test_a_schedule_that_cannot_mean_what_it_says_is_refused():
    with pytest.raises(ConfigError, match="none of the 2 layers the run's pe"):
        model("rope", schedule({"pe": "nope"}, nope="none"))
    with pytest.raises(ConfigError, match="adds positions to the token embeddings"):
        model("sinusoidal", schedule({}, {"pe": "nope"}, nope="none"))
