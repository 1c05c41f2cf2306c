"""Machine translation data: parallel corpora, from the hub or from files.

Sources (`source`), direction `src_lang` -> `tgt_lang`:
  hub    Hugging Face `datasets`, named by `dataset`, `subset` and `revision` (wmt/wmt14
         de-en, wmt/wmt16 de-en, bentrevett/multi30k); rows hold a `translation` dict or one
         column per language; hub split "validation" is our "valid" (attnlab.data.hub: an
         unreachable hub stops at once, naming the local alternative).
  local  line-aligned UTF-8 files `{dir}/{split}.{lang}` for the splits train, valid, test.
With `test_src` and `test_tgt`, the test split is those two files, whatever the source:
`eval.py ckpt_path=... task.data.test_src=a.en task.data.test_tgt=a.de` scores any file pair.

A local split's identity (what its caches are keyed by) is its files' content digests
(attnlab.data.digest); a hub split's, the dataset, subset and revision. Misaligned files,
undecodable bytes and missing files stop with a ConfigError that says what to fix.
Tokenizers, token caches and batching are the sequence-to-sequence data layer's
(attnlab.tasks.seq2seq.data); wmt_sample has no test split, which is recorded as absent.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.corpus import Corpus, Pair
from attnlab.data.digest import file_digest
from attnlab.data.hub import HUB_BATCH, HUB_SPLIT_NAMES, load_hub
from attnlab.data.text import count_lines, read_lines
from attnlab.errors import ConfigError
from attnlab.tasks.seq2seq.data import Seq2SeqDataModule

SOURCES = ("hub", "local")


class LineAlignedFiles:
    """Splits stored as two line-aligned UTF-8 files; subclasses say where they are. Their
    identity is their content (`digests`: where file digests are remembered)."""

    def __init__(self, src_lang: str, tgt_lang: str, digests: Path) -> None:
        self.langs, self.digests = (src_lang, tgt_lang), digests

    def files(self, split: str) -> tuple[Path, Path] | None:
        """The split's two files; None when neither exists, an error when only one does."""
        raise NotImplementedError

    def describe(self, split: str) -> str:
        raise NotImplementedError

    def identity(self, split: str) -> dict[str, Any]:
        digests = [file_digest(path, self.digests) for path in self.files(split) or ()]
        return {"source": "local", "split": split, "sha256": digests}

    def has(self, split: str) -> bool:
        return self.files(split) is not None

    def _files(self, split: str) -> tuple[Path, Path]:
        files = self.files(split)
        if files is None:
            raise ConfigError(f"{self.describe(split)} not found")
        return files

    def num_rows(self, split: str) -> int:
        src, tgt = self._files(split)
        src_lines, tgt_lines = count_lines(src), count_lines(tgt)
        if src_lines != tgt_lines:
            raise ConfigError(
                f"misaligned files: {src} has {src_lines} lines but {tgt} has {tgt_lines} lines; "
                "line i of one must translate line i of the other"
            )
        return src_lines

    def pairs(self, split: str, rows: np.ndarray | None = None) -> Iterator[Pair]:
        total = self.num_rows(split)  # alignment is checked before any work
        keep = np.ones(total, bool) if rows is None else np.isin(np.arange(total), rows)
        src, tgt = self._files(split)
        lines = zip(read_lines(src), read_lines(tgt), strict=True)
        return ((i, s, t) for i, (s, t) in enumerate(lines) if keep[i])


class LocalCorpus(LineAlignedFiles):
    """Line-aligned files `{directory}/{split}.{lang}`."""

    def __init__(self, directory: str | None, src_lang: str, tgt_lang: str, digests: Path) -> None:
        super().__init__(src_lang, tgt_lang, digests)
        hint = (
            f"pass task.data.dir=<directory with {{train,valid,test}}.{src_lang} and "
            f"{{train,valid,test}}.{tgt_lang} files>, or task.data.source=hub"
        )
        if directory is None:
            raise ConfigError(f"task.data.source=local needs a directory: {hint}")
        self.directory = Path(directory).expanduser().resolve()
        if not self.directory.is_dir():
            raise ConfigError(f"task.data.dir={directory} is not a directory: {hint}")

    def files(self, split: str) -> tuple[Path, Path] | None:
        src, tgt = (self.directory / f"{split}.{lang}" for lang in self.langs)
        if src.is_file() and tgt.is_file():
            return src, tgt
        if src.is_file() or tgt.is_file():
            found, missing = (src, tgt) if src.is_file() else (tgt, src)
            raise ConfigError(f"{found} has no counterpart {missing}: add it, or remove {found}")
        return None

    def describe(self, split: str) -> str:
        return f"{self.directory}/{split}.{{{','.join(self.langs)}}}"


