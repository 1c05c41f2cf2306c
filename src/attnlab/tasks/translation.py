"""Machine translation data: parallel corpora -> SentencePiece ids -> token-budget batches.

Sources (`source`), direction `src_lang` -> `tgt_lang`:
  hub    Hugging Face `datasets`, named by `dataset` and `subset` (wmt/wmt14 de-en,
         wmt/wmt16 de-en, bentrevett/multi30k); rows hold a `translation` dict or one column
         per language; hub split "validation" is our "valid". Needs network on first use: the
         hub is probed with a short timeout, and an unreachable hub stops at once with a
         ConfigError naming the local alternative (set HF_HUB_OFFLINE=1 to use the HF cache).
  local  line-aligned UTF-8 files `{dir}/{split}.{lang}` for the splits train, valid, test.
With `test_src` and `test_tgt`, the test split is those two files, whatever the source:
`eval.py ckpt_path=... task.data.test_src=a.en task.data.test_tgt=a.de` scores any file pair.

Hygiene: pairs with an empty or whitespace-only side are dropped from every split; pairs with
a sequence longer than `max_len` or a token-count ratio above `max_len_ratio` are dropped from
training only (validation and test are scored on every pair; a sequence longer than
`max_eval_len` tokens is cut to it there, and the log names its line). Each count is logged. Misaligned
files, undecodable bytes and missing files stop with a ConfigError that says what to fix.

Caches, under `cache_dir` (paths.data_dir): the tokenizer in tokenizers/<key>/ (see
`attnlab.tokenizer`); each split's token ids, raw references and line numbers, written once as
flat arrays with offsets to tokens/<key>/, keyed by the split's identity (the files' content
digests, attnlab.data.digest; for the hub, dataset, subset and revision), the direction and
the tokenizers. Later runs memory-map them and neither read
the corpus nor tokenize. Caches are built in `prepare_data`; `setup`, `model_kwargs()` and
`max_seq_len` open them, building whatever is missing under a file lock (so that every DDP rank
may ask, and the model may be built before Lightning calls `prepare_data`).

Batches hold at most `max_tokens` padded tokens, source and target counted together
(B * (S + T)); `max_tokens >= 2 * max_len`, so every training pair fits. Training pairs are
shuffled, sorted by length within chunks of `sort_chunk` pairs and cut greedily into batches,
once per run; each epoch visits every batch once, in a new order (a fixed batch count is what
Lightning's epoch length and LR schedule expect). Validation and test batches are sorted by
length and come in a fixed order; an eval pair longer than `max_tokens` gets a batch of its
own. The padding fraction of each split is logged.

The batch contract, a dict:
  "src"   LongTensor [B, S]: source ids then EOS, right-padded with PAD_ID (0);
  "tgt"   LongTensor [B, T]: BOS, target ids, EOS, right-padded with PAD_ID;
  "ref"   list[str]: the raw target sentences (whitespace-stripped), for sacreBLEU;
  "index" LongTensor [B]: each pair's 0-based line (hub: row) index in its split, which gives
          back the corpus order; dropped empty pairs leave gaps.

Distributed data parallel: the batch sampler subclasses DistributedSampler, so Lightning keeps
it whatever `trainer.use_distributed_sampler` says (Lightning only wraps samplers that are not
DistributedSamplers) and calls its `set_epoch`. It deals batches round-robin to the trainer's
world size, after halving the largest batches until the count divides evenly: every rank runs
the same number of steps, and every pair is seen exactly once, never repeated as padding
(each rank then holds part of an eval set: gather hypotheses across ranks, ordered by index).

A split the corpus lacks (wmt_sample has no test files) is recorded as absent; asking for its
dataloader raises a ConfigError (pass test=false, or evaluate split=val) rather than quietly
using another split.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from attnlab.config import ConfigError, require_counts
from attnlab.data.digest import file_digest
from attnlab.data.loader import ResumableLoader, ResumableSampler
from attnlab.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Tokenizer,
    TokenizerSettings,
    build_once,
    cache_key,
    from_serialized,
    load_or_train,
)

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
STAGE_SPLITS = {"fit": ("train", "valid"), "validate": ("valid",), "test": ("test",)}
HUB_SPLIT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}
SOURCES = ("hub", "local")
HUB_TIMEOUT_S = 10.0
SAMPLE_SEED = 0  # the tokenizer's training sample: fixed, so runs with other seeds share it
ENCODE_CHUNK = 10_000  # pairs tokenized and written per step while building a token cache
HUB_BATCH = 1_000  # rows read from an Arrow table at a time

Pair = tuple[int, str, str]  # line index in the split, source text, target text


class Example(NamedTuple):
    src: np.ndarray  # subword ids, no specials
    tgt: np.ndarray
    ref: str
    index: int


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# --- reading corpora -------------------------------------------------------------------------


def count_lines(path: Path) -> int:
    """Lines as iterating over the file yields them (a last line without newline counts)."""
    count, last = 0, b"\n"
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def read_lines(path: Path) -> Iterator[str]:
    """The whitespace-stripped lines of a UTF-8 file; bad bytes stop with the line number."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ConfigError(
                    f"{path} line {number} is not valid UTF-8 ({error.reason} at byte "
                    f"{error.start} of the line): re-encode the file as UTF-8 (e.g. iconv)"
                ) from None
            yield text.strip()


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


