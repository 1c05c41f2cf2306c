"""task.data.source=hub_corpus: a hub dataset's training rows streamed as a corpus of
documents. The hub is replaced where the loader meets it (the commit probe and
`datasets.load_dataset`), with rows served by a real `datasets.IterableDataset`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import datasets
import huggingface_hub
import numpy as np
import pytest
from helpers import ROOT, compose_config
from test_lm_corpus import corpus_settings, many_documents

from attnlab.errors import ConfigError
from attnlab.runner.plan import build_datamodule

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LATER = "fedcba9876543210fedcba9876543210fedcba98"
DOCUMENTS = many_documents(120)


class Hub:
    """The hub as the loader meets it: which commit a revision is, and each commit's rows."""

    def __init__(self, monkeypatch, commit: str | Exception = COMMIT, column: str = "text"):
        self.commit, self.column = commit, column
        self.lost_after: int | None = None  # the connection drops before this row
        self.probes: list[str | None] = []
        self.loads: list[tuple] = []
        monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", self.dataset_info)
        monkeypatch.setattr(datasets, "load_dataset", self.load_dataset)

    def dataset_info(self, dataset, revision=None, timeout=None):
        self.probes.append(revision)
        if isinstance(self.commit, Exception):
            raise self.commit
        return SimpleNamespace(sha=self.commit)

    def load_dataset(self, *args, **kwargs):
        self.loads.append((args, kwargs))
        column, lost = self.column, self.lost_after
        rows = [{column: text, "id": i} for i, text in enumerate(DOCUMENTS)]

        def served():
            for number, row in enumerate(rows):
                if number == lost:
                    raise ConnectionResetError("[Errno 104] Connection reset by peer")
                yield row

        return datasets.IterableDataset.from_generator(served)


def hub_settings(cache, *more: str) -> list[str]:
    return [
        "task=lm", "task.data.source=hub_corpus", "task.data.dataset=org/corpus",
        "task.data.subset=sample", f"paths.data_dir={cache}", "task.data.tokenizer=char",
        "task.data.val_tokens=300", "task.data.test_tokens=200", "task.data.block_size=16",
        *more,
    ]  # fmt: skip


def prepared(settings: list[str], tmp_path):
    data = build_datamodule(compose_config(settings, tmp_path))
    data.prepare_data()
    return data


def test_streamed_rows_make_the_stream_the_same_documents_in_files_make(tmp_path, monkeypatch):
    hub = Hub(monkeypatch)
    streamed = prepared(hub_settings(tmp_path / "cache"), tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(DOCUMENTS) + "\n")
    local = prepared(corpus_settings(corpus, tmp_path / "local"), tmp_path)
    for split in ("train", "valid", "test"):
        assert np.array_equal(streamed.stream(split).ids, local.stream(split).ids), split
    (args, kwargs), *_ = hub.loads
    assert args == ("org/corpus", "sample")
    assert kwargs == {"revision": COMMIT, "split": "train", "streaming": True}
    meta = json.loads((streamed.stream("train").directory / "meta.json").read_text())
    assert meta["identity"]["split"]["commit"] == COMMIT and COMMIT in meta["source"]


def test_a_stream_is_keyed_by_its_commit_and_found_again_offline(tmp_path, monkeypatch):
    hub = Hub(monkeypatch)
    first = prepared(hub_settings(tmp_path / "cache"), tmp_path).stream("train").directory
    hub.commit = LATER  # the dataset was updated on the hub: a new stream
    later = prepared(hub_settings(tmp_path / "cache"), tmp_path).stream("train").directory
    assert later != first and hub.probes == [None, None]
    hub.commit = ConnectionError("no network")  # the commit given: the hub is not asked
    pinned = hub_settings(tmp_path / "cache", f"task.data.revision={COMMIT}")
    loads = len(hub.loads)
    assert prepared(pinned, tmp_path).stream("train").directory == first
    assert len(hub.probes) == 2 and len(hub.loads) == loads, "built before: nothing read"


def test_an_unreachable_hub_is_one_sentence_at_once(tmp_path, monkeypatch):
    Hub(monkeypatch, commit=OSError("[Errno -2] Name or service not known"))
    started = time.perf_counter()
    with pytest.raises(
        ConfigError, match=r"could not reach 'org/corpus'.*no stream of it is built"
    ):
        prepared(hub_settings(tmp_path / "cache"), tmp_path)
    assert time.perf_counter() - started < 5


@pytest.mark.slow
def test_offline_a_revision_never_built_names_the_commits_built(tmp_path, monkeypatch):
    """`attnlab tokenize` without network (HF_HUB_OFFLINE=1): a commit never built names the
    one that is, and passing that one, as it says, reads the stream built with network."""
    Hub(monkeypatch)
    cache = tmp_path / "cache"
    prepared(hub_settings(cache), tmp_path)  # built at COMMIT with the network

    def tokenize(revision: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable, "-m", "attnlab.commands.cli", "tokenize",
                *hub_settings(cache, f"task.data.revision={revision}"),
            ],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip

    never = tokenize(LATER)
    assert never.returncode == 1 and "Traceback" not in never.stderr, never.stderr[-2000:]
    assert (
        never.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"): task.data.revision={LATER} is not built in {cache / 'streams'}; without network, "
            f"pass task.data.revision=<a commit built there: {COMMIT}>, or task.data.source=corpus "
            "task.data.dir=<directory of corpus files>"
        )
    )
    followed = tokenize(COMMIT)
    assert followed.returncode == 0, followed.stderr[-2000:]
    assert f"at commit {COMMIT} (train)) in " in followed.stdout


def test_rows_without_the_text_column_are_named(tmp_path, monkeypatch):
    Hub(monkeypatch, column="content")
    with pytest.raises(ConfigError, match="row 0 of 'org/corpus' has no text column 'text'"):
        prepared(hub_settings(tmp_path / "cache"), tmp_path)


@pytest.mark.parametrize(
    ("more", "sentence"),
    [
        (["task.data.dataset=null"], "needs task.data.dataset=<hub name>"),
        (["task.data.dir=/tmp"], "hub_corpus reads no task.data.dir"),
    ],
)
def test_settings_a_hub_corpus_cannot_use_are_refused(more, sentence, tmp_path):
    with pytest.raises(ConfigError, match=sentence):
        build_datamodule(compose_config(hub_settings(tmp_path / "cache", *more), tmp_path))


def test_a_connection_lost_mid_stream_is_one_sentence_and_the_run_again_resumes(
    tmp_path, monkeypatch
):
    hub = Hub(monkeypatch)
    hub.lost_after = 70
    with pytest.raises(ConfigError, match=r"the stream of 'org/corpus' broke off at row \d+ .*"
                       "ConnectionResetError.*run the same command again"):  # fmt: skip
        prepared(hub_settings(tmp_path / "cache"), tmp_path)
    hub.lost_after = None
    again = prepared(hub_settings(tmp_path / "cache"), tmp_path)
    whole = prepared(hub_settings(tmp_path / "whole"), tmp_path)
    for split in ("train", "valid", "test"):
        assert np.array_equal(again.stream(split).ids, whole.stream(split).ids), split
