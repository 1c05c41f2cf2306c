"""Translation data: corpus hygiene and the batch contract (the hub: test_translation_hub.py).

Loader edge cases run on small corpora written to tmp_path; the real-data tests read
../shared/data/{multi30k,wmt_sample} and skip when it is absent.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from helpers import SHARED_DATA, task_data

from attnlab.config.options import variant
from attnlab.data import tokenizer as tokenizer_module
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import EncoderDecoder
from attnlab.tasks.seq2seq import data as seq2seq
from attnlab.tasks.seq2seq import translation
from attnlab.tasks.seq2seq.translation import TranslationDataModule

WORDS = {
    "man": "mann",
    "woman": "frau",
    "dog": "hund",
    "child": "kind",
    "runs": "rennt",
    "walks": "geht",
    "plays": "spielt",
    "in": "im",
    "park": "park",
    "with": "mit",
    "red": "rotem",
    "ball": "ball",
    "on": "auf",
    "grass": "gras",
    "near": "nahe",
    "water": "wasser",
}
EN, DE = list(WORDS), list(WORDS.values())
TINY = {"vocab_size": 40, "pairs": 1000, "max_tokens": 512, "max_len": 64, "num_threads": 2}


def sentence_pairs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """Word-for-word "translations" of random word sequences."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.randrange(len(EN)) for _ in range(rng.randint(3, 12))]
        pairs.append((" ".join(EN[w] for w in words), " ".join(DE[w] for w in words)))
    return pairs


