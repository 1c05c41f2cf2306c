"""SentencePiece tokenizers: trained once per corpus and setting, reused, fixed special ids."""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import SHARED_DATA

from attnlab.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    TokenizerSettings,
    build_once,
    from_serialized,
    load_or_train,
)
from attnlab.errors import ConfigError

TEXT = [
    "A man in an orange hat starring at something.",
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
    "A girl in karate uniform breaking a stick with a front kick.",
    "Ein Mädchen in einem Karateanzug bricht einen Stock mit einem Tritt.",
    "Five people wearing winter jackets and helmets stand in the snow, with snowmobiles.",
    "Fünf Leute in Winterjacken und mit Helmen stehen im Schnee mit Schneemobilen.",
    "People are fixing the roof of a house.",
    "Leute Reparieren das Dach eines Hauses.",
    "A man in light colored clothing photographs a group of men wearing dark suits and hats.",
    "Ein hell gekleideter Mann fotografiert eine Gruppe von Männern in dunklen Anzügen.",
    "A group of people standing in front of an igloo.",
    "Eine Gruppe von Menschen steht vor einem Iglu.",
    "A boy in a red uniform is attempting to avoid getting out at home plate.",
    "Ein Junge in einem roten Trikot versucht, die Home Base zu erreichen.",
]


def settings(**options) -> TokenizerSettings:
    """Translation's tokenizer settings (unigram, full coverage) with `options` over them."""
    return TokenizerSettings(
        **{"vocab_size": 120, "model_type": "unigram", "character_coverage": 1.0, **options}
    )


SMALL = settings()
CORPUS = {"corpus": {"source": "test", "name": "captions"}, "languages": ["de", "en"]}


class Counting:
    """The sentence source load_or_train calls only when it trains."""

    def __init__(self, sentences: list[str]) -> None:
        self.sentences, self.calls = sentences, 0

    def __call__(self) -> list[str]:
        self.calls += 1
        return self.sentences


def test_a_tokenizer_is_trained_once_then_reused(tmp_path):
    source = Counting(TEXT)
    first = load_or_train(tmp_path, CORPUS, SMALL, source, num_threads=2)
    stamp = first.model_file.stat().st_mtime_ns
    second = load_or_train(tmp_path, CORPUS, SMALL, source, num_threads=2)
    assert source.calls == 1
    assert second.model_file == first.model_file and second.model_file.stat().st_mtime_ns == stamp
    assert second.encode(TEXT[0]) == first.encode(TEXT[0])


@pytest.mark.parametrize(
    "settings,identity",
    [
        (settings(vocab_size=100), CORPUS),
        (settings(vocab_size=120, model_type="bpe"), CORPUS),
        (settings(vocab_size=120, character_coverage=0.99), CORPUS),
        (SMALL, {**CORPUS, "languages": ["en"]}),
        (SMALL, {**CORPUS, "corpus": {"source": "test", "name": "other"}}),
    ],
)
def test_a_changed_setting_or_corpus_trains_a_new_tokenizer(tmp_path, settings, identity):
    source = Counting(TEXT)
    base = load_or_train(tmp_path, CORPUS, SMALL, source, num_threads=2)
    changed = load_or_train(tmp_path, identity, settings, source, num_threads=2)
    assert source.calls == 2
    assert changed.model_file.parent != base.model_file.parent
    assert sorted(p.name for p in tmp_path.glob("*") if p.is_dir()) == sorted(
        [base.model_file.parent.name, changed.model_file.parent.name]
    )
    assert base.key != changed.key


def test_encode_then_decode_gives_back_real_text(tmp_path):
    tokenizer = load_or_train(tmp_path, CORPUS, SMALL, lambda: TEXT, num_threads=2)
    for line in TEXT:
        ids = tokenizer.encode(line)
        assert UNK_ID not in ids and tokenizer.decode(ids) == line
    assert [tokenizer.decode(ids) for ids in tokenizer.encode_batch(TEXT, 2)] == TEXT


