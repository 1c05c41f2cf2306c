"""The synthetic tasks' data and system (attnlab.tasks.synthetic.data, attnlab.tasks.synthetic.system):
batch layouts and loss masking, buckets of lengths, evaluation sets fixed by their own seed,
scores counted by hand, and tiny models learning to copy. Cached decoding equals uncached
for every pe in test_lm_generation (decoder) and test_decoding (encoder-decoder)."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import evaluated, task_data

from attnlab.config.groups import ARCHITECTURE
from attnlab.config.options import variant
from attnlab.data.task import IGNORE
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture
from attnlab.runner.plan import Plan, build_datamodule, build_system
from attnlab.runner.train import train
from attnlab.tasks.synthetic.data import (
    Batches,
    Item,
    Specials,
    SyntheticData,
    TrainExamples,
    buckets,
    collate,
    eval_batches,
)
from attnlab.tasks.synthetic.system import (
    SyntheticSystem,
    answer_scores,
    bucket_metrics,
    decoded_answers,
)

I = IGNORE  # noqa: E741
SPECIALS = Specials.after(10, bos=False)  # PAD 10, SEP 11, EOS 12
PAIRS = [Item([1, 2], [3], 2, 0), Item([4], [5, 6], 1, 1), Item([7], [8], 1, 0)]


def test_a_decoder_reads_input_sep_output_and_is_scored_on_the_output_and_its_end():
    batch = collate(PAIRS, SPECIALS, "decoder")
    assert batch["tokens"].tolist() == [[1, 2, 11, 3, 12], [4, 11, 5, 6, 12], [7, 11, 8, 12, 10]]
    assert batch["targets"].tolist() == [[I, I, 3, 12], [I, 5, 6, 12], [I, 8, 12, I]]
    assert batch["prompt"].tolist() == [3, 2, 2]
    assert batch["answers"].tolist() == [[3, 12, I], [5, 6, 12], [8, 12, I]]
    assert batch["buckets"].tolist() == [0, 1, 0]
    # the loss averages over exactly the answers' tokens
    assert (batch["targets"] != I).sum() == (batch["answers"] != I).sum()


def test_an_encoder_decoder_reads_the_input_and_sep_output():
    batch = collate(PAIRS, SPECIALS, "encoder_decoder")
    assert batch["src"].tolist() == [[1, 2], [4, 10], [7, 10]]
    assert batch["tgt"].tolist() == [[11, 3, 10], [11, 5, 6], [11, 8, 10]]
    assert batch["answers"].tolist() == [[3, 12, I], [5, 6, 12], [8, 12, I]]


def test_a_bos_opens_every_sequence_and_the_answers_keep_their_tokens():
    """Kazemnejad et al.'s layout: BOS (13, after the other specials) at position 0 of the
    decoder's sequence and of the encoder's input; the same targets, one position on."""
    bos = Specials.after(10, bos=True)
    assert (bos.count, bos.lead, SPECIALS.count, SPECIALS.lead) == (4, [13], 3, [])
    plain, batch = collate(PAIRS, SPECIALS, "decoder"), collate(PAIRS, bos, "decoder")
    assert batch["tokens"].tolist() == [[13, *row] for row in plain["tokens"].tolist()]
    assert batch["targets"].tolist() == [[I, *row] for row in plain["targets"].tolist()]
    assert batch["prompt"].tolist() == [4, 3, 3]
    assert torch.equal(batch["answers"], plain["answers"])
    pair = collate(PAIRS, bos, "encoder_decoder")
    assert pair["src"].tolist() == [[13, 1, 2], [13, 4, 10], [13, 7, 10]]
    assert torch.equal(pair["tgt"], collate(PAIRS, SPECIALS, "encoder_decoder")["tgt"])


def test_a_run_recorded_before_the_bos_option_has_none():
    assert Specials(pad=10, sep=11, eos=12) == SPECIALS


def test_given_output_tokens_are_fed_and_not_scored_and_the_end_is_given_with_them():
    item = Item([1, 2], [3, 4, 5], 2, 0, [True, False, True])
    batch = collate([item], SPECIALS, "decoder")
    assert batch["answers"].tolist() == [[I, 4, I, I]]
    assert batch["forced"].tolist() == [[3, I, 5, 12]]
    assert batch["tokens"].tolist() == [[1, 2, 11, 3, 4, 5, 12]]
    assert batch["targets"].tolist() == [[I, I, I, 4, I, I]]
    pair = collate([item], SPECIALS, "encoder_decoder")
    assert pair["tgt"].tolist() == [[11, 3, 4, 5]] and pair["answers"].tolist() == [[I, 4, I, I]]
    plain = collate([item._replace(given=None)], SPECIALS, "decoder")
    assert plain["answers"].tolist() == [[3, 4, 5, 12]] and (plain["forced"] == I).all()


@pytest.mark.parametrize("bos", [False, True], ids=["", "bos"])
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_decoding_feeds_the_given_tokens_and_picks_the_rest_greedily(make_config, arch, bos):
    torch.manual_seed(0)
    cfg = make_config(["task=copy", "model=tiny", "model.dropout=0.0"])
    architecture = Architecture.from_config({g: cfg[g] for g in ARCHITECTURE})
    specials = Specials.after(10, bos)
    net = SyntheticSystem.network(architecture, vocab_size=10 + specials.count, arch=arch).eval()
    given = [True, False, True, False]
    items = [Item([1, 2, 3], [4, 5, 6, 7], 3, 0, given), Item([3, 2, 1], [9, 8, 7, 6], 3, 0, given)]
    batch = collate(items, specials, arch)
    decoded = decoded_answers(net, batch, specials)
    src = torch.tensor([[*specials.lead, *item.input] for item in items])
    fed = src.new_full((2, 1), specials.sep)
    if arch == "decoder":
        fed = torch.cat((src, fed), 1)
    with torch.no_grad():  # without the cache, one step after another
        for step, forced in enumerate(batch["forced"].unbind(1)):
            logits = net(fed) if arch == "decoder" else net(src, src == specials.pad, fed)
            free = logits[:, -1].argmax(-1)
            assert (decoded[:, step] == torch.where(forced == I, free, forced)).all()
            fed = torch.cat((fed, decoded[:, step : step + 1]), 1)
    assert decoded[:, 0].tolist() == [4, 9] and decoded[:, 4].tolist() == [12, 12]


def test_answers_are_scored_position_by_position_with_the_end_included():
    answers = torch.tensor([[3, 12, I], [5, 6, 12], [8, 12, I], [8, 12, I]])
    decoded = torch.tensor([[3, 12, 7], [5, 7, 12], [12, 12, 12], [8, 8, 12]])
    exact, right, scored = answer_scores(decoded, answers)
    assert exact.tolist() == [True, False, False, False]  # late or early ends are wrong
    assert right.tolist() == [2, 2, 1, 1]
    assert scored.tolist() == [2, 3, 2, 2]


def test_metrics_by_bucket_are_the_hand_counted_ratios():
    # examples, exact, right tokens, tokens, nll
    tallies = torch.tensor([[2, 1, 3, 4, 2.0], [1, 0, 1, 3, 3.0], [0, 0, 0, 0, 0.0]])
    metrics = bucket_metrics(tallies.double(), [20, 40, 60])
    assert metrics == pytest.approx(
        {"loss": 5 / 7, "acc": 1 / 3, "token_acc": 4 / 7, "acc@20": 1 / 2,
         "token_acc@20": 3 / 4, "acc@40": 0.0, "token_acc@40": 1 / 3}
    )  # fmt: skip
    assert "acc@60" not in metrics  # a bucket with nothing scored is left out, not zero
    assert bucket_metrics(tallies.double(), None).keys() == {"loss", "acc", "token_acc"}


@pytest.mark.parametrize(
    ("first", "width", "longest", "expected"),
    [
        (1, 20, 80, [(1, 20), (21, 40), (41, 60), (61, 80)]),
        (1, 30, 80, [(1, 30), (31, 60), (61, 80)]),
        (16, 64, 256, [(16, 64), (65, 128), (129, 192), (193, 256)]),
        (5, 20, 20, [(5, 20)]),
    ],
)
def test_test_lengths_fall_into_buckets_named_by_their_longest(first, width, longest, expected):
    assert [(b.start, b.stop - 1) for b in buckets(first, width, longest)] == expected


def data(**options) -> SyntheticData:
    """copy's data from its YAML, trained at lengths 1..20, with small evaluation sets."""
    return task_data("copy", **{"train_max_len": 20, "val_size": 16, "test_size": 8, **options})


