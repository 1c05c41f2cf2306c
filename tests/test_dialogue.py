"""Dialogue: conversations cleaned, split and turned into (context, response) pairs; its
scores against hand-computed values; every source end to end."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import datasets
import pytest
from helpers import SHARED_DATA, task_data

from attnlab.errors import ConfigError
from attnlab.metrics import dialogue_scores, distinct, signatures
from attnlab.runner.train import train
from attnlab.tasks.seq2seq import dialogue
from attnlab.tasks.seq2seq.dialogue import (
    DialogueDataModule,
    clean,
    examples,
    normalize,
    split_conversations,
)

DAILYDIALOG = SHARED_DATA / "dailydialog"
needs_dailydialog = pytest.mark.skipif(
    not DAILYDIALOG.is_dir(), reason=f"the shared DailyDialog files are not at {DAILYDIALOG}"
)
SMALL = {"vocab_size": 120, "pairs": 2000, "max_tokens": 512, "max_len": 24}


def dialogue_data(cache_dir: str, **settings) -> DialogueDataModule:
    """chitchat's data from its YAML with `settings` over it."""
    return task_data("chitchat", Path(cache_dir), **settings)


TINY_RUN = [
    "model=tiny", "task.data.tokenizer.vocab_size=500", "task.data.tokenizer.pairs=5000",
    "task.data.batching.train_size=64", "task.system.val_generate=8",
]  # fmt: skip


def conversation(n: int, turns: int) -> tuple[str, ...]:
    return tuple(f"turn {t} of talk {n} , right ?" for t in range(turns))


