"""Where a language model's text comes from (`task.data.source`), as attnlab.tasks.lm.data reads
it: a directory of {train,valid,test}.txt, one file cut by fractions, a hub dataset's text
column (each split a text of its own), or a corpus of documents, from files or streamed from
the hub, encoded as one stream whose held-out splits are its last tokens. Each gives its splits as units to encode, where a split
lies in its stream, and the lines a tokenizer is trained on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from attnlab.config.values import is_number, require_counts
from attnlab.data.digest import file_digest
from attnlab.data.documents import corpus_files, read_documents
from attnlab.data.encoding import Unit, document_units, reservoir, text_units
from attnlab.data.hub import (
    COMMIT,
    HUB_SPLIT_NAMES,
    built_commits,
    load_hub,
    offline_hint,
    probe_hub,
    stream_hub,
)
from attnlab.data.text import read_text
from attnlab.data.tokenizer import cut
from attnlab.errors import ConfigError

SOURCES = ("hub", "local", "corpus", "hub_corpus")
UNIT_CHARACTERS = 1 << 22  # text handed to a tokenizing process at a time
SPLITS = ("train", "valid", "test")
SAMPLE_SEED = 0  # the SentencePiece training sample of lines: fixed across run seeds


class TextSource(Protocol):
    def identity(self, split: str) -> dict[str, Any]:
        """What the stream cache of `split` is keyed by (one entry for every split of a
        corpus, whose splits are parts of it: `part`)."""

    def describe(self, split: str) -> str: ...

    def units(self, split: str) -> Iterator[Unit] | None:
        """The split's text in order, as units to encode; None when it has no such split."""

    def part(self, split: str, tokens: int) -> tuple[int, int] | None:
        """Where `split` lies in its stream of `tokens` tokens; None where it has none."""

    def vocabulary_text(self, lines: int) -> str:
        """The text a character vocabulary is read from."""

    def sample_lines(self, lines: int) -> list[str]:
        """At most `lines` lines of training text, for a SentencePiece model."""


class RunningText(ABC):
    """What a source whose splits are whole texts of their own shares (TextFiles, SplitFile,
    HubText): each split a stream, cut into units at line breaks."""

    @abstractmethod
    def text(self, split: str) -> str | None:
        """The split's running text; None when the source has no such split."""

    @abstractmethod
    def describe(self, split: str) -> str: ...

    def units(self, split: str) -> Iterator[Unit] | None:
        text = self.text(split)
        return None if text is None else text_units(text, UNIT_CHARACTERS)

    def part(self, split: str, tokens: int) -> tuple[int, int] | None:
        return 0, tokens

    def training_text(self) -> str:
        text = self.text("train")
        if not text or text.isspace():
            raise ConfigError(
                f"{self.describe('train')} is missing or holds no text (it is empty or only "
                "whitespace): a vocabulary and a model need training text"
            )
        return text

    def vocabulary_text(self, lines: int) -> str:
        return self.training_text()

    def sample_lines(self, lines: int) -> list[str]:
        found = [line for line in self.training_text().split("\n") if line.strip()]
        rng = np.random.default_rng(SAMPLE_SEED)
        keep = np.sort(rng.choice(len(found), min(len(found), lines), False))
        return [found[i] for i in keep]


class TextFiles(RunningText):
    """{dir}/{train,valid,test}.txt."""

    def __init__(self, directory: str, digests: Path) -> None:
        self.directory, self.digests = Path(directory).expanduser().resolve(), digests
        if not (self.directory / "train.txt").is_file():
            raise ConfigError(
                f"task.data.dir={directory} has no train.txt: pass a directory of "
                "{train,valid,test}.txt, or task.data.file=<one text file> to split one"
            )

    def _path(self, split: str) -> Path:
        return self.directory / f"{split}.txt"

    def identity(self, split: str) -> dict[str, Any]:
        path = self._path(split)
        digest = file_digest(path, self.digests) if path.is_file() else None
        return {"source": "local", "split": split, "sha256": digest}

    def describe(self, split: str) -> str:
        return str(self._path(split))

    def text(self, split: str) -> str | None:
        path = self._path(split)
        return read_text(path) if path.is_file() else None