def test_evaluation_sets_depend_on_the_test_seed_alone():
    one, other = data(seed=1), data(seed=2)
    assert one.eval_sets == other.eval_sets
    assert data(test_seed=1).eval_sets["test"] != one.eval_sets["test"]
    test = one.eval_sets["test"]
    assert [item.bucket for item in test] == [b for b in range(4) for _ in range(8)]
    for item in test:
        lengths = one.test_buckets[item.bucket]
        assert item.length in lengths and len(item.input) == item.length
        assert item.output == item.input  # copy
    assert all(1 <= item.length <= 20 for item in one.eval_sets["valid"])
    assert one.bucket_ends("test") == [20, 40, 60, 80] and one.bucket_ends("valid") == [20]
    assert one.max_seq_len == max(2 * i.length + 1 for i in test)
    opened = data(bos=True)
    assert opened.max_seq_len == one.max_seq_len + 1
    assert (opened.model_kwargs()["vocab_size"], one.model_kwargs()["vocab_size"]) == (14, 13)


def test_a_training_example_is_the_same_whenever_it_is_asked_for():
    generator = data().generator
    examples = TrainExamples(generator, range(3, 9), 100, seed=5)
    again = TrainExamples(generator, range(3, 9), 100, seed=5)
    first = [examples[i] for i in range(100)]
    assert [again[i] for i in reversed(range(100))] == first[::-1]
    assert {item.length for item in first} == set(range(3, 9))
    assert [TrainExamples(generator, range(3, 9), 100, seed=6)[i] for i in range(100)] != first


