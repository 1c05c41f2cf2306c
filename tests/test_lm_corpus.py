"""A language model's corpus as a directory of .txt, .jsonl(.gz, .zst) and .parquet files:
read a document at a time, encoded in parallel processes into one stream (documents
separated by EOS) that a killed build resumes, and cut into held-out splits by tokens."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import ROOT, TEXT, compose_config

from attnlab.commands.cli import main as attnlab
from attnlab.data.documents import corpus_files, read_documents
from attnlab.data.encoding import (
    PROGRESS,
    Encoder,
    document_units,
    encode_units,
    reservoir,
    text_units,
)
from attnlab.data.record import write_record
from attnlab.data.tokenizer import EOS_ID
from attnlab.errors import ConfigError
from attnlab.runner.plan import build_datamodule
from attnlab.tasks.lm.stream import CharTokenizer, restore_tokenizer

DOCUMENTS = ["first document\nwith two lines", "second", "third one", "fourth and last"]


def write_corpus(directory: Path, documents: list[str] = DOCUMENTS) -> Path:
    """One document in each kind of file (a .txt holds one-line documents)."""
    (directory / "nested").mkdir(parents=True)
    (directory / "a.txt").write_text(documents[1] + "\n\n")  # a blank line is no document
    with gzip.open(directory / "b.jsonl.gz", "wt") as file:
        file.write(json.dumps({"text": documents[0], "id": 7}) + "\n")
    lines = json.dumps({"text": documents[2]}) + "\n"
    (directory / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    pq.write_table(pa.table({"text": [documents[3]]}), directory / "nested" / "d.parquet")
    (directory / ".hidden.bin").write_bytes(b"\x00")  # skipped
    return directory


def test_every_kind_of_file_yields_its_documents_in_path_order(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    files = corpus_files(corpus)
    assert [f.name for f in files] == ["a.txt", "b.jsonl.gz", "c.jsonl.zst", "d.parquet"]
    read = [doc for path in files for doc in read_documents(path, "text")]
    assert read == [DOCUMENTS[1], DOCUMENTS[0], DOCUMENTS[2], DOCUMENTS[3]]


def gzip_cut(path: Path) -> None:
    path.write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:-20])


@pytest.mark.parametrize(
    ("damage", "sentence"),
    [
        (lambda d: (d / "x.csv").write_text("a,b\n"), r"x.csv is not a corpus file \(.txt, .jsonl"),
        (lambda d: (d / "e.jsonl").write_text('{"text": 1}\n'), r"e.jsonl line 1 is not a JSON"),
        (lambda d: (d / "e.jsonl").write_text("{oops\n"), r"e.jsonl line 1 is not a JSON object"),
        (
            lambda d: pq.write_table(pa.table({"body": ["x"]}), d / "e.parquet"),
            r"e.parquet has no column 'text' \(it has body\): set task.data.text_column",
        ),
        (lambda d: (d / "e.parquet").write_text("no"), r"e.parquet is not a Parquet file"),
        (lambda d: gzip_cut(d / "e.jsonl.gz"), r"e.jsonl.gz cannot be read to its end \(EOFError"),
        (lambda d: (d / "e.txt").write_bytes(b"\xff\xfe"), r"e.txt cannot be read to its end"),
        (
            lambda d: (d / "e.jsonl.zst").write_bytes(
                zstandard.compress(b'{"text": "a"}\n' * 99)[:-9]
            ),
            r"e.jsonl.zst cannot be read to its end \(EOFError: the file ends inside a Zstandard frame",
        ),
        (
            lambda d: (d / "e.jsonl.zst").write_text('{"text": "a"}\n'),
            r"e.jsonl.zst is not a Zstandard file as its name says: it holds text; give it the "
            r"suffix of what it holds \(.jsonl.gz gzip",
        ),
        (
            lambda d: (d / "e.jsonl.zst").write_bytes(gzip.compress(b'{"text": "a"}\n')),
            r"e.jsonl.zst is not a Zstandard file as its name says: it holds gzip data;",
        ),
        (
            lambda d: (d / "e.jsonl.gz").write_bytes(zstandard.compress(b'{"text": "a"}\n')),
            r"e.jsonl.gz is not a gzip file as its name says: it holds Zstandard data;",
        ),
        (
            lambda d: (d / "e.jsonl.gz").write_bytes(lzma.compress(b'{"text": "a"}\n')),
            r"e.jsonl.gz is not a gzip file as its name says: it holds xz data; turn it into a "
            r"\.txt, \.jsonl, \.jsonl\.gz, \.jsonl\.zst or \.parquet file, or move it out",
        ),
        (
            lambda d: (d / "e.txt").write_bytes(bz2.compress(b"a document\n")),
            r"e.txt is not a text file as its name says: it holds bzip2 data;",
        ),
    ],
    ids=[
        "other_kind",
        "text_not_text",
        "not_json",
        "no_column",
        "not_parquet",
        "cut",
        "not_utf8",
        "zst_cut",
        "zst_text",
        "zst_gzip",
        "gz_zstd",
        "gz_xz",
        "txt_bzip2",
    ],
)
def test_a_bad_corpus_file_is_one_sentence_naming_it(damage, sentence, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    damage(corpus)
    with pytest.raises(ConfigError, match=sentence):
        for path in corpus_files(corpus):
            list(read_documents(path, "text"))


def test_running_text_encoded_in_units_is_the_whole_text_encoded():
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list("ab c\n"), 5000))
    tokenizer = CharTokenizer(text)
    units = list(text_units(text, 300))
    assert len(units) > 10 and all(u.texts[0].endswith("\n") for u in units[:-1])
    joined = np.concatenate([tokenizer.encode(u.texts[0]) for u in units])
    assert np.array_equal(joined, tokenizer.encode(text))


def encoder(tokenizer: CharTokenizer) -> Encoder:
    stored = {"kind": tokenizer.kind, "model": tokenizer.serialized()}
    return Encoder(restore_tokenizer, stored, "uint16", tokenizer.unk_id)


def many_documents(count: int) -> list[str]:
    rng = np.random.default_rng(1)
    return ["".join(rng.choice(list("abcd e"), int(rng.integers(1, 60)))) for _ in range(count)]


def test_documents_are_each_followed_by_eos_and_processes_change_nothing(tmp_path):
    documents = many_documents(400)
    tokenizer = CharTokenizer("abcd")  # " " and "e" are unknown
    expected = np.concatenate([np.append(tokenizer.encode(d), EOS_ID) for d in documents])
    for workers in (1, 2):
        out = tmp_path / str(workers)
        out.mkdir()
        units = partial(document_units, documents, 500)
        counts = encode_units(out, units, encoder(tokenizer), workers, "test")
        ids = np.fromfile(out / "ids.bin", np.uint16)
        assert np.array_equal(ids, expected)
        assert counts["tokens"] == len(expected) and not (out / PROGRESS).exists()
        assert counts["unknown"] == int((expected == tokenizer.unk_id).sum()) > 0


class Interrupted(Exception):
    pass


class CountingEncoder(Encoder):
    encoded = 0

    def __call__(self, unit):
        self.encoded += 1
        return super().__call__(unit)


def test_a_build_stopped_midway_goes_on_without_encoding_again(tmp_path):
    documents = many_documents(300)
    tokenizer = CharTokenizer("".join(documents))
    units = list(document_units(documents, 200))

    def stopping(after: int):
        for index, unit in enumerate(units):
            if index == after:
                raise Interrupted
            yield unit

    with pytest.raises(Interrupted):
        encode_units(tmp_path, lambda: stopping(7), encoder(tokenizer), 1, "test")
    assert json.loads((tmp_path / PROGRESS).read_text())["units"] == 7
    with (tmp_path / "ids.bin").open("ab") as ids:
        ids.write(b"\x01\x00" * 5)  # a unit written but not recorded when the kill came
    counting = CountingEncoder(restore_tokenizer, encoder(tokenizer).stored, "uint16", 1)
    encode_units(tmp_path, lambda: iter(units), counting, 1, "test")
    assert counting.encoded == len(units) - 7, "the units written before are not encoded again"
    expected = np.concatenate([np.append(tokenizer.encode(d), EOS_ID) for d in documents])
    assert np.array_equal(np.fromfile(tmp_path / "ids.bin", np.uint16), expected)


def test_the_reservoir_draws_each_item_alike_and_is_seeded():
    counts = np.zeros(10)
    for seed in range(4000):
        for item in reservoir(range(10), 3, np.random.default_rng(seed)):
            counts[item] += 1
    assert np.allclose(counts / 4000, 0.3, atol=0.03)
    assert reservoir(range(100), 5, np.random.default_rng(1)) == reservoir(
        range(100), 5, np.random.default_rng(1)
    )
    assert sorted(reservoir(range(4), 9, np.random.default_rng(0))) == [0, 1, 2, 3]


def corpus_settings(corpus: Path, cache: Path, *more: str) -> list[str]:
    return [
        "task=lm", "task.data.source=corpus", f"task.data.dir={corpus}", f"paths.data_dir={cache}",
        "task.data.tokenizer=char", "task.data.val_tokens=300", "task.data.test_tokens=200",
        "task.data.block_size=16", *more,
    ]  # fmt: skip


def test_the_held_out_splits_are_the_last_tokens_of_one_stream(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(many_documents(200)) + "\n")
    data = build_datamodule(compose_config(corpus_settings(corpus, tmp_path / "cache"), tmp_path))
    data.prepare_data()
    train, valid, test = (data.stream(s) for s in ("train", "valid", "test"))
    whole = np.fromfile(train.directory / "ids.bin", np.dtype(train.meta["dtype"]))
    assert (len(valid), len(test)) == (300, 200) and len(train) == len(whole) - 500
    assert np.array_equal(np.concatenate([train.ids, test.ids, valid.ids]), whole)
    assert (whole == EOS_ID).sum() == 200, "one EOS after each document"
    without_test = corpus_settings(corpus, tmp_path / "cache", "task.data.test_tokens=0")
    data = build_datamodule(compose_config(without_test, tmp_path))
    assert not data.has_split("test") and len(data.stream("train")) == len(whole) - 300


def test_attnlab_tokenize_builds_what_a_run_then_reads(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    settings = corpus_settings(corpus, tmp_path / "cache")
    attnlab(["tokenize", *settings])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["train", "valid", "test"]
    entry = Path(printed[0].rsplit(" in ", 1)[1])
    before = (entry / "ids.bin").stat().st_mtime_ns
    data = build_datamodule(compose_config(settings, tmp_path))
    data.prepare_data()
    assert (entry / "ids.bin").stat().st_mtime_ns == before, "read from the cache, not rebuilt"
    with pytest.raises(SystemExit, match="attnlab tokenize prepares a language model's data"):
        attnlab(["tokenize", "task=probe"])


TOKENIZE = [sys.executable, "-m", "attnlab.commands.cli", "tokenize"]


def tokenize(corpus: Path, cache: Path, *more: str) -> subprocess.CompletedProcess:
    settings = corpus_settings(corpus, cache, "task.data.num_threads=1", *more)
    return subprocess.run([*TOKENIZE, *settings], capture_output=True, text=True, timeout=600)


def big_corpus(directory: Path) -> Path:
    """Six files of 40,000 documents: two units to encode, seconds of work."""
    directory.mkdir()
    text = "\n".join(many_documents(40_000)) + "\n"
    for name in "abcdef":
        (directory / f"{name}.txt").write_text(text)
    return directory


def killed_tokenization(corpus: Path, cache: Path) -> Path:
    """The partial stream of `attnlab tokenize` SIGKILLed once it has written a unit."""
    settings = corpus_settings(corpus, cache, "task.data.num_threads=1")
    killed = subprocess.Popen([*TOKENIZE, *settings], stdout=subprocess.DEVNULL)
    progress = list(cache.glob("streams/*.partial/" + PROGRESS))
    deadline = time.time() + 120
    while not progress and time.time() < deadline and killed.poll() is None:
        time.sleep(0.01)
        progress = list(cache.glob("streams/*.partial/" + PROGRESS))
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL and progress, "killed while it encoded"
    return progress[0].parent


def stream_ids(cache: Path) -> bytes:
    (ids,) = cache.glob("streams/*/ids.bin")
    return ids.read_bytes()


@pytest.mark.slow
def test_a_tokenization_killed_by_sigkill_resumes_to_the_same_stream(tmp_path):
    corpus = big_corpus(tmp_path / "corpus")
    killed_tokenization(corpus, tmp_path / "killed")
    resumed = tokenize(corpus, tmp_path / "killed")
    whole = tokenize(corpus, tmp_path / "whole")
    assert resumed.returncode == whole.returncode == 0, resumed.stderr[-1000:]
    assert "disagrees" not in resumed.stderr, "its own progress is taken as it is"
    assert stream_ids(tmp_path / "killed") == stream_ids(tmp_path / "whole")


@pytest.mark.slow
def test_a_progress_file_that_disagrees_with_its_ids_is_said_and_the_stream_built_anew(tmp_path):
    corpus = big_corpus(tmp_path / "corpus")
    partial = killed_tokenization(corpus, tmp_path / "killed")
    recorded = json.loads((partial / PROGRESS).read_text())
    assert recorded["units"] == 1 and recorded["tokens"] > 0
    whole = tokenize(corpus, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-1000:]
    edits = {  # what an edit claims, and what the check finds
        "more units, no tokens": (
            {"units": 3, "tokens": 0, "unknown": 0},
            "the first 0 ids of ids.bin are not the ones it records",
        ),
        "a token fewer": (
            {"tokens": recorded["tokens"] - 1},
            f"the first {recorded['tokens'] - 1:,} ids of ids.bin are not the ones it records",
        ),
        "a unit more": (
            {"units": 2},
            f"it records 2 units of {recorded['characters']:,} characters where the text's "
            "first 2 units hold",
        ),
    }
    for name, (edit, found) in edits.items():
        cache = tmp_path / name.replace(" ", "_").replace(",", "")
        shutil.copytree(tmp_path / "killed", cache)
        edited = cache / "streams" / partial.name
        (edited / PROGRESS).write_text(json.dumps({**recorded, **edit}))
        result = tokenize(corpus, cache)
        assert result.returncode == 0, result.stderr[-1000:]
        assert (
            f"the partial stream in {edited} disagrees with its {PROGRESS} ({found}"
        ) in result.stderr, name
        assert "): encoding it again from the start" in result.stderr
        assert stream_ids(cache) == stream_ids(tmp_path / "whole"), name


def test_a_stream_an_older_attnlab_sealed_with_0_tokens_is_built_again(tmp_path, capsys):
    """Sealed as an older attnlab sealed it from an edited progress.json: ids.bin empty,
    meta.json counting 0 tokens, the record matching both."""
    corpus = write_corpus(tmp_path / "corpus")
    held_out = ("task.data.val_tokens=3", "task.data.test_tokens=0")
    settings = corpus_settings(corpus, tmp_path / "cache", *held_out)
    attnlab(["tokenize", *settings])
    (entry,) = (p for p in (tmp_path / "cache" / "streams").iterdir() if p.is_dir())
    ids = (entry / "ids.bin").read_bytes()
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "ids.bin").write_bytes(b"")
    (entry / "meta.json").write_text(json.dumps({**meta, "tokens": 0, "unknown": 0}))
    write_record(entry)
    capsys.readouterr()
    attnlab(["tokenize", *settings])
    assert capsys.readouterr().out.startswith(f"train: {meta['tokens'] - 3:,} tokens")
    assert (entry / "ids.bin").read_bytes() == ids


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: psutil is not a dependency)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie that no one has reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("when", ["starting", "encoding"])
def test_the_encoding_workers_end_with_a_sigkilled_tokenize(when, tmp_path):
    """Killed as its two workers start (importing) or while they encode: none goes on."""
    corpus = big_corpus(tmp_path / "corpus")
    settings = corpus_settings(corpus, tmp_path / "cache", "task.data.num_threads=2")
    build = subprocess.Popen([*TOKENIZE, *settings], stderr=subprocess.DEVNULL)
    progress = tmp_path / "cache" / "streams"
    deadline = time.time() + 240
    while time.time() < deadline and build.poll() is None:
        spawned = [p for p in children(build.pid) if b"spawn_main" in _cmdline(p)]
        if len(spawned) == 2 and (when == "starting" or list(progress.glob("*/" + PROGRESS))):
            break
        time.sleep(0.01)
    kids = children(build.pid)
    os.kill(build.pid, signal.SIGKILL)
    assert build.wait() == -signal.SIGKILL and len(spawned) == 2, "killed with its workers"
    ended = time.time() + 2
    while any(map(running, kids)) and time.time() < ended:
        time.sleep(0.05)
    assert not [pid for pid in kids if running(pid)], "a worker outlived the build by 2 s"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


NO_TEXT = {"empty": "", "whitespace": "\n \n\t\n\n"}


@pytest.mark.parametrize("text", NO_TEXT.values(), ids=NO_TEXT.keys())
@pytest.mark.parametrize(
    ("where", "sentence"),
    [
        (
            "corpus",
            "the corpus in {dir} holds no text (every document is empty or only whitespace): ",
        ),
        ("dir", "{dir}/train.txt is missing or holds no text (it is empty or only whitespace): "),
    ],
)
@pytest.mark.parametrize("tokenizer", ["char", "sentencepiece"])
def test_a_corpus_without_text_is_one_sentence_and_nothing_cached(
    tokenizer, where, sentence, text, tmp_path
):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train.txt", "valid.txt") if where == "dir" else ("a.txt",):
        (corpus / name).write_text(text)
    source = "local" if where == "dir" else "corpus"
    settings = [
        "task=lm", f"task.data.source={source}", f"task.data.dir={corpus}",
        f"task.data.tokenizer={tokenizer}", f"paths.data_dir={tmp_path / 'cache'}",
        "task.data.val_tokens=3",
    ]  # fmt: skip
    expected = (
        "attnlab: " + sentence.format(dir=corpus) + "a vocabulary and a model need training text"
    )
    with pytest.raises(SystemExit) as stopped:
        attnlab(["tokenize", *settings])
    assert str(stopped.value) == expected
    assert not list((tmp_path / "cache").glob("streams/*/meta.json")), "no stream sealed"


@pytest.mark.slow
def test_training_on_a_corpus_without_text_is_one_sentence(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(NO_TEXT["whitespace"])
    (corpus / "b.jsonl").write_text(json.dumps({"text": " \n "}) + "\n")
    result = subprocess.run(
        [
            sys.executable, "train.py", *corpus_settings(corpus, tmp_path / "cache"),
            "model=tiny", f"paths.log_dir={tmp_path / 'logs'}", "extras.print_config=false",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"attnlab: the corpus in {corpus} holds no text (every document is empty or only "
        "whitespace): a vocabulary and a model need training text"
    )


def test_a_split_of_no_text_is_one_sentence_and_not_cached(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "train.txt").write_text(TEXT)
    (texts / "valid.txt").write_text("")
    settings = [
        "task=lm", "task.data.source=local", f"task.data.dir={texts}", "task.data.tokenizer=char",
        f"paths.data_dir={tmp_path / 'cache'}",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        attnlab(["tokenize", *settings])
    assert str(stopped.value) == (
        f"attnlab: {texts / 'valid.txt'} holds no text (0 tokens), and a stream of none is not "
        "cached: give it text, or leave out a split that has none (test.txt, a third "
        "task.data.fractions)"
    )
    sealed = [json.loads(m.read_text()) for m in (tmp_path / "cache").glob("streams/*/meta.json")]
    assert [meta["identity"]["split"]["split"] for meta in sealed] == ["train"]


def test_gpt2_small_takes_a_debug_step_on_the_cpu(tmp_path):
    """experiment=lm_gpt2_small at full width and depth, one step and one validation batch of
    a generated corpus (a vocabulary it can fill, one window a batch, to fit CI's time)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(many_documents(3000)) + "\n")
    result = subprocess.run(
        [
            sys.executable, "train.py", "experiment=lm_gpt2_small", "debug=fast",
            f"task.data.dir={corpus}", "task.data.vocab_size=40", "task.data.val_tokens=4096",
            "task.data.batch_size=1", "task.data.tokens_per_step=2048",
            "task.data.eval_batch_tokens=1024", f"paths.log_dir={tmp_path / 'logs'}",
            f"paths.data_dir={tmp_path / 'cache'}", "extras.print_config=false",
            "callbacks.progress_bar.refresh_rate=0",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"^parameters +85,[\d,]+ ", result.stdout, re.M), "12 x 768, vocabulary 40"
    assert re.search(r"^val/loss +\d", result.stdout, re.M)
