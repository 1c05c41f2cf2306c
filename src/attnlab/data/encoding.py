"""Text encoded into one stream of token ids on disk, in parallel processes, resumably.

A source hands over its text in order as units: a chunk of running text (encoded as the
tokenizer encodes text) or a batch of documents (each encoded, then EOS). Worker processes
encode units, each with its own copy of the tokenizer, and the parent appends their ids to
`ids.bin` in order, with at most IN_FLIGHT units per worker outstanding: memory stays
bounded whatever the corpus size. After each unit, `progress.json` records the units and
tokens written, so a build that was killed goes on from there: `ids.bin` is cut back to the
tokens recorded and the units already written are read again but not encoded.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from attnlab.data.tokenizer import EOS_ID

IN_FLIGHT = 2  # units per worker submitted ahead of the one being written
PROGRESS = "progress.json"
COUNTS = ("units", "tokens", "unknown")  # what progress.json records
T = TypeVar("T")


@dataclass(frozen=True)
class Unit:
    texts: list[str]
    documents: bool  # each text a document followed by EOS; else running text, in pieces

    @property
    def characters(self) -> int:
        return sum(map(len, self.texts))


class Encoder:
    """What a worker needs: the tokenizer, rebuilt once per process from stored bytes."""

    def __init__(self, restore: Callable[[Any], Any], stored: Any, dtype: str, unk_id: int) -> None:
        self.restore, self.stored, self.dtype, self.unk_id = restore, stored, dtype, unk_id
        self.tokenizer: Any = None

    def __call__(self, unit: Unit) -> np.ndarray:
        if self.tokenizer is None:
            self.tokenizer = self.restore(self.stored)
        parts = [self.tokenizer.encode(text) for text in unit.texts]
        if unit.documents:
            parts = [piece for part in parts for piece in (part, np.array([EOS_ID]))]
        return np.concatenate(parts or [np.empty(0, np.int64)]).astype(self.dtype)


def text_units(text: str, size: int) -> Iterator[Unit]:
    """Running text in units of about `size` characters, each ending at a line break (but
    the last): encoded apart and joined, they give the ids of the whole text."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        yield Unit([text[start:end]], documents=False)
        start = end


def document_units(documents: Iterable[str], size: int) -> Iterator[Unit]:
    """Documents in units of about `size` characters."""
    batch: list[str] = []
    held = 0
    for document in documents:
        batch.append(document.strip("\n"))
        held += len(document)
        if held >= size:
            yield Unit(batch, documents=True)
            batch, held = [], 0
    if batch:
        yield Unit(batch, documents=True)


def reservoir(items: Iterable[T], count: int, rng: np.random.Generator) -> list[T]:
    """`count` of `items` drawn uniformly without replacement in one pass (Li 1994, Algorithm
    L: about count·(1 + log(n/count)) random numbers for n items)."""
    it = iter(items)
    sample = list(itertools.islice(it, count))
    if len(sample) < count or count == 0:
        return sample
    weight = math.exp(math.log(rng.random()) / count)
    while True:
        skip = math.floor(math.log(rng.random()) / math.log1p(-weight))
        following = next(itertools.islice(it, skip, None), None)
        if following is None:
            return sample
        sample[int(rng.integers(count))] = following
        weight *= math.exp(math.log(rng.random()) / count)


_encoder: Encoder | None = None  # a worker process's own


def _start_worker(encoder: Encoder) -> None:
    global _encoder
    _encoder = encoder


def _encode(unit: Unit) -> np.ndarray:
    assert _encoder is not None, "the pool's initializer sets the encoder"
    return _encoder(unit)


def read_progress(directory: Path, itemsize: int) -> dict[str, int]:
    """What a killed build wrote (units, tokens, unknown ids); zeros for a new one, or where
    ids.bin holds fewer tokens than recorded."""
    try:
        done = json.loads((directory / PROGRESS).read_text())
        counts = {key: int(done[key]) for key in COUNTS}
    except (OSError, ValueError, KeyError, TypeError):
        return dict.fromkeys(COUNTS, 0)
    ids = directory / "ids.bin"
    written = ids.stat().st_size if ids.is_file() else 0
    return counts if written >= counts["tokens"] * itemsize else dict.fromkeys(COUNTS, 0)


def encode_units(
    directory: Path,
    units: Iterable[Unit],
    encoder: Encoder,
    workers: int,
    describe: str,
    total_characters: int | None = None,
) -> dict[str, int]:
    """Append the ids of `units` to directory/ids.bin (going on from a killed build's
    progress); the tokens, unknown ids and characters written, in all."""
    itemsize = np.dtype(encoder.dtype).itemsize
    counts = read_progress(directory, itemsize)
    ids = directory / "ids.bin"
    ids.touch()
    os.truncate(ids, counts["tokens"] * itemsize)
    characters = 0
    bar = tqdm(
        total=total_characters, unit="char", unit_scale=True, desc=f"tokenizing {describe}",
        disable=None, file=sys.stderr,
    )  # fmt: skip
    with ids.open("ab") as out:
        for unit, encoded in encoded_in_order(units, encoder, workers, counts["units"]):
            if encoded is not None:
                out.write(encoded.tobytes())
                out.flush()
                counts["tokens"] += len(encoded)
                counts["unknown"] += int((encoded == encoder.unk_id).sum())
                counts["units"] += 1
                write_progress(directory, counts)
            characters += unit.characters
            bar.update(unit.characters)
    bar.close()
    (directory / PROGRESS).unlink()
    return {**counts, "characters": characters}


def write_progress(directory: Path, counts: dict[str, int]) -> None:
    partial = directory / f".{PROGRESS}"
    partial.write_text(json.dumps(counts))
    partial.replace(directory / PROGRESS)


def encoded_in_order(
    units: Iterable[Unit], encoder: Encoder, workers: int, skip: int
) -> Iterator[tuple[Unit, np.ndarray | None]]:
    """Each unit with its ids, in order (None for the first `skip`, written before): in this
    process with one worker, else in a pool with a bounded number of units outstanding."""
    it = iter(units)
    ahead = list(itertools.islice(it, 2))  # a single unit is not worth starting processes
    numbered = enumerate(itertools.chain(ahead, it))
    if workers <= 1 or len(ahead) < 2:
        for index, unit in numbered:
            yield unit, None if index < skip else encoder(unit)
        return
    context = multiprocessing.get_context("spawn")  # a fork would copy the parent's threads
    with context.Pool(workers, initializer=_start_worker, initargs=(encoder,)) as pool:
        pending: deque[tuple[Unit, Any]] = deque()
        for index, unit in numbered:
            if index < skip:
                yield unit, None
                continue
            pending.append((unit, pool.apply_async(_encode, (unit,))))
            if len(pending) >= IN_FLIGHT * workers:
                first, result = pending.popleft()
                yield first, result.get()
        while pending:
            first, result = pending.popleft()
            yield first, result.get()
