"""Text encoded into one stream of token ids on disk, in parallel processes, resumably.

A source hands over its text in order as units: a chunk of running text (encoded as the
tokenizer encodes text) or a batch of documents (each encoded, then EOS). Worker processes
encode units, each with its own copy of the tokenizer, and the parent appends their ids to
`ids.bin` in order, with at most IN_FLIGHT units per worker outstanding: memory stays
bounded whatever the corpus size; the workers end with the parent, however it ends. After
each unit, `progress.json` records the units, characters and tokens written and the SHA-256
of the ids, so a build that was killed goes on from there: the record is checked against
`ids.bin` and the units read again (a record that disagrees, edited or from another build,
is discarded with a warning and the stream encoded from the start), `ids.bin` is cut back
to the tokens recorded and the units already written are read again but not encoded.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from attnlab.data.tokenizer import EOS_ID
from attnlab.files import write_text

IN_FLIGHT = 2  # units per worker submitted ahead of the one being written
PROGRESS = "progress.json"
COUNTS = ("units", "characters", "tokens", "unknown")  # progress.json's, beside a SHA-256
CHECK_TOKENS = 1 << 20  # ids read at a time to check that SHA-256 on resume
log = logging.getLogger(__name__)
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
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends


def end_with_parent(parent: int) -> None:
    """Make this worker end when `parent`, the build, does: a SIGKILLed build leaves no
    process encoding for it (Linux: the kernel kills the worker; elsewhere a thread that
    watches the parent ends it)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        threading.Thread(target=watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent ended before the kernel was told to watch it
        os._exit(1)


def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def _start_worker(encoder: bytes, parent: int) -> None:
    """Tie this worker to `parent` first, then unpickle the encoder (its tokenizer's module
    imports torch, seconds during which a parent that ended would go unnoticed)."""
    global _encoder
    end_with_parent(parent)
    _encoder = pickle.loads(encoder)


def _encode(unit: Unit) -> np.ndarray:
    assert _encoder is not None, "the pool's initializer sets the encoder"
    return _encoder(unit)


@dataclass
class Progress:
    """What a build has written to ids.bin: its first `units` units, of `characters`
    characters, as `tokens` ids of which `unknown` are the unknown id, whose bytes have the
    SHA-256 `digest` (progress.json records them, to be checked on resume)."""

    units: int = 0
    characters: int = 0
    tokens: int = 0
    unknown: int = 0
    digest: Any = field(default_factory=hashlib.sha256)

    def add(self, unit: Unit, encoded: np.ndarray, unk_id: int) -> None:
        self.units += 1
        self.characters += unit.characters
        self.tokens += len(encoded)
        self.unknown += int((encoded == unk_id).sum())
        self.digest.update(encoded.tobytes())

    def recorded(self) -> dict[str, int | str]:
        return {**{key: getattr(self, key) for key in COUNTS}, "sha256": self.digest.hexdigest()}


def read_progress(directory: Path, encoder: Encoder) -> Progress | str:
    """The progress a killed build recorded, checked against the ids it wrote (their size,
    SHA-256 and unknown ids); a new Progress where none is recorded, and what disagrees
    where the record does not match the ids."""
    path = directory / PROGRESS
    if not path.exists():
        return Progress()
    try:
        done = json.loads(path.read_text())
        counts = {key: done[key] for key in COUNTS}
        digest = done["sha256"]
    except KeyError as error:
        return f"it does not record {error}"
    except (OSError, ValueError, TypeError) as error:
        return f"it is unreadable ({type(error).__name__}: {error})"
    if not all(type(value) is int and value >= 0 for value in counts.values()):
        return f"its counts {counts} are not whole numbers"
    itemsize = np.dtype(encoder.dtype).itemsize
    ids = directory / "ids.bin"
    held = ids.stat().st_size // itemsize if ids.is_file() else 0
    if held < counts["tokens"]:
        return f"it records {counts['tokens']:,} tokens where ids.bin holds {held:,}"
    written = Progress(**counts)
    found = Progress()
    with ids.open("rb") as file:
        for start in range(0, counts["tokens"], CHECK_TOKENS):
            block = file.read(min(CHECK_TOKENS, counts["tokens"] - start) * itemsize)
            chunk = np.frombuffer(block, encoder.dtype)
            found.digest.update(block)
            found.unknown += int((chunk == encoder.unk_id).sum())
    if found.digest.hexdigest() != digest:
        return f"the first {counts['tokens']:,} ids of ids.bin are not the ones it records"
    if found.unknown != counts["unknown"]:
        return f"it records {counts['unknown']:,} unknown ids where ids.bin holds {found.unknown:,}"
    written.digest = found.digest
    return written


def resume(
    directory: Path, units: Callable[[], Iterable[Unit]], encoder: Encoder
) -> tuple[Progress, Iterator[Unit]]:
    """The progress of a killed build and the units it has not written yet: its record
    checked against ids.bin and against the units it claims (their number and characters);
    where they disagree, one warning and a build from the start (the partial stream is
    made from the text again, so nothing is lost)."""
    found = read_progress(directory, encoder)
    remaining = iter(units())
    if isinstance(found, Progress):
        skipped = list(itertools.islice((u.characters for u in remaining), found.units))
        if (len(skipped), sum(skipped)) == (found.units, found.characters):
            return found, remaining
        found = (
            f"it records {found.units:,} units of {found.characters:,} characters where the "
            f"text's first {len(skipped):,} units hold {sum(skipped):,}"
        )
    log.warning(
        "the partial stream in %s disagrees with its %s (%s): encoding it again from the start",
        directory, PROGRESS, found,
    )  # fmt: skip
    return Progress(), iter(units())


def encode_units(
    directory: Path,
    units: Callable[[], Iterable[Unit]],
    encoder: Encoder,
    workers: int,
    describe: str,
) -> dict[str, int]:
    """Append the ids of `units()` to directory/ids.bin (going on from a killed build's
    progress, once checked); the tokens, unknown ids and characters written, in all."""
    progress, remaining = resume(directory, units, encoder)
    ids = directory / "ids.bin"
    ids.touch()
    os.truncate(ids, progress.tokens * np.dtype(encoder.dtype).itemsize)
    bar = tqdm(
        initial=progress.characters, unit="char", unit_scale=True,
        desc=f"tokenizing {describe}", disable=None, file=sys.stderr,
    )  # fmt: skip
    with ids.open("ab") as out:
        for unit, encoded in encoded_in_order(remaining, encoder, workers):
            out.write(encoded.tobytes())
            out.flush()
            progress.add(unit, encoded, encoder.unk_id)
            write_progress(directory, progress)
            bar.update(unit.characters)
    bar.close()
    (directory / PROGRESS).unlink(missing_ok=True)
    return {key: getattr(progress, key) for key in ("tokens", "unknown", "characters")}


def write_progress(directory: Path, progress: Progress) -> None:
    write_text(directory / PROGRESS, json.dumps(progress.recorded()))


def encoded_in_order(
    units: Iterator[Unit], encoder: Encoder, workers: int
) -> Iterator[tuple[Unit, np.ndarray]]:
    """Each unit with its ids, in order: in this process with one worker, else in a pool
    (whose processes end with this one) with a bounded number of units outstanding."""
    ahead = list(itertools.islice(units, 2))  # a single unit is not worth starting processes
    every = itertools.chain(ahead, units)
    if workers <= 1 or len(ahead) < 2:
        for unit in every:
            yield unit, encoder(unit)
        return
    context = multiprocessing.get_context("spawn")  # a fork would copy the parent's threads
    started = (pickle.dumps(encoder), os.getpid())
    with context.Pool(workers, initializer=_start_worker, initargs=started) as pool:
        pending: deque[tuple[Unit, Any]] = deque()
        for unit in every:
            pending.append((unit, pool.apply_async(_encode, (unit,))))
            if len(pending) >= IN_FLIGHT * workers:
                first, result = pending.popleft()
                yield first, result.get()
        while pending:
            first, result = pending.popleft()
            yield first, result.get()
