"""The token cache: each split of a corpus as SentencePiece ids, built once, memory-mapped.

A split is stored as flat arrays with offsets (src and tgt ids, the raw target texts as
references, each pair's line number) plus meta.json, in a directory keyed by what it was
built from (`identity`: the corpus content, the sides, the tokenizers). Later runs
memory-map it and neither read the corpus nor tokenize. Pairs with an empty side are
dropped, and counted. The directory is built by `attnlab.data.tokenizer.build_once`, which checks
every file (meta.json included) against the entry's record before each use and rebuilds a
damaged entry (attnlab.data.record).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from attnlab.data.corpus import Corpus
from attnlab.data.text import chunked
from attnlab.data.tokenizer import Tokenizer


class EncodedPair(NamedTuple):
    """One pair of a split, encoded (subword ids), as a batch is made of."""

    src: np.ndarray  # subword ids, no specials
    tgt: np.ndarray
    ref: str
    index: int


ENCODE_CHUNK = 10_000  # pairs tokenized and written per step while building a token cache


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

    def example(self, row: int) -> EncodedPair:
        ref = bytes(self.ref[row]).decode("utf-8")
        return EncodedPair(self.src[row], self.tgt[row], ref, int(self.line[row]))