class Corpus(Protocol):
    """What the datamodule needs from a source of parallel text."""

    def identity(self, split: str) -> dict[str, Any]:
        """JSON-able description of the split's content, cheap to compute (cache keys)."""

    def describe(self, split: str) -> str: ...

    def has(self, split: str) -> bool: ...

    def num_rows(self, split: str) -> int: ...

    def pairs(self, split: str, rows: np.ndarray | None = None) -> Iterator[Pair]:
        """The split's pairs in order, or only those at `rows` (sorted indices)."""


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
        for option, path in zip((f"{split}_src", f"{split}_tgt"), self.paths, strict=True):
            if not path.is_file():
                raise ConfigError(f"task.data.{option}={path} is not a file")

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


def load_hub(
    dataset: str, subset: str | None, revision: str | None, cache_dir: Path, hint: str
) -> Any:
    """A DatasetDict from the Hugging Face hub; fails fast, with `hint`, when it is unreachable."""
    try:
        import datasets
        from huggingface_hub import HfApi, constants
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise ConfigError(
            f"task.data.source=hub needs the `datasets` package (pip install datasets); or {hint}"
        ) from None

    def unreachable(error: Exception) -> ConfigError:
        reason = f"{type(error).__name__}: {error}"
        return ConfigError(
            f"could not reach {dataset!r} on the Hugging Face hub ({reason}): {hint}"
        )

    if not constants.HF_HUB_OFFLINE:  # offline mode reads the HF cache: nothing to probe
        try:
            HfApi().dataset_info(dataset, revision=revision, timeout=HUB_TIMEOUT_S)
        except HfHubHTTPError as error:
            raise ConfigError(
                f"the hub refused dataset {dataset!r} ({error}): check task.data.dataset"
            ) from None
        except Exception as error:  # DNS, refused, timeout, proxy: the class is the HTTP
            # library's (httpx, requests), which depends on the huggingface_hub version
            raise unreachable(error) from None
    try:
        return datasets.load_dataset(dataset, subset, revision=revision, cache_dir=str(cache_dir))
    except ConnectionError as error:  # offline mode without a cached copy, or a lost download
        raise unreachable(error) from None


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


# --- the token cache ---------------------------------------------------------------------------


def ids_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"