class SplitFile(RunningText):
    """One file, cut into contiguous parts by fractions of its characters."""

    def __init__(self, file: str, fractions: list[float], digests: Path) -> None:
        self.path, self.digests = Path(file).expanduser().resolve(), digests
        if not self.path.is_file():
            raise ConfigError(
                f"task.data.file={file} is not a file: give one UTF-8 text file (such as Tiny "
                "Shakespeare's input.txt), which task.data.fractions cuts into its train, valid "
                "(and test) parts"
            )
        ok = isinstance(fractions, list | tuple) and len(fractions) in (2, 3)
        if (
            not (ok and all(is_number(f) and f > 0 for f in fractions))
            or abs(sum(fractions) - 1) > 1e-9
        ):
            raise ConfigError(
                f"task.data.fractions={fractions!r} must be 2 or 3 positive numbers adding up "
                "to 1: the train, valid (and test) shares of the file, e.g. [0.9, 0.1]"
            )
        self.fractions = list(fractions)

    def identity(self, split: str) -> dict[str, Any]:
        digest = file_digest(self.path, self.digests)
        return {"source": "file", "split": split, "sha256": digest, "fractions": self.fractions}

    def describe(self, split: str) -> str:
        index = SPLITS.index(split)
        if index >= len(self.fractions):
            return f"a {split} part of {self.path} (task.data.fractions has {len(self.fractions)})"
        start = sum(self.fractions[:index])
        return f"{self.path} [{start:.0%}, {start + self.fractions[index]:.0%})"

    def text(self, split: str) -> str | None:
        index = SPLITS.index(split)
        if index >= len(self.fractions):
            return None
        text = read_text(self.path)
        bounds = np.cumsum([0.0, *self.fractions]) * len(text)
        return text[int(bounds[index]) : int(bounds[index + 1]) if index < 2 else len(text)]


class HubText(RunningText):
    """A Hugging Face dataset's text column, one row a line."""

    def __init__(
        self,
        dataset: str | None,
        subset: str | None,
        revision: str | None,
        column: str,
        cache: Path,
    ) -> None:
        if not dataset:
            raise ConfigError("task.data.source=hub needs task.data.dataset=<hub name>")
        self.dataset, self.subset, self.revision, self.column = dataset, subset, revision, column
        self.cache = cache

    @cached_property
    def splits(self) -> Any:
        hint = (
            "without network, pass task.data.source=local with task.data.dir=<directory of "
            "{train,valid,test}.txt> or task.data.file=<one text file>"
        )
        return load_hub(self.dataset, self.subset, self.revision, self.cache, hint)

    def identity(self, split: str) -> dict[str, Any]:
        return {
            "source": "hub", "dataset": self.dataset, "subset": self.subset,
            "revision": self.revision, "column": self.column, "split": split,
        }  # fmt: skip

    def describe(self, split: str) -> str:
        return f"hub dataset {self.dataset} ({self.subset}) split {split}"

    def text(self, split: str) -> str | None:
        names = [name for name in HUB_SPLIT_NAMES[split] if name in self.splits]
        if not names:
            return None
        data = self.splits[names[0]]
        if self.column not in data.column_names:
            raise ConfigError(
                f"{self.dataset!r} has no column {self.column!r} (it has "
                f"{', '.join(data.column_names)}): set task.data.text_column"
            )
        return "".join(row.rstrip("\n") + "\n" for row in data[self.column])


class Documents(ABC):
    """A corpus of documents encoded once, as one stream of documents each followed by EOS:
    test is its last `test_tokens` tokens but `val_tokens`, valid the last `val_tokens`, train
    all before them. The tokenizer is trained on lines drawn uniformly from the whole corpus
    (held-out documents included: a vocabulary, not the model, sees them)."""

    def __init__(self, val_tokens: int, test_tokens: int) -> None:
        require_counts("task.data", val_tokens=val_tokens)
        require_counts("task.data", least=0, test_tokens=test_tokens)
        self.held_out = {"valid": val_tokens, "test": test_tokens}

    @abstractmethod
    def documents(self) -> Iterator[str]:
        """The corpus's documents, in its one order."""

    @abstractmethod
    def identity(self, split: str) -> dict[str, Any]: ...

    @property
    @abstractmethod
    def name(self) -> str:
        """The corpus, in words."""

    def describe(self, split: str) -> str:
        return f"{self.name} ({split})"

    def units(self, split: str) -> Iterator[Unit]:
        return document_units(self.documents(), UNIT_CHARACTERS)

    def part(self, split: str, tokens: int) -> tuple[int, int] | None:
        valid, test = self.held_out["valid"], self.held_out["test"]
        train_end = max(0, tokens - valid - test)
        if split == "train":
            return 0, train_end
        if split == "valid":
            return max(0, tokens - valid), tokens
        return (train_end, max(train_end, tokens - valid)) if test else None

    def sample_lines(self, lines: int) -> list[str]:
        """`lines` pieces of at most SENTENCE_CHARACTERS: a sample whose size, and so
        SentencePiece's memory, the setting bounds whatever the corpus's lines."""
        every = (
            piece
            for text in self.documents()
            for line in text.split("\n")
            if line.strip()
            for piece in cut(line)
        )
        sample = reservoir(every, lines, np.random.default_rng(SAMPLE_SEED))
        if not sample:
            raise ConfigError(
                f"{self.name} holds no text (every document is empty or only whitespace): a "
                "vocabulary and a model need training text"
            )
        return sample

    def vocabulary_text(self, lines: int) -> str:
        return "\n".join(self.sample_lines(lines))