def test_held_out_multi30k_sentences_round_trip(tmp_path):
    directory = SHARED_DATA / "multi30k"
    if not directory.is_dir():
        pytest.skip(f"{directory} is absent (real corpora live beside the repo, not in it)")
    lines = {
        split: (directory / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
        for split, lang in (("train", "en"), ("valid", "en"))
    }
    train = lines["train"][:2000]
    tokenizer = load_or_train(
        tmp_path, CORPUS, settings(vocab_size=500), lambda: train, num_threads=2
    )
    seen = set("".join(train))
    held_out = [line.strip() for line in lines["valid"] if set(line) <= seen]
    assert len(held_out) > 900
    assert [tokenizer.decode(tokenizer.encode(line)) for line in held_out] == held_out


def test_special_ids_are_fixed_and_decoding_stops_at_eos(tmp_path):
    tokenizer = load_or_train(tmp_path, CORPUS, SMALL, lambda: TEXT, num_threads=2)
    pieces = [tokenizer.processor.id_to_piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)]
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    ids = tokenizer.encode(TEXT[2])
    after_eos = tokenizer.encode(TEXT[3])
    assert tokenizer.decode([BOS_ID, *ids, EOS_ID, *after_eos, PAD_ID]) == TEXT[2]


def test_a_vocabulary_larger_than_the_text_supports_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"vocab_size=5000 is more than 16 training sentences"):
        load_or_train(tmp_path, CORPUS, settings(vocab_size=5000), lambda: TEXT, num_threads=2)
    assert not any(p.is_dir() for p in tmp_path.iterdir()), "a failed training leaves no entry"


def test_a_vocabulary_smaller_than_the_texts_characters_is_a_config_error(tmp_path):
    with pytest.raises(
        ConfigError, match=r"vocab_size=8 cannot hold every character of the training text .* raise"
    ):
        load_or_train(tmp_path, CORPUS, settings(vocab_size=8), lambda: TEXT, num_threads=2)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"model_type": "wordpiece"}, "model_type='wordpiece' is not one of: unigram, bpe"),
        ({"vocab_size": 4}, "vocab_size=4 leaves no room"),
        ({"character_coverage": 0.0}, "character_coverage=0.0 must be in"),
    ],
)
def test_impossible_settings_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        settings(**options)


def test_an_interrupted_build_leaves_no_entry(tmp_path):
    def crash(partial):
        (partial / "half").write_text("written")
        raise KeyboardInterrupt

    entry = tmp_path / "entry"
    with pytest.raises(KeyboardInterrupt):
        build_once(entry, crash)
    assert list(tmp_path.iterdir()) == [tmp_path / "entry.lock"]
    assert build_once(entry, lambda partial: (partial / "whole").write_text("written"))
    assert sorted(p.name for p in entry.iterdir()) == ["record.json", "whole"]
    assert not build_once(entry, crash), "an existing entry is not rebuilt"


def test_a_second_builder_says_it_waits_then_reuses_the_first_ones_entry(tmp_path, caplog):
    entry = tmp_path / "entry"
    started, finish = threading.Event(), threading.Event()

    def slow(partial):
        started.set()
        finish.wait(10)
        (partial / "whole").write_text("first")

    class FinishOnceWaiting(logging.Handler):  # no timer: a loaded machine lost the race
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for another process" in record.getMessage():
                finish.set()

    first = threading.Thread(target=build_once, args=(entry, slow))
    first.start()
    started.wait(10)
    handler = FinishOnceWaiting()
    logging.getLogger("attnlab").addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="attnlab"):
            assert not build_once(entry, lambda partial: pytest.fail("built twice"))
    finally:
        logging.getLogger("attnlab").removeHandler(handler)
    first.join()
    assert f"waiting for another process to finish {entry}" in caplog.text
    assert (entry / "whole").read_text() == "first"


def test_a_restored_tokenizer_is_the_same_model_under_the_same_key(tmp_path):
    trained = load_or_train(tmp_path / "a", CORPUS, SMALL, lambda: TEXT, num_threads=2)
    restored = from_serialized(trained.serialized(), tmp_path / "b")
    again = from_serialized(trained.serialized(), tmp_path / "b")
    assert restored.key == trained.key and again.model_file == restored.model_file
    assert [restored.encode(line) for line in TEXT] == [trained.encode(line) for line in TEXT]