def write_split(directory: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("en", "de")):
        text = "".join(f"{pair[side]}\n" for pair in pairs)
        (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")


def local(directory: Path, cache: Path, **options) -> TranslationDataModule:
    return task_data(
        "translation", cache, source="local", dir=str(directory), **{**TINY, **options}
    )


def indices(loader) -> list[int]:
    return [i for batch in loader for i in batch["index"].tolist()]


@pytest.fixture
def corpus(tmp_path) -> Path:
    directory = tmp_path / "corpus"
    write_split(directory, "train", sentence_pairs(300))
    write_split(directory, "valid", sentence_pairs(40, seed=1))
    return directory


# --- hygiene --------------------------------------------------------------------------------


def test_empty_and_whitespace_only_pairs_are_dropped_and_counted(tmp_path, caplog):
    pairs = sentence_pairs(50)
    pairs[3] = ("", pairs[3][1])
    pairs[7] = (" \t ", pairs[7][1])
    pairs[9] = (pairs[9][0], "   ")
    write_split(tmp_path / "corpus", "train", pairs)
    write_split(tmp_path / "corpus", "valid", pairs)
    module = local(tmp_path / "corpus", tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="attnlab"):
        module.setup()
    assert sorted(indices(module.train_dataloader())) == [
        i for i in range(50) if i not in (3, 7, 9)
    ]
    assert sorted(indices(module.val_dataloader())) == [i for i in range(50) if i not in (3, 7, 9)]
    assert caplog.text.count("dropped 3 empty or whitespace-only pairs") == 2


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    write_split(tmp_path / "corpus", "train", sentence_pairs(10))
    (tmp_path / "corpus" / "train.de").write_text("eins\nzwei\n")
    module = local(tmp_path / "corpus", tmp_path / "cache")
    with pytest.raises(ConfigError) as error:
        module.prepare_data()
    message = str(error.value)
    assert "train.en has 10 lines" in message and "train.de has 2 lines" in message


def test_undecodable_bytes_name_the_file_and_line(corpus, tmp_path):
    lines = (corpus / "valid.de").read_bytes().split(b"\n")
    lines[2] = b"ein hund \xff im park"
    (corpus / "valid.de").write_bytes(b"\n".join(lines))
    module = local(corpus, tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"valid\.de line 3 is not valid UTF-8"):
        module.prepare_data()


def test_a_missing_directory_or_file_says_what_to_pass(corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"task\.data\.dir=\S*nowhere is not a directory: pass"):
        local(tmp_path / "nowhere", tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"needs a directory: pass task\.data\.dir=<"):
        task_data("translation", tmp_path, source="local", dir=None)
    (corpus / "test.en").write_text("a dog\n")
    with pytest.raises(ConfigError, match=r"test\.en has no counterpart \S*test\.de"):
        local(corpus, tmp_path / "cache").prepare_data()


def test_length_cap_and_ratio_filter_training_only(corpus, tmp_path, caplog):
    long = (" ".join(EN * 4), " ".join(DE * 4))
    skewed = ("dog", " ".join(DE[:10]))
    for split, count, seed in (("train", 300, 0), ("valid", 40, 1)):
        write_split(corpus, split, [long, skewed, *sentence_pairs(count, seed)])
    module = local(corpus, tmp_path / "cache", max_len=64)
    with caplog.at_level(logging.INFO, logger="attnlab"):
        module.setup()
    train = set(indices(module.train_dataloader()))
    assert train == set(range(2, 302)), "the long (0) and skewed (1) pairs leave training"
    assert set(indices(module.val_dataloader())) == set(range(42)), "validation keeps them"
    assert "dropped 1 pairs longer than max_len=64 and 1 with a length ratio over 3" in caplog.text
    valid, _ = module.batched("valid")
    assert module.max_seq_len == max(valid.src_lengths().max(), valid.tgt_lengths().max()) > 64


def test_an_absent_test_split_fails_when_testing_and_nothing_replaces_it(corpus, tmp_path):
    module = local(corpus, tmp_path / "cache")
    module.setup()
    assert module.has_split("valid") and not module.has_split("test")
    assert len(indices(module.val_dataloader())) == 40
    with pytest.raises(ConfigError, match=r"no test split .* pass test=false"):
        module.test_dataloader()


def test_a_file_pair_given_by_path_is_the_test_split(corpus, tmp_path):
    pairs = sentence_pairs(12, seed=5)
    write_split(tmp_path / "elsewhere", "anything", pairs)
    src, tgt = (tmp_path / "elsewhere" / f"anything.{lang}" for lang in ("en", "de"))
    module = local(corpus, tmp_path / "cache", test_src=str(src), test_tgt=str(tgt))
    module.setup("test")
    refs = [r for batch in module.test_dataloader() for r in batch["ref"]]
    assert sorted(refs) == sorted(de for _, de in pairs)
    with pytest.raises(ConfigError, match=r"test_src and task\.data\.test_tgt go together"):
        local(corpus, tmp_path / "cache", test_src=str(src))
    with pytest.raises(
        ConfigError,
        match=r"task.data.test_tgt=.*missing.de is not a file: task.data.test_src and "
        r"task.data.test_tgt are line-aligned UTF-8 files of en and de sentences, one a line "
        r"\(as Multi30k's test.en and test.de\)$",
    ):
        local(corpus, tmp_path / "cache", test_src=str(src), test_tgt=str(tmp_path / "missing.de"))


def test_evaluating_a_file_pair_reads_neither_the_hub_nor_another_split(
    corpus, tmp_path, monkeypatch
):
    trained = local(corpus, tmp_path / "cache")
    model = trained.tokenizers.tgt.serialized()
    pairs = sentence_pairs(12, seed=5)
    write_split(tmp_path / "elsewhere", "test", pairs)
    src, tgt = (tmp_path / "elsewhere" / f"test.{lang}" for lang in ("en", "de"))

    def never(*args, **kwargs):
        pytest.fail("evaluating a file pair must not load the hub or train a tokenizer")

    monkeypatch.setattr(translation, "load_hub", never)
    monkeypatch.setattr(tokenizer_module, "train_sentencepiece", never)
    module = task_data(
        "translation", tmp_path / "cache", source="hub", dataset="someone/parallel",
        test_src=str(src), test_tgt=str(tgt), **TINY,
    )  # fmt: skip
    module.restore({"tokenizers": [model, model]}, "test")
    module.prepare_data()
    module.setup("test")
    test, _ = module.batched("test")
    assert module.max_seq_len == max(test.src_lengths().max(), test.tgt_lengths().max())
    refs = [r for batch in module.test_dataloader() for r in batch["ref"]]
    assert sorted(refs) == sorted(de for _, de in pairs)


def test_a_directory_is_refused_with_the_hub_source(tmp_path):
    with pytest.raises(
        ConfigError, match=r"task\.data\.dir=\S+ is read only with task\.data\.source=local"
    ):
        task_data("translation", tmp_path, source="hub", dataset="wmt/wmt14", dir=str(tmp_path))


def test_separate_vocabularies_are_per_language_and_never_share_embeddings(corpus, tmp_path):
    module = local(corpus, tmp_path / "cache", joint_vocab=False)
    src, tgt = module.tokenizers
    assert src.key != tgt.key
    assert src.decode(src.encode("dog runs in park")) == "dog runs in park"
    assert tgt.decode(tgt.encode("hund rennt im park")) == "hund rennt im park"
    sizes = module.model_kwargs()
    assert sizes["src_vocab_size"] == sizes["tgt_vocab_size"] and sizes["joint_vocab"] is False
    attention = AttentionConfig(
        variant("pe", "none"), variant("norm", "softmax"), variant("synthesizer", "dot")
    )
    cfg = ModelConfig(Standard(), d_model=16, n_heads=2, n_layers=1, d_ff=32)
    net = EncoderDecoder(cfg, attention, sizes["src_vocab_size"], sizes["tgt_vocab_size"], False)
    assert net.src_embed is not net.tgt_embed
    joint = EncoderDecoder(cfg, attention, sizes["src_vocab_size"], sizes["tgt_vocab_size"], True)
    assert joint.src_embed is joint.tgt_embed


def test_a_second_datamodule_reuses_tokenizer_and_token_caches(corpus, tmp_path, monkeypatch):
    first = local(corpus, tmp_path / "cache")
    first.setup()
    reference = next(iter(first.val_dataloader()))

    def never(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(tokenizer_module, "train_sentencepiece", never)
    monkeypatch.setattr(seq2seq, "write_split", never)
    second = local(corpus, tmp_path / "cache")
    second.setup()
    again = next(iter(second.val_dataloader()))
    assert torch.equal(again["src"], reference["src"]) and again["ref"] == reference["ref"]


def test_an_edit_that_keeps_size_and_mtime_is_not_served_from_the_cache(corpus, tmp_path):
    first = local(corpus, tmp_path / "cache")
    first.setup()
    before = sorted(ref for batch in first.val_dataloader() for ref in batch["ref"])
    valid = corpus / "valid.de"
    info = valid.stat()
    text = valid.read_text(encoding="utf-8")
    edited = text.replace("hund", "HUND")  # the same size
    assert edited != text
    valid.write_text(edited, encoding="utf-8")
    os.utime(valid, ns=(info.st_atime_ns, info.st_mtime_ns))  # as cp -p or rsync -a leave it
    assert (valid.stat().st_size, valid.stat().st_mtime_ns) == (info.st_size, info.st_mtime_ns)
    second = local(corpus, tmp_path / "cache")
    second.setup()
    after = sorted(ref for batch in second.val_dataloader() for ref in batch["ref"])
    assert after == sorted(line.strip() for line in edited.splitlines()) != before


def test_the_same_bytes_elsewhere_reuse_the_cache(corpus, tmp_path, monkeypatch):
    local(corpus, tmp_path / "cache").setup()
    moved = tmp_path / "moved"
    shutil.copytree(corpus, moved)

    def never(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(seq2seq, "write_split", never)
    local(moved, tmp_path / "cache").setup()


# --- real data ------------------------------------------------------------------------------


def shared(name: str) -> Path:
    directory = SHARED_DATA / name
    if not directory.is_dir():
        pytest.skip(f"{directory} is absent (real corpora live beside the repo, not in it)")
    return directory


def real(name: str, cache: Path, **options) -> TranslationDataModule:
    settings = {"vocab_size": 500, "pairs": 2000, "max_tokens": 1024, "max_len": 64}
    return local(shared(name), cache, **{**settings, **options})


def check_contract(batch: dict, module: TranslationDataModule, references: list[str]) -> None:
    src, tgt, index = batch["src"], batch["tgt"], batch["index"]
    assert src.dtype == tgt.dtype == index.dtype == torch.long
    assert src.dim() == tgt.dim() == 2 and len(src) == len(tgt) == len(index) == len(batch["ref"])
    assert src.numel() + tgt.numel() <= module.batching.max_tokens or len(src) == 1
    assert (tgt[:, 0] == BOS_ID).all() and not (src == BOS_ID).any()
    for row in range(len(src)):
        for ids in (src[row], tgt[row]):
            length = int((ids != PAD_ID).sum())
            assert ids[length - 1] == EOS_ID and (ids[:length] == EOS_ID).sum() == 1
            assert (ids[length:] == PAD_ID).all()
        reference = batch["ref"][row]
        assert reference == references[int(index[row])]
        tokenizer = module.tokenizers.tgt
        assert tokenizer.decode(tgt[row]) == tokenizer.decode(tokenizer.encode(reference))


def test_multi30k_batches_follow_the_contract(tmp_path):
    module = real("multi30k", tmp_path, train_size=2000)
    module.prepare_data()
    module.setup()
    directory = shared("multi30k")
    lines = {
        split: (directory / f"{split}.de").read_text(encoding="utf-8").splitlines()
        for split in ("train", "valid", "test")
    }
    check_contract(next(iter(module.train_dataloader())), module, lines["train"])
    assert len(indices(module.train_dataloader())) == 2000
    for split, loader in (("valid", module.val_dataloader), ("test", module.test_dataloader)):
        batches = list(loader())
        for batch in batches:
            check_contract(batch, module, lines[split])
        order = indices(batches)
        assert sorted(order) == list(range(len(lines[split])))
        assert order == indices(loader()), "eval batches come in a fixed order"
    kwargs = module.model_kwargs()
    assert kwargs == {
        "src_vocab_size": 500,
        "tgt_vocab_size": 500,
        "joint_vocab": True,
        "pad_id": PAD_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "tokenizers": module.tokenizers,
    }
    assert module.tokenizers.src is module.tokenizers.tgt, "one joint vocabulary"
    longest = max(module.batched(s)[0].tgt_lengths().max() for s in ("valid", "test"))
    assert module.max_seq_len == max(64, longest)


def test_wmt_sample_drops_the_empty_line_and_has_no_test_split(tmp_path):
    module = real("wmt_sample", tmp_path)
    module.setup()
    train, _ = module.batched("train")
    assert len(train.data) == 9999 and 4 not in train.data.line
    valid = (shared("wmt_sample") / "valid.de").read_text(encoding="utf-8").splitlines()
    batches = list(module.val_dataloader())
    for batch in batches:
        check_contract(batch, module, valid)
    assert sorted(indices(batches)) == list(range(50))
    with pytest.raises(ConfigError, match=r"no test split .*wmt_sample/test\.\{en,de\}"):
        module.test_dataloader()