class RaggedWriter:
    """Writes variable-length rows as one flat `<name>.bin` plus `<name>.offsets.npy`."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory, self.name = directory, name
        self.file = (directory / f"{name}.bin").open("wb")
        self.lengths: list[np.ndarray] = [np.zeros(1, np.int64)]

    def extend(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.file.write(flat.tobytes())
        self.lengths.append(lengths.astype(np.int64))

    def __enter__(self) -> RaggedWriter:
        return self

    def __exit__(self, error_type: type | None, *_: object) -> None:
        self.file.close()
        if error_type is None:
            offsets = np.cumsum(np.concatenate(self.lengths))
            np.save(self.directory / f"{self.name}.offsets.npy", offsets)


def flat_ids(rows: list[list[int]], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype, int(lengths.sum()))
    return flat, lengths


def flat_text(texts: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [text.encode("utf-8") for text in texts]
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    return np.frombuffer(b"".join(encoded), np.uint8), lengths


class Ragged:
    """Rows written by RaggedWriter, memory-mapped on first use. Pickles as its path, so
    DataLoader workers and spawned ranks map the file themselves instead of copying it."""

    def __init__(self, directory: Path, name: str, dtype: str) -> None:
        self.directory, self.name, self.dtype = directory, name, dtype

    @cached_property
    def offsets(self) -> np.ndarray:
        return np.load(self.directory / f"{self.name}.offsets.npy", mmap_mode="r")

    @cached_property
    def data(self) -> np.ndarray:
        path = self.directory / f"{self.name}.bin"
        if path.stat().st_size == 0:  # numpy cannot map an empty file
            return np.empty(0, self.dtype)
        return np.memmap(path, self.dtype, mode="r")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> np.ndarray:
        return self.data[self.offsets[row] : self.offsets[row + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "name": self.name, "dtype": self.dtype}


def write_split(
    directory: Path,
    corpus: Corpus,
    split: str,
    tokenizers: tuple[Tokenizer, Tokenizer],
    num_threads: int,
    identity: dict[str, Any],
) -> None:
    """Tokenize a split into `directory`: src/tgt ids, ref texts, line numbers, meta.json."""
    meta: dict[str, Any] = {"identity": identity, "source": corpus.describe(split)}
    if not corpus.has(split):
        (directory / "meta.json").write_text(json.dumps({**meta, "present": False}))
        return
    src_tokenizer, tgt_tokenizer = tokenizers
    dtype = ids_dtype(max(src_tokenizer.vocab_size, tgt_tokenizer.vocab_size))
    lines, lines_kept = 0, [np.zeros(0, np.int64)]
    with (
        RaggedWriter(directory, "src") as src_out,
        RaggedWriter(directory, "tgt") as tgt_out,
        RaggedWriter(directory, "ref") as ref_out,
    ):
        for chunk in chunked(corpus.pairs(split), ENCODE_CHUNK):
            lines += len(chunk)
            kept = [pair for pair in chunk if pair[1] and pair[2]]
            if not kept:
                continue
            index, sources, targets = zip(*kept, strict=True)
            src_out.extend(*flat_ids(src_tokenizer.encode_batch(sources, num_threads), dtype))
            tgt_out.extend(*flat_ids(tgt_tokenizer.encode_batch(targets, num_threads), dtype))
            ref_out.extend(*flat_text(targets))
            lines_kept.append(np.asarray(index, np.int64))
    line = np.concatenate(lines_kept)
    np.save(directory / "line.npy", line)
    meta.update(present=True, lines=lines, pairs=len(line), empty=lines - len(line), dtype=dtype)
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


class SplitData:
    """One split's cached pairs, memory-mapped. Lengths are the model's: source ids + EOS,
    target ids + BOS + EOS."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.meta = json.loads((directory / "meta.json").read_text())
        if self.present:
            dtype = self.meta["dtype"]
            self.src = Ragged(directory, "src", dtype)
            self.tgt = Ragged(directory, "tgt", dtype)
            self.ref = Ragged(directory, "ref", "uint8")
            self.line = np.load(directory / "line.npy", mmap_mode="r")

    @property
    def present(self) -> bool:
        return self.meta["present"]

    def __len__(self) -> int:
        return self.meta["pairs"]

    def src_lengths(self) -> np.ndarray:
        return self.src.lengths() + 1

    def tgt_lengths(self) -> np.ndarray:
        return self.tgt.lengths() + 2

    def longest(self) -> int:
        """The longest source or target sequence, specials included (0 when empty)."""
        return int(max(self.src_lengths().max(initial=0), self.tgt_lengths().max(initial=0)))

    def example(self, row: int) -> Example:
        ref = bytes(self.ref[row]).decode("utf-8")
        return Example(self.src[row], self.tgt[row], ref, int(self.line[row]))


# --- batching -------------------------------------------------------------------------------------