def write_dialogues(directory: Path, split: str, lines: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"dialogues.{split}.txt"
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def dialogue_line(turns: tuple[str, ...]) -> str:
    return " ".join(f"{turn} __eou__" for turn in turns)


# --- cleaning, splitting, examples ------------------------------------------------------------


def test_normalization_collapses_space_and_drops_it_before_punctuation():
    assert (
        normalize("  Say ,  Jim , how about a beer ?  Fine . ")
        == "Say, Jim, how about a beer? Fine."
    )
    assert normalize("it's 5 % off (really )") == "it's 5% off (really)"


def test_cleaning_drops_empty_turns_short_conversations_and_duplicates(caplog):
    talks = [
        conversation(0, 4),
        ("hi", "", "  ", "bye"),
        ("alone",),
        conversation(0, 4),
        ("a", "b", "c"),
    ]
    with caplog.at_level(logging.INFO):
        kept = clean(talks, min_turns=3)
    assert kept == [tuple(map(normalize, conversation(0, 4))), ("a", "b", "c")]
    assert (
        "dropped 2 empty turns, 2 conversations of fewer than 3 turns and 1 duplicates"
        in caplog.text
    )


def test_splits_are_by_conversation_disjoint_and_deterministic():
    talks = [conversation(n, 3) for n in range(200)]
    first = split_conversations(talks, 0.1, 0.05, seed=7)
    assert [len(first[s]) for s in ("train", "valid", "test")] == [170, 20, 10]
    sets = [set(first[split]) for split in ("train", "valid", "test")]
    assert set.union(*sets) == set(talks) and sum(map(len, sets)) == len(talks), "disjoint"
    assert split_conversations(talks, 0.1, 0.05, seed=7) == first
    assert split_conversations(talks, 0.1, 0.05, seed=8)["valid"] != first["valid"]


def test_each_response_gets_the_turns_before_it_after_their_speakers_markers():
    talk = ("hello", "hi there", "how are you?", "fine.")
    assert list(examples(talk, context_turns=2)) == [
        ("<a> hello", "hi there"),
        ("<a> hello <b> hi there", "how are you?"),
        ("<b> hi there <a> how are you?", "fine."),
    ]


def test_no_conversation_is_in_two_splits_of_a_real_corpus(tmp_path):
    module = dialogue_data(source="chitchat", cache_dir=str(tmp_path), **SMALL)
    splits = [set(module.corpus.conversations[s]) for s in ("train", "valid", "test")]
    assert sum(map(len, splits)) == len(set.union(*splits)), "disjoint"
    assert len(splits[1]) == len(splits[2]) == 173 and len(module.corpus.examples["valid"]) > 1000


def test_long_contexts_keep_their_latest_tokens_and_markers_stay_whole(tmp_path):
    long_turn = " ".join(["blah"] * 60)
    lines = [dialogue_line((f"hello {n}", long_turn, f"bye {n}")) for n in range(100)]
    write_dialogues(tmp_path / "dd", "train", lines)
    module = dialogue_data(
        source="local", dir=str(tmp_path / "dd"), cache_dir=str(tmp_path / "cache"),
        **{**SMALL, "vocab_size": 40},
    )  # fmt: skip
    module.setup()
    tokenizer = module.tokenizers.src
    for marker in dialogue.SPEAKERS:  # one piece of its own (after a word-boundary piece)
        piece = tokenizer.processor.piece_to_id(marker)
        assert piece != tokenizer.unk_id and piece in tokenizer.encode(f"{marker} hello")
    batch = next(iter(module.train_dataloader()))
    longest = batch["src"][(batch["src"] != 0).sum(-1).argmax()]
    assert (longest != 0).sum() == SMALL["max_len"], "cut to max_len, EOS included"
    text = tokenizer.decode(longest)
    assert text.endswith("blah blah") and not text.startswith("<a> hello"), "the start is cut"


def test_local_files_with_all_three_splits_are_used_as_given(tmp_path, caplog):
    talks = [conversation(n, 3) for n in range(30)]
    for split, rows in (("train", talks[:20]), ("validation", talks[20:25]), ("test", talks[25:])):
        write_dialogues(tmp_path / "dd", split, [dialogue_line(t) for t in rows])
    with caplog.at_level(logging.INFO):
        module = dialogue_data(
            source="local", dir=str(tmp_path / "dd"), cache_dir=str(tmp_path / "c"), **SMALL
        )
    normalized = [tuple(map(normalize, t)) for t in talks]
    got = module.corpus.conversations
    assert (got["train"], got["valid"], got["test"]) == (
        normalized[:20],
        normalized[20:25],
        normalized[25:],
    )
    assert "its own train, validation and test splits, as given" in caplog.text
    assert "pooled" not in caplog.text


def test_a_test_conversation_that_repeats_a_training_one_is_dropped():
    talks = [conversation(n, 3) for n in range(4)]
    given = dialogue.given_splits(
        {"train": talks[:2], "valid": [talks[2]], "test": [talks[3], talks[0]]}, min_turns=3
    )
    assert given["test"] == [tuple(map(normalize, talks[3]))]


def test_local_files_without_a_test_split_are_pooled_and_resplit_with_a_warning(tmp_path, caplog):
    talks = [conversation(n, 3) for n in range(40)]
    write_dialogues(tmp_path / "dd", "train", [dialogue_line(t) for t in talks[:30]])
    write_dialogues(tmp_path / "dd", "validation", [dialogue_line(t) for t in talks[30:]])
    with caplog.at_level(logging.WARNING):
        module = dialogue_data(
            source="local", dir=str(tmp_path / "dd"), cache_dir=str(tmp_path / "c"), **SMALL
        )
    assert "has no test split: its 40 conversations are pooled and split" in caplog.text
    assert sum(len(c) for c in module.corpus.conversations.values()) == 40


def test_every_run_seed_gets_the_same_split_and_tokenizer(tmp_path):
    """A seed sweep varies initialization and batch order, not the data: task.data.data_seed
    draws the split, and runs of seeds 1 and 2 share their test set and tokenizer."""
    talks = [conversation(n, 3) for n in range(60)]
    write_dialogues(tmp_path / "dd", "train", [dialogue_line(t) for t in talks])
    common = {"source": "local", "dir": str(tmp_path / "dd"), "cache_dir": str(tmp_path / "c")}
    small = {**common, **SMALL, "vocab_size": 36}
    modules = [dialogue_data(seed=seed, **small) for seed in (1, 2)]
    assert modules[0].corpus.conversations == modules[1].corpus.conversations
    assert modules[0].tokenizers.src.key == modules[1].tokenizers.src.key
    other = dialogue_data(data_seed=1, **small)
    assert other.corpus.conversations["test"] != modules[0].corpus.conversations["test"]


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "sentence"),
    [
        ("Hi . __eou Hello ! __eou__", r"line 2 has '__eou' inside a turn: a misspelt __eou__"),
        ("Hi . eou__ Hello ! __eou__", r"line 2 has 'eou__' inside a turn"),
        ("Hi . __EOU__ Hello ! __eou__", r"line 2 has '__EOU' inside a turn"),
        ("Hi . __eou__ Hello !", r"line 2 ends with a turn without __eou__ \('Hello !'\)"),
    ],
)
def test_a_misspelt_end_of_turn_is_named_not_merged(line, sentence, tmp_path):
    path = write_dialogues(tmp_path, "train", [dialogue_line(("a", "b", "c")), line])
    with pytest.raises(ConfigError, match=rf"{path} {sentence}"):
        dialogue_data(source="local", dir=str(tmp_path), cache_dir=str(tmp_path / "c"))