class FilePair(LineAlignedFiles):
    """One split given as a source file and a target file, by path."""

    def __init__(
        self, split: str, src: str, tgt: str, src_lang: str, tgt_lang: str, digests: Path
    ) -> None:
        super().__init__(src_lang, tgt_lang, digests)
        self.split = split
        self.paths = tuple(Path(p).expanduser().resolve() for p in (src, tgt))
        options = (f"task.data.{split}_src", f"task.data.{split}_tgt")
        for option, path in zip(options, self.paths, strict=True):
            if not path.is_file():
                raise ConfigError(
                    f"{option}={path} is not a file: {' and '.join(options)} are line-aligned "
                    f"UTF-8 files of {src_lang} and {tgt_lang} sentences, one a line (as "
                    f"Multi30k's {split}.{src_lang} and {split}.{tgt_lang})"
                )

    def files(self, split: str) -> tuple[Path, Path] | None:
        return self.paths if split == self.split else None  # type: ignore[return-value]

    def describe(self, split: str) -> str:
        return " and ".join(map(str, self.paths))


class Overlay:
    """A corpus whose one split comes from a file pair instead."""

    def __init__(self, base: Corpus, pair: FilePair) -> None:
        self.base, self.pair = base, pair

    def _for(self, split: str) -> Corpus:
        return self.pair if split == self.pair.split else self.base

    def identity(self, split: str) -> dict[str, Any]:
        return self._for(split).identity(split)

    def describe(self, split: str) -> str:
        return self._for(split).describe(split)

    def has(self, split: str) -> bool:
        return self._for(split).has(split)

    def num_rows(self, split: str) -> int:
        return self._for(split).num_rows(split)

    def pairs(self, split: str, rows: np.ndarray | None = None) -> Iterator[Pair]:
        return self._for(split).pairs(split, rows)


def hub_columns(batch: dict[str, list], langs: tuple[str, str]) -> tuple[list, list]:
    """Source and target texts of a batch of rows (a `translation` dict or per-language columns)."""
    if "translation" in batch:
        rows = batch["translation"]
        return [row[langs[0]] for row in rows], [row[langs[1]] for row in rows]
    return batch[langs[0]], batch[langs[1]]