def length_filter(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_len: int, max_ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """Masks of pairs with a sequence over max_len, and of the others whose token counts (without
    specials) differ by more than a factor max_ratio."""
    too_long = (src_lengths > max_len) | (tgt_lengths > max_len)
    src_ids, tgt_ids = src_lengths - 1, tgt_lengths - 2
    ratio = np.maximum(src_ids, tgt_ids) / np.maximum(np.minimum(src_ids, tgt_ids), 1)
    return too_long, ~too_long & (ratio > max_ratio)


def length_order(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """Positions sorted by source then target length (stable: deterministic)."""
    return np.lexsort((tgt_lengths, src_lengths))


def bucketed_order(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, chunk: int, rng: np.random.Generator
) -> np.ndarray:
    """A random permutation, sorted by length within consecutive chunks of `chunk` positions:
    batches cut from it hold similar lengths (little padding) yet random pairs."""
    order = rng.permutation(len(src_lengths))
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        order[start : start + chunk] = part[length_order(src_lengths[part], tgt_lengths[part])]
    return order


def token_batches(
    order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int
) -> list[np.ndarray]:
    """Consecutive runs of `order` holding at most max_tokens padded tokens, B * (S + T); a
    pair longer than max_tokens by itself gets a batch of its own."""
    batches: list[np.ndarray] = []
    current: list[int] = []
    longest_src = longest_tgt = 0
    for i, s, t in zip(
        order.tolist(), src_lengths[order].tolist(), tgt_lengths[order].tolist(), strict=True
    ):
        new_src, new_tgt = max(longest_src, s), max(longest_tgt, t)
        if current and (len(current) + 1) * (new_src + new_tgt) > max_tokens:
            batches.append(np.asarray(current))
            current, new_src, new_tgt = [], s, t
        current.append(i)
        longest_src, longest_tgt = new_src, new_tgt
    if current:
        batches.append(np.asarray(current))
    return batches


def padding_fraction(
    batches: list[np.ndarray], src_lengths: np.ndarray, tgt_lengths: np.ndarray
) -> float:
    """The share of padding among the tokens of the padded batches."""
    real = padded = 0
    for batch in batches:
        src, tgt = src_lengths[batch], tgt_lengths[batch]
        real += int(src.sum() + tgt.sum())
        padded += len(batch) * int(src.max() + tgt.max())
    return 1 - real / padded if padded else 0.0


def split_evenly(batches: list[np.ndarray], parts: int) -> list[np.ndarray]:
    """The batches, with the largest halved until their number is a multiple of `parts`."""
    batches = list(batches)
    while len(batches) % parts:
        largest = max(range(len(batches)), key=lambda b: len(batches[b]))
        if len(batches[largest]) < 2:
            raise ConfigError(
                f"{len(batches)} batches of one pair each cannot be shared evenly by {parts} "
                "ranks: raise task.data.max_tokens or use fewer devices"
            )
        half = len(batches[largest]) // 2
        batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
    return batches


class TokenBatchSampler(ResumableSampler):
    """Deals fixed batches (arrays of dataset positions) to one rank, in a new order every epoch
    when shuffling. Being a DistributedSampler keeps Lightning from wrapping it; the dealing is
    DistributedSampler's own (a seed + epoch permutation, then every num_replicas-th batch
    from `rank`), with no padding since split_evenly makes the count divide."""

    def __init__(
        self,
        batches: list[np.ndarray],
        shuffle: bool,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        self.batches = split_evenly(batches, num_replicas)
        super().__init__(
            self.batches,  # type: ignore[arg-type]  (only its length is used)
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
        )

    def __iter__(self) -> Iterator[list[int]]:
        return (self.batches[i].tolist() for i in super().__iter__())


class TranslationDataset(Dataset):
    """The pairs at `rows` of a split. An item is a whole batch: a list of positions (what
    TokenBatchSampler yields) -> their examples, so DataLoader runs with batch_size=None.
    With `cut`, sequences longer than `cut` tokens (specials included) are cut to it."""

    def __init__(self, data: SplitData, rows: np.ndarray, cut: int | None = None) -> None:
        self.data, self.rows, self.cut = data, rows, cut

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, positions: list[int]) -> list[Example]:
        examples = [self.data.example(int(self.rows[p])) for p in positions]
        if self.cut is None:
            return examples
        return [e._replace(src=e.src[: self.cut - 1], tgt=e.tgt[: self.cut - 2]) for e in examples]

    def src_lengths(self) -> np.ndarray:
        return np.minimum(self.data.src_lengths()[self.rows], self.cut or np.iinfo(np.int64).max)

    def tgt_lengths(self) -> np.ndarray:
        return np.minimum(self.data.tgt_lengths()[self.rows], self.cut or np.iinfo(np.int64).max)


def collate(examples: list[Example]) -> dict[str, Any]:
    """The batch contract of the module docstring."""
    src = torch.full((len(examples), max(len(e.src) for e in examples) + 1), PAD_ID)
    tgt = torch.full((len(examples), max(len(e.tgt) for e in examples) + 2), PAD_ID)
    for row, example in enumerate(examples):
        n, m = len(example.src), len(example.tgt)
        src[row, :n] = torch.from_numpy(example.src.astype(np.int64))
        src[row, n] = EOS_ID
        tgt[row, 0] = BOS_ID
        tgt[row, 1 : m + 1] = torch.from_numpy(example.tgt.astype(np.int64))
        tgt[row, m + 1] = EOS_ID
    return {
        "src": src,
        "tgt": tgt,
        "ref": [e.ref for e in examples],
        "index": torch.tensor([e.index for e in examples]),
    }


# --- the datamodule -----------------------------------------------------------------------------

MISSING_SPLIT_HINT = {
    "train": "training needs it",
    "valid": "training validates on it: provide it",
    "test": "pass test=false to skip testing after training (eval.py: split=val), "
    "or provide test files; no other split is used in its place",
}


class TranslationDataModule(L.LightningDataModule):
    """Parallel text for an encoder-decoder (see the module docstring).

    For the LightningModule: `tokenizer` (the target side's; `src_tokenizer` for sources,
    the same object with a joint vocabulary), `model_kwargs()` and `max_seq_len`: the longest
    source or target sequence, BOS/EOS included, that the model can be given, i.e. max_len
    (longer training pairs are dropped) or the longest validation/test sequence if longer
    (those splits are not filtered). Asked before `prepare_data`, these three prepare the data
    themselves: the model is built before Lightning calls it. After `for_evaluation`, all of
    this concerns the evaluated split alone.
    """

    def __init__(
        self,
        source: str = "hub",
        dir: str | None = None,
        dataset: str | None = None,
        subset: str | None = None,
        revision: str | None = None,
        src_lang: str = "en",
        tgt_lang: str = "de",
        vocab_size: int = 8000,
        model_type: str = "unigram",
        joint_vocab: bool = True,
        character_coverage: float = 1.0,
        tokenizer_pairs: int = 500_000,
        max_tokens: int = 4096,
        max_len: int = 256,
        max_len_ratio: float = 3.0,
        max_eval_len: int = 1024,
        train_size: int | None = None,
        sort_chunk: int = 100_000,
        seed: int = 0,
        num_workers: int = 0,
        num_threads: int | None = None,
        cache_dir: str = "data",
        test_src: str | None = None,
        test_tgt: str | None = None,
    ) -> None:
        super().__init__()
        if src_lang == tgt_lang:
            raise ConfigError(f"task.data.src_lang and tgt_lang are both {src_lang!r}")
        if max_len < 3:
            raise ConfigError(f"task.data.max_len={max_len} cannot hold BOS, a token and EOS")
        if max_tokens < 2 * max_len:
            raise ConfigError(
                f"task.data.max_tokens={max_tokens} cannot hold a training pair of max_len="
                f"{max_len} tokens a side: use max_tokens >= {2 * max_len} or a smaller max_len"
            )
        for name, value in [
            ("tokenizer_pairs", tokenizer_pairs),
            ("sort_chunk", sort_chunk),
            ("train_size", 1 if train_size is None else train_size),
            ("max_len_ratio", max_len_ratio),
        ]:
            if value < 1:
                raise ConfigError(f"task.data.{name}={value} must be at least 1")
        self.cache_dir = Path(cache_dir).expanduser().resolve()
        self.src_lang, self.tgt_lang, self.joint_vocab = src_lang, tgt_lang, joint_vocab
        self.corpus = make_corpus(
            source,
            dir,
            dataset,
            subset,
            revision,
            (src_lang, tgt_lang),
            self.cache_dir,
            (test_src, test_tgt),
        )
        self.settings = TokenizerSettings(vocab_size, model_type, character_coverage)
        self.tokenizer_pairs, self.max_tokens = tokenizer_pairs, max_tokens
        self.max_len, self.max_len_ratio = max_len, max_len_ratio
        require_counts("task.data", least=3, max_eval_len=max_eval_len)
        self.max_eval_len = max_eval_len
        self.train_size, self.sort_chunk, self.seed = train_size, sort_chunk, seed
        self.num_workers = num_workers
        self.num_threads = num_threads or available_cores()
        self.splits = SPLITS  # the splits it reads; an evaluation reads one (`for_evaluation`)
        self._tokenizers: tuple[Tokenizer, Tokenizer] | None = None
        self._splits: dict[str, SplitData] = {}
        self._sets: dict[str, tuple[TranslationDataset, list[np.ndarray]]] = {}

    # tokenizers and caches

    def _tokenizer_pair(self) -> tuple[Tokenizer, Tokenizer]:
        if self._tokenizers is None:
            if self.joint_vocab:
                joint = self._train_or_load((self.src_lang, self.tgt_lang))
                self._tokenizers = joint, joint
            else:
                self._tokenizers = (
                    self._train_or_load((self.src_lang,)),
                    self._train_or_load((self.tgt_lang,)),
                )
        return self._tokenizers

    def _train_or_load(self, langs: tuple[str, ...]) -> Tokenizer:
        identity = {
            "corpus": self.corpus.identity("train"),
            "languages": sorted(langs),
            "pairs": self.tokenizer_pairs,
        }
        return load_or_train(
            self.cache_dir / "tokenizers",
            identity,
            self.settings,
            lambda: self._tokenizer_text(langs),
            self.num_threads,
        )

    def _tokenizer_text(self, langs: tuple[str, ...]) -> list[str]:
        """Both sides (or one, per `langs`) of a fixed random sample of training pairs."""
        total = self.corpus.num_rows("train")
        rng = np.random.default_rng(SAMPLE_SEED)
        rows = np.sort(rng.choice(total, min(total, self.tokenizer_pairs), replace=False))
        sides = [side for side, lang in ((1, self.src_lang), (2, self.tgt_lang)) if lang in langs]
        text = [
            pair[side]
            for pair in self.corpus.pairs("train", rows)
            if pair[1] and pair[2]
            for side in sides
        ]
        if not text:
            raise ConfigError(
                f"{self.corpus.describe('train')} holds no pair with text on both sides: a "
                "vocabulary and a model need training text"
            )
        return text

    def split_data(self, split: str) -> SplitData:
        """A split's token cache, built on first use."""
        if split not in self._splits:
            self._splits[split] = self._open_split(split, self._tokenizer_pair())
        return self._splits[split]

    def _open_split(self, split: str, tokenizers: tuple[Tokenizer, Tokenizer]) -> SplitData:
        identity = {
            "corpus": self.corpus.identity(split),
            "direction": [self.src_lang, self.tgt_lang],
            "tokenizers": [t.key for t in tokenizers],
        }
        entry = self.cache_dir / "tokens" / cache_key(identity)
        built = build_once(
            entry,
            lambda partial: write_split(
                partial, self.corpus, split, tokenizers, self.num_threads, identity
            ),
        )
        data = SplitData(entry)
        if not data.present:
            log.info("%s: absent (%s not found)", split, data.meta["source"])
        else:
            log.info(
                "%s: %d pairs from %s (%s %s); dropped %d empty or whitespace-only pairs",
                split,
                len(data),
                data.meta["source"],
                "tokenized into" if built else "cached in",
                entry,
                data.meta["empty"],
            )
        return data

    def _require(self, split: str) -> SplitData:
        data = self.split_data(split)
        if not data.present:
            raise ConfigError(
                f"there is no {split} split ({data.meta['source']} not found): "
                f"{MISSING_SPLIT_HINT[split]}"
            )
        if len(data) == 0:
            raise ConfigError(
                f"the {split} split ({data.meta['source']}) holds no pair with text on both "
                f"sides ({data.meta['empty']} empty lines): {MISSING_SPLIT_HINT[split]}"
            )
        return data

    def for_evaluation(self, src_model: bytes, tgt_model: bytes, stage: str) -> None:
        """Serve only the splits of `stage` ("validate" or "test"), tokenized with these
        SentencePiece models (a checkpoint's): no tokenizer is trained, no other split read."""
        directory = self.cache_dir / "tokenizers"
        src = from_serialized(src_model, directory)
        tgt = src if tgt_model == src_model else from_serialized(tgt_model, directory)
        self._tokenizers, self._splits, self._sets = (src, tgt), {}, {}
        self.splits = STAGE_SPLITS[stage]

    # what the model needs

    @property
    def src_tokenizer(self) -> Tokenizer:
        return self._tokenizer_pair()[0]

    @property
    def tokenizer(self) -> Tokenizer:
        """The target side's tokenizer: decodes hypotheses."""
        return self._tokenizer_pair()[1]

    def model_kwargs(self) -> dict[str, int | bool]:
        src, tgt = self._tokenizer_pair()
        return {
            "src_vocab_size": src.vocab_size,
            "tgt_vocab_size": tgt.vocab_size,
            "joint_vocab": src is tgt,
            "pad_id": PAD_ID,
            "bos_id": BOS_ID,
            "eos_id": EOS_ID,
        }

    @property
    def max_seq_len(self) -> int:
        evals = [self.split_data(split) for split in ("valid", "test") if split in self.splits]
        trained = [self.max_len] if "train" in self.splits else []
        longest = [min(data.longest(), self.max_eval_len) for data in evals if data.present]
        return max([*trained, *longest], default=0)

    def has_split(self, split: str) -> bool:
        """Whether the corpus has this split ("train", "valid" or "test")."""
        return split in self.splits and self.split_data(split).present

    # Lightning hooks

    def prepare_data(self) -> None:
        """Train the tokenizer and tokenize every split, unless the cache has them."""
        for split in self.splits:
            self.split_data(split)

    def setup(self, stage: str | None = None) -> None:
        """Open the caches and batch the splits the stage uses (all for stage None)."""
        for split in STAGE_SPLITS.get(stage or "", SPLITS):
            if self.has_split(split):
                self.batched(split)

    def batched(self, split: str) -> tuple[TranslationDataset, list[np.ndarray]]:
        """A split's dataset and its batches (positions into the dataset), made once."""
        if split not in self._sets:
            data = self._require(split)
            self._sets[split] = (
                self._training(data) if split == "train" else self._eval(split, data)
            )
        return self._sets[split]

    def _training(self, data: SplitData) -> tuple[TranslationDataset, list[np.ndarray]]:
        too_long, skewed = length_filter(
            data.src_lengths(), data.tgt_lengths(), self.max_len, self.max_len_ratio
        )
        rows = np.flatnonzero(~(too_long | skewed))
        log.info(
            "train: dropped %d pairs longer than max_len=%d and %d with a length ratio over %g",
            too_long.sum(),
            self.max_len,
            skewed.sum(),
            self.max_len_ratio,
        )
        if self.train_size is not None:
            if self.train_size > len(rows):
                raise ConfigError(
                    f"task.data.train_size={self.train_size} exceeds the {len(rows)} training "
                    "pairs left after filtering: lower it, or set null to use them all"
                )
            rng = np.random.default_rng(self.seed)
            rows = np.sort(rng.choice(rows, self.train_size, replace=False))
        dataset = TranslationDataset(data, rows)
        src, tgt = dataset.src_lengths(), dataset.tgt_lengths()
        order = bucketed_order(src, tgt, self.sort_chunk, np.random.default_rng(self.seed))
        return dataset, self._log_batches(
            "train", token_batches(order, src, tgt, self.max_tokens), dataset
        )

    def _eval(self, split: str, data: SplitData) -> tuple[TranslationDataset, list[np.ndarray]]:
        long = (data.src_lengths() > self.max_eval_len) | (data.tgt_lengths() > self.max_eval_len)
        if long.any():
            lines = (np.asarray(data.line)[long] + 1).tolist()
            shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
            log.warning(
                "%s: %d pairs are longer than task.data.max_eval_len=%d tokens and are cut to "
                "it (lines %s); their BLEU is scored against the whole reference",
                split, len(lines), self.max_eval_len, shown,
            )  # fmt: skip
        dataset = TranslationDataset(data, np.arange(len(data)), cut=self.max_eval_len)
        src, tgt = dataset.src_lengths(), dataset.tgt_lengths()
        batches = token_batches(length_order(src, tgt), src, tgt, self.max_tokens)
        return dataset, self._log_batches(split, batches, dataset)

    def _log_batches(
        self, split: str, batches: list[np.ndarray], dataset: TranslationDataset
    ) -> list[np.ndarray]:
        log.info(
            "%s: %d pairs in %d batches of at most %d tokens; %.1f%% of batch tokens are padding",
            split,
            len(dataset),
            len(batches),
            self.max_tokens,
            100 * padding_fraction(batches, dataset.src_lengths(), dataset.tgt_lengths()),
        )
        return batches

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset, batches = self.batched(split)
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer else (1, 0)
        sampler = TokenBatchSampler(batches, shuffle, self.seed, world, rank)
        return ResumableLoader(
            dataset,
            sampler=sampler,
            batch_size=None,
            collate_fn=collate,
            num_workers=self.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