def test_an_evaluation_batch_holds_one_input_length_and_every_example_once():
    items = data(test_size=40).eval_sets["test"]
    batches = eval_batches(items, 16)
    assert sorted(p for b in batches for p in b.tolist()) == list(range(len(items)))
    for batch in batches:
        assert 1 <= len(batch) <= 16
        assert len({len(items[p].input) for p in batch}) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"arch": "decoder_only"}, "task.arch='decoder_only' is not one of"),
        (
            {"train_min_len": 0},
            "train_min_len=0 must be an integer of at least 1, the shortest example Copy",
        ),
        ({"train_max_len": 30, "test_max_len": 20}, "task.data.test_max_len=20 must be"),
        ({"bucket": 0}, "task.data.bucket=0 must be a positive integer"),
        ({"bos": "yes"}, "option bos='yes' must be true or false"),
    ],
)
def test_bad_settings_are_one_sentence(options, message):
    with pytest.raises(ConfigError, match=message):
        data(**options)


def test_the_shared_defaults_alone_are_no_task():
    with pytest.raises(ConfigError, match="generator is not set: choose a task"):
        task_data("copy", generator=None)


def test_a_passkey_shorter_than_its_key_is_refused():
    passkey = {**variant("task", "passkey")["data"]["generator"], "key_digits": 5}
    with pytest.raises(
        ConfigError,
        match="train_min_len=1 must be an integer of at least 7, the shortest example Passkey",
    ):
        task_data("copy", generator=passkey)  # copy's lengths: from 1


def validation_accuracy(system, data) -> float:
    items = data.eval_sets["valid"]
    dataset = Batches(items, data.specials, data.arch)
    exact = []
    for positions in eval_batches(items, 256):
        batch = dataset[positions.tolist()]
        found, _, _ = answer_scores(
            decoded_answers(system.net, batch, data.specials), batch["answers"]
        )
        exact += found.tolist()
    return sum(exact) / len(exact)


@pytest.mark.parametrize(
    ("arch", "steps", "bos"),
    [
        ("decoder", 600, False),
        pytest.param("encoder_decoder", 1000, False, marks=pytest.mark.slow),
        pytest.param("decoder", 600, True, marks=pytest.mark.slow),
    ],
)
def test_a_tiny_model_learns_to_copy_at_its_training_lengths(make_config, arch, steps, bos):
    cfg = make_config(["task=copy", "model=tiny", "pe=learned", "model.dropout=0.0",
                       f"task.arch={arch}", f"task.data.bos={bos}", "task.data.train_max_len=6",
                       "task.data.generator.alphabet=8", "task.data.batch_size=32"])  # fmt: skip
    torch.manual_seed(0)
    data = build_datamodule(cfg)
    system = build_system(Plan.from_config(cfg), data)
    assert validation_accuracy(system, data) < 0.05
    optimizer = torch.optim.AdamW(system.parameters(), lr=3e-3, weight_decay=0.0)
    batches = itertools.cycle(data.train_dataloader())
    for batch in itertools.islice(batches, steps):
        loss = system.token_nll(batch).sum() / (batch["answers"] != IGNORE).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    system.eval()
    assert validation_accuracy(system, data) > 0.9


@pytest.mark.slow
def test_eval_py_scores_a_trained_checkpoint_as_its_test_did_and_at_longer_lengths(
    make_config, tmp_path
):
    overrides = ["task=copy", "model=tiny", "pe=alibi", "task.data.train_max_len=4",
                 "task.data.test_max_len=8", "task.data.bucket=4", "task.data.train_size=64",
                 "task.data.val_size=16", "task.data.test_size=8", "trainer.max_steps=4",
                 "trainer.max_epochs=-1", "trainer.check_val_every_n_epoch=null",
                 "trainer.val_check_interval=2"]  # fmt: skip
    tested = train(make_config(overrides))
    (best,) = (tmp_path / "checkpoints").glob("step_*.ckpt")
    scored = evaluated(best, tmp_path / "eval")
    assert {k: v for k, v in tested.items() if k.startswith("test/")} == scored
    assert {"test/acc@4", "test/acc@8"} <= scored.keys()
    longer = evaluated(best, tmp_path / "longer", "task.data.test_max_len=12")
    assert longer["test/examples"] == 3 * 8
    for name in ("acc@4", "acc@8", "token_acc@4", "token_acc@8"):  # the same fixed examples
        assert longer[f"test/{name}"] == scored[f"test/{name}"]
    assert 0 <= longer["test/token_acc@12"] <= 1