class DocumentCorpus(Documents):
    """A directory of corpus files (attnlab.data.documents)."""

    def __init__(
        self, directory: str, column: str, val_tokens: int, test_tokens: int, digests: Path
    ) -> None:
        super().__init__(val_tokens, test_tokens)
        self.directory = Path(directory).expanduser().resolve()
        self.files = corpus_files(self.directory)
        self.column, self.digests = column, digests

    def identity(self, split: str) -> dict[str, Any]:
        files = [
            [str(path.relative_to(self.directory)), file_digest(path, self.digests)]
            for path in self.files
        ]
        return {"source": "corpus", "column": self.column, "files": files}

    @property
    def name(self) -> str:
        return f"the corpus in {self.directory}"

    def documents(self) -> Iterator[str]:
        for path in self.files:
            yield from read_documents(path, self.column)


class HubCorpus(Documents):
    """A hub dataset's training split as a corpus, its rows streamed (nothing downloaded ahead
    of the encoder; a resumed build reads the rows again up to where it stopped, without
    encoding them). The stream is keyed by the commit that `revision` resolves to when first
    read, and reads that commit only: a dataset updated later, or during a build, changes
    nothing. A 40-hex revision is taken as the commit without asking the hub, so that a
    stream built before is found offline."""

    def __init__(
        self,
        hub: tuple[str | None, str | None, str | None, str],
        val_tokens: int,
        test_tokens: int,
        streams: Path,
    ) -> None:
        super().__init__(val_tokens, test_tokens)
        dataset, self.subset, self.revision, self.column = hub
        if not dataset:
            raise ConfigError("task.data.source=hub_corpus needs task.data.dataset=<hub name>")
        self.dataset: str = dataset
        self.streams = streams

    @cached_property
    def hint(self) -> str:
        """What to do without network: the commits whose streams this cache holds, which
        need no network, or else to build one once with it."""
        same = self.identity_at(None)
        return offline_hint(self.revision, built_commits(self.streams, same), self.streams)

    def identity_at(self, commit: str | None) -> dict[str, Any]:
        return {
            "source": "hub_corpus", "dataset": self.dataset, "subset": self.subset,
            "commit": commit, "column": self.column,
        }  # fmt: skip

    @cached_property
    def commit(self) -> str:
        if self.revision and COMMIT.fullmatch(self.revision):
            return self.revision
        return probe_hub(self.dataset, self.revision, self.hint)

    def identity(self, split: str) -> dict[str, Any]:
        return self.identity_at(self.commit)

    @property
    def name(self) -> str:
        return f"hub dataset {self.dataset} ({self.subset}) at commit {self.commit}"

    def documents(self) -> Iterator[str]:
        rows = stream_hub(self.dataset, self.subset, self.commit, "train", self.hint)
        number = 0
        try:
            for number, row in enumerate(rows):
                text = row.get(self.column)
                if not isinstance(text, str):
                    raise ConfigError(
                        f"row {number} of {self.dataset!r} has no text column {self.column!r} "
                        f"(it has {', '.join(row)}): set task.data.text_column"
                    )
                if text.strip():
                    yield text
        except OSError as error:  # the connection lost mid-stream (requests', fsspec's errors)
            raise ConfigError(
                f"the stream of {self.dataset!r} broke off at row {number} "
                f"({type(error).__name__}: {error}): run the same command again, and the build "
                "goes on where it stopped"
            ) from None


def make_source(
    source: str,
    directory: str | None,
    file: str | None,
    fractions: list[float],
    hub: tuple[str | None, str | None, str | None, str],
    held_out: tuple[int, int],
    cache: Path,
) -> TextSource:
    if source not in SOURCES:
        raise ConfigError(f"task.data.source={source!r} is not one of: {', '.join(SOURCES)}")
    if source == "corpus":
        if directory is None or file is not None:
            raise ConfigError(
                "task.data.source=corpus reads task.data.dir=<directory of .txt, .jsonl or "
                ".parquet files> (and no task.data.file)"
            )
        return DocumentCorpus(directory, hub[3], *held_out, cache / "digests")
    if source in ("hub", "hub_corpus"):
        if directory is not None or file is not None:
            raise ConfigError(
                f"task.data.source={source} reads no task.data.dir or task.data.file: drop "
                "them, or pass task.data.source=local (or corpus, for a directory) to read them"
            )
        return (
            HubText(*hub, cache / "hf")
            if source == "hub"
            else HubCorpus(hub, *held_out, cache / "streams")
        )
    if (directory is None) == (file is None):
        raise ConfigError(
            "task.data.source=local needs one of task.data.dir=<directory of "
            "{train,valid,test}.txt> or task.data.file=<one text file to split>"
        )
    if directory is not None:
        return TextFiles(directory, cache / "digests")
    return SplitFile(file, fractions, cache / "digests")  # type: ignore[arg-type]