class HubCorpus:
    """A Hugging Face dataset, downloaded (and cached under <cache_dir>/hf) when first needed."""

    def __init__(
        self,
        dataset: str | None,
        subset: str | None,
        revision: str | None,
        src_lang: str,
        tgt_lang: str,
        cache_dir: Path,
    ) -> None:
        if not dataset:
            raise ConfigError(
                "task.data.source=hub needs task.data.dataset=<hub name, e.g. wmt/wmt14>"
            )
        self.dataset, self.subset, self.revision = dataset, subset, revision
        self.langs = (src_lang, tgt_lang)
        self.cache_dir = cache_dir
        self.hint = (
            f"without network, pass task.data.source=local task.data.dir=<dir with "
            f"{{split}}.{src_lang} and {{split}}.{tgt_lang} files>"
        )

    @cached_property
    def splits(self) -> Any:
        data = load_hub(self.dataset, self.subset, self.revision, self.cache_dir, self.hint)
        for split in data.values():
            self._check_languages(split)
        return data

    def _check_languages(self, split: Any) -> None:
        features = split.features
        if "translation" in features:
            languages = getattr(features["translation"], "languages", None) or list(
                features["translation"]
            )
        else:
            languages = list(features)
        missing = [lang for lang in self.langs if lang not in languages]
        if missing:
            raise ConfigError(
                f"{self.dataset!r} ({self.subset}) has no {', '.join(missing)} text (it has "
                f"{', '.join(map(str, languages))}): check task.data.src_lang/tgt_lang and subset"
            )

    def _split(self, split: str) -> Any | None:
        names = [name for name in HUB_SPLIT_NAMES[split] if name in self.splits]
        return self.splits[names[0]] if names else None

    def identity(self, split: str) -> dict[str, Any]:
        """Without a pinned revision, the hub's latest as of the cache's first use."""
        return {
            "source": "hub", "dataset": self.dataset, "subset": self.subset,
            "revision": self.revision, "split": split,
        }  # fmt: skip

    def describe(self, split: str) -> str:
        return f"hub dataset {self.dataset} ({self.subset}) split {split}"

    def has(self, split: str) -> bool:
        return self._split(split) is not None

    def _required(self, split: str) -> Any:
        data = self._split(split)
        if data is None:
            raise ConfigError(f"{self.describe(split)} not found (it has {list(self.splits)})")
        return data

    def num_rows(self, split: str) -> int:
        return len(self._required(split))

    def pairs(self, split: str, rows: np.ndarray | None = None) -> Iterator[Pair]:
        data = self._required(split)
        if rows is None:
            rows = np.arange(len(data))
        else:
            data = data.select(rows)
        for start, batch in zip(itertools.count(0, HUB_BATCH), data.iter(batch_size=HUB_BATCH)):
            sources, targets = hub_columns(batch, self.langs)
            for offset, (s, t) in enumerate(zip(sources, targets, strict=True)):
                yield int(rows[start + offset]), (s or "").strip(), (t or "").strip()


def make_corpus(
    source: str,
    directory: str | None,
    dataset: str | None,
    subset: str | None,
    revision: str | None,
    langs: tuple[str, str],
    cache_dir: Path,
    test_files: tuple[str | None, str | None] = (None, None),
) -> Corpus:
    """The corpus of `source`; with test_files (source, target paths), its test split is
    read from those two files instead."""
    digests = cache_dir / "digests"
    if source == "local":
        corpus: Corpus = LocalCorpus(directory, *langs, digests)
    elif source == "hub":
        if directory is not None:
            raise ConfigError(
                f"task.data.dir={directory} is read only with task.data.source=local: add "
                "task.data.source=local to use those files (or drop task.data.dir for the hub)"
            )
        corpus = HubCorpus(dataset, subset, revision, *langs, cache_dir / "hf")
    else:
        raise ConfigError(f"task.data.source={source!r} is not one of: {', '.join(SOURCES)}")
    if test_files == (None, None):
        return corpus
    if None in test_files:
        raise ConfigError("task.data.test_src and task.data.test_tgt go together: give both paths")
    return Overlay(corpus, FilePair("test", *test_files, *langs, digests))  # type: ignore[arg-type]


class TranslationDataModule(Seq2SeqDataModule):
    """Parallel text for an encoder-decoder; the options are task.data's (conf/task/*.yaml)."""

    def __init__(
        self,
        source: str,
        dir: str | None,
        dataset: str | None,
        subset: str | None,
        revision: str | None,
        src_lang: str,
        tgt_lang: str,
        tokenizer: Mapping[str, Any],
        batching: Mapping[str, Any],
        data_seed: int,
        seed: int,
        num_workers: int,
        cache_dir: str,
        test_src: str | None,
        test_tgt: str | None,
    ) -> None:
        if src_lang == tgt_lang:
            raise ConfigError(f"task.data.src_lang and tgt_lang are both {src_lang!r}")
        cache = Path(cache_dir).expanduser().resolve()
        super().__init__(
            (src_lang, tgt_lang), tokenizer, batching, cache, data_seed, seed, num_workers,
        )  # fmt: skip
        self.corpus = make_corpus(
            source, dir, dataset, subset, revision, (src_lang, tgt_lang), cache,
            (test_src, test_tgt),
        )  # fmt: skip