def test_a_line_without_end_of_turn_names_the_file_and_line(tmp_path):
    path = write_dialogues(tmp_path, "train", [dialogue_line(("a", "b", "c")), "no turns here"])
    with pytest.raises(
        ConfigError, match=rf"{path} line 2 has no __eou__: .* fix or remove the line"
    ):
        dialogue_data(source="local", dir=str(tmp_path), cache_dir=str(tmp_path / "c"))


def test_invalid_utf8_names_the_file_and_line(tmp_path):
    path = write_dialogues(tmp_path, "train", [dialogue_line(("a", "b", "c"))])
    path.write_bytes(path.read_bytes() + b"caf\xe9 __eou__\n")
    with pytest.raises(ConfigError, match=rf"{path} line 2 is not valid UTF-8"):
        dialogue_data(source="local", dir=str(tmp_path), cache_dir=str(tmp_path / "c"))


@pytest.mark.parametrize(
    "options,message",
    [
        ({"dir": None}, "task.data.source=local needs a directory"),
        (
            {"dir": "missing"},
            r"has no dialogues.train.txt: pass task.data.dir=<directory of "
            r"DailyDialog's dialogues.train.txt \(and, optionally, dialogues.validation.txt and "
            r"dialogues.test.txt\): one dialogue a line, each turn ended by __eou__>$",
        ),
        ({"context_turns": 0}, r"task.data.context_turns=0 must be a positive integer"),
        ({"min_turns": 1}, r"task.data.min_turns=1 must be at least 2"),
        ({"valid_share": 0.7}, r"task.data.valid_share=0.7 must be a share"),
        ({"source": "reddit"}, r"task.data.source='reddit' is not one of: chitchat, local, hub"),
    ],
)
def test_impossible_settings_are_one_sentence(options, message, tmp_path):
    write_dialogues(tmp_path / "dd", "train", [dialogue_line(("a", "b", "c"))])
    settings = {"source": "local", "dir": str(tmp_path / "dd"), **options}
    if settings["dir"] == "missing":
        settings["dir"] = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=message):
        dialogue_data(cache_dir=str(tmp_path / "c"), **settings)


def test_an_empty_split_is_one_sentence(tmp_path):
    write_dialogues(tmp_path / "dd", "train", [dialogue_line(conversation(n, 3)) for n in range(8)])
    module = dialogue_data(
        source="local", dir=str(tmp_path / "dd"), cache_dir=str(tmp_path / "c"),
        valid_share=0.01, **{**SMALL, "vocab_size": 30},
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"the valid split .* holds no pair with text on both"):
        module.setup()


# --- scores ---------------------------------------------------------------------------------


def test_distinct_n_and_rouge_l_by_hand():
    hypotheses = ["the cat sat", "the cat ran fast"]
    references = ["a cat sat down", "the dog ran fast"]
    # unigrams: the cat sat the cat ran fast -> 5 distinct of 7
    # bigrams: (the cat) (cat sat) | (the cat) (cat ran) (ran fast) -> 4 distinct of 5
    assert distinct(hypotheses, 1) == pytest.approx(5 / 7)
    assert distinct(hypotheses, 2) == pytest.approx(4 / 5)
    # LCS: "cat sat" (2): P 2/3, R 2/4; "the ran fast" (3): P 3/4, R 3/4
    f1 = [2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4), 2 * (3 / 4) * (3 / 4) / (3 / 4 + 3 / 4)]
    scores = dialogue_scores(hypotheses, references)
    assert scores["rougeL"] == pytest.approx(100 * sum(f1) / 2)
    assert scores["distinct1"] == pytest.approx(5 / 7)
    assert scores["length_ratio"] == pytest.approx(7 / 8)


def test_bleu_1_and_4_are_sacrebleus_with_the_order_in_the_signature():
    scores = dialogue_scores(["the cat is on the mat"], ["the cat sat on the mat"])
    assert scores["bleu1"] == pytest.approx(100 * 5 / 6)  # 5 of 6 unigrams match, BP = 1
    p = [5 / 6, 3 / 5, 1 / 4, 0 / 3]
    assert scores["bleu4"] < scores["bleu1"] and math.isfinite(scores["bleu4"]) and p[3] == 0
    found = signatures("dialogue")
    assert found["bleu1"].endswith("|order:1") and found["bleu4"].endswith("|order:4")


# --- end to end -----------------------------------------------------------------------------


def test_fast_dev_run_on_chitchat(make_config):
    metrics = train(make_config(["task=chitchat", "debug=fast", *TINY_RUN]))
    assert math.isfinite(metrics["test/ppl"]) and 0 <= metrics["test/rougeL"] <= 100


@needs_dailydialog
def test_fast_dev_run_on_local_dailydialog(make_config):
    cfg = make_config(
        ["task=dailydialog", "task.data.source=local", f"task.data.dir={DAILYDIALOG}",
         "debug=fast", *TINY_RUN]
    )  # fmt: skip
    metrics = train(cfg)
    assert math.isfinite(metrics["test/ppl"]) and metrics["test/distinct1"] >= 0


def test_fast_dev_run_on_a_hub_dataset(make_config, monkeypatch):
    talks = [
        [f"hello {n} .", f"hi {n} !", f"how are you {n} ?", "fine , thanks ."] for n in range(60)
    ]
    hub = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"dialog": talks[:50]}),
         "validation": datasets.Dataset.from_dict({"dialog": talks[50:]})}
    )  # fmt: skip
    monkeypatch.setattr(dialogue, "load_hub", lambda *args: hub)
    cfg = make_config(
        ["task=dailydialog", "debug=fast", *TINY_RUN[:-2], "task.data.tokenizer.vocab_size=60"]
    )
    metrics = train(cfg)
    assert math.isfinite(metrics["test/ppl"])


@pytest.mark.slow
def test_a_tiny_model_learns_32_real_exchanges_by_heart(make_config):
    cfg = make_config(
        [
            "task=chitchat", *TINY_RUN[:3], "task.data.batching.train_size=32", "model.d_model=64",
            "model.dropout=0.0", "task.system.label_smoothing=0.0", "task.optim.lr=3e-3",
            "task.optim.warmup_steps=20", "task.optim.schedule=constant", "trainer.max_epochs=450",
            "+trainer.limit_val_batches=1", "trainer.check_val_every_n_epoch=100",
            "task.system.val_generate=4", "test=false",
        ]
    )  # fmt: skip
    metrics = train(cfg)  # 300 epochs ended mid-descent: 0.03-0.08 by thread count; 450: 1e-4
    assert metrics["train/loss"] < 0.05
