"""Running text as one stream of token ids: a language model's data.

Tokenizers (`task.data.tokenizer`):
  char           the characters of the training split, sorted, after the project's four
                 special ids (pad 0, unk 1, bos 2, eos 3); a character the training split
                 lacks maps to unk, and every split counts how many it holds.
  sentencepiece  a SentencePiece model (BPE or unigram, attnlab.data.tokenizer) trained on the
                 training split's lines; a line break is EOS, as in fairseq's LM data.

A split is tokenized once into the stream cache, `<cache_dir>/streams/<key>/` (ids.bin and
meta.json), keyed by the split's content and the tokenizer, built and checked by
attnlab.data.tokenizer.build_once (in parallel processes, and resumed where a killed build
stopped: attnlab.data.encoding), and memory-mapped afterwards; a corpus's splits are parts
of one entry.

Windows (`windows`): a model of context L scores the T = n - 1 next-token predictions of a
stream of n tokens in windows of at most L inputs. Each window (start, end, first) reads the
inputs start..end-1 and scores the predictions first..end-1; every prediction is scored
exactly once. With stride S, window k ends at min(L + kS, T) and scores what the previous
one did not: S = L gives non-overlapping windows (context restarts every L tokens; the last
window may be shorter), S < L sliding windows of L inputs whose predictions all see at
least L - S tokens before them (Press et al. 2022, "Train Short, Test Long", Appendix B:
sliding window evaluation). `EvalWindows` batches the windows of each length and mode.

Training (`TrainWindows`, `WindowSampler`): an epoch is a fixed number of windows of
block_size + 1 tokens at random offsets, drawn from a generator seeded by the seed and the
epoch, so a resumed run skips into the same draw; DDP ranks take every num_replicas-th.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.data.cache import ids_dtype
from attnlab.data.encoding import Encoder, Unit, encode_units
from attnlab.data.loader import ResumableSampler
from attnlab.data.task import WINDOWS, WindowBatch, Windows
from attnlab.data.tokenizer import (
    EOS_ID,
    SPECIAL_IDS,
    UNK_ID,
    StreamTokenizer,
    Tokenizer,
    build_once,
    cache_key,
)
from attnlab.errors import ConfigError

SPECIALS = 4  # pad, unk, bos, eos: the ids every tokenizer of the project reserves
Window = tuple[int, int, int]  # start, end, first scored prediction


class CharTokenizer:
    """One id per character of the training split (the module docstring)."""

    kind, unk_id = "char", UNK_ID

    def __init__(self, characters: str) -> None:
        self.characters = "".join(sorted(set(characters)))
        self.ids = {c: i for i, c in enumerate(self.characters, SPECIALS)}
        self.key = cache_key({"char": self.characters})

    @classmethod
    def from_serialized(cls, model: bytes) -> CharTokenizer:
        return cls(model.decode("utf-8"))

    def serialized(self) -> bytes:
        return self.characters.encode("utf-8")

    @property
    def vocab_size(self) -> int:
        return SPECIALS + len(self.characters)

    def special_ids(self) -> Mapping[str, int]:
        return SPECIAL_IDS

    def encode(self, text: str) -> np.ndarray:
        ids = self.ids
        return np.fromiter((ids.get(c, UNK_ID) for c in text), np.int64, len(text))

    def decode(self, ids: Any) -> str:
        values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        symbols = ["", "\N{REPLACEMENT CHARACTER}", "", "", *self.characters]
        return "".join(symbols[i] for i in values)


class PieceTokenizer:
    """A SentencePiece model over running text: lines are encoded apart, each line break is
    EOS, and EOS decodes as a line break."""

    kind, unk_id = "sentencepiece", UNK_ID

    def __init__(self, model: Tokenizer) -> None:
        self.model, self.key = model, model.key

    def serialized(self) -> bytes:
        return self.model.serialized()

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def special_ids(self) -> Mapping[str, int]:
        return self.model.special_ids()

    def encode(self, text: str) -> np.ndarray:
        *ended, last = self.model.encode_batch(text.split("\n"))  # `last`: after the last break
        return np.asarray([i for line in ended for i in (*line, EOS_ID)] + last, np.int64)

    def decode(self, ids: Any) -> str:
        values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        lines, line = [], []
        for i in values:
            if i == EOS_ID:
                lines.append(line)
                line = []
            else:
                line.append(i)
        texts = [self.model.processor.decode(part) for part in [*lines, line]]
        return "\n".join(texts)


def restore_tokenizer(stored: Any) -> StreamTokenizer:
    """The tokenizer a checkpoint stored ({"kind": ..., "model": bytes}); a ConfigError when
    it is missing or damaged, never another tokenizer in its place."""
    kind, model = (
        (stored.get("kind"), stored.get("model")) if isinstance(stored, dict) else (None, None)
    )
    try:
        if kind == "char" and isinstance(model, bytes):
            return CharTokenizer.from_serialized(model)
        if kind == "sentencepiece" and isinstance(model, bytes):
            return PieceTokenizer(Tokenizer(model))
    except (UnicodeDecodeError, RuntimeError):  # bytes that are no text, no SentencePiece model
        pass
    raise ConfigError(
        "the checkpoint's tokenizer is missing or damaged: evaluate or resume a checkpoint "
        "that train.py wrote for task=lm"
    )


class Stream:
    """One split's token ids, memory-mapped: a whole cache entry, or the part [start, stop)
    of one (a corpus's held-out splits), and what was counted when it was built."""

    def __init__(
        self, directory: Path, start: int = 0, stop: int | None = None, present: bool = True
    ) -> None:
        self.directory = directory
        self.meta = json.loads((directory / "meta.json").read_text())
        self.start = start
        self.stop = self.meta.get("tokens", 0) if stop is None else stop
        self.present = present and self.meta["present"]

    def absent(self) -> Stream:
        """No split (a corpus without a test part)."""
        return Stream(self.directory, 0, 0, present=False)

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.meta.get("tokens", 0)

    def part(self, start: int, stop: int) -> Stream:
        return Stream(self.directory, self.start + start, self.start + stop)

    def __len__(self) -> int:
        return self.stop - self.start

    @cached_property
    def unknown(self) -> int:
        """Ids of the unknown symbol it holds (counted at build for a whole entry)."""
        return self.meta["unknown"] if self.whole else int((self.ids == UNK_ID).sum())

    @cached_property
    def ids(self) -> np.ndarray:
        path = self.directory / "ids.bin"
        if len(self) == 0:  # numpy cannot map an empty file
            return np.empty(0, self.meta["dtype"])
        return np.memmap(path, self.meta["dtype"], mode="r")[self.start : self.stop]

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers map the file themselves
        return {k: v for k, v in self.__dict__.items() if k != "ids"}


def write_stream(
    directory: Path,
    units: Callable[[], Iterable[Unit] | None],
    tokenizer: StreamTokenizer,
    identity: dict[str, Any],
    source: str,
    workers: int,
) -> None:
    """Tokenize `units()` (None: the split is absent) into `directory`, in `workers`
    processes, going on from what a killed build left there (attnlab.data.encoding); a
    ConfigError for a split without text, which is not sealed."""
    meta: dict[str, Any] = {"identity": identity, "source": source}
    found = units()
    if found is None:
        (directory / "meta.json").write_text(json.dumps({**meta, "present": False}))
        return
    dtype = ids_dtype(tokenizer.vocab_size)
    stored = {"kind": tokenizer.kind, "model": tokenizer.serialized()}
    encoder = Encoder(restore_tokenizer, stored, dtype, tokenizer.unk_id)
    pending = [found]  # read already; a build that starts again reads them again

    def again() -> Iterable[Unit]:
        return pending.pop() if pending else units() or ()

    counts = encode_units(directory, again, encoder, workers, source)
    if counts["tokens"] == 0:
        raise ConfigError(
            f"{source} holds no text (0 tokens), and a stream of none is not cached: give it "
            "text, or leave out a split that has none (test.txt, a third task.data.fractions)"
        )
    meta.update(
        present=True, tokens=counts["tokens"], characters=counts["characters"],
        unknown=counts["unknown"], dtype=dtype,
    )  # fmt: skip
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def open_stream(
    cache_dir: Path,
    units: Callable[[], Iterable[Unit] | None],
    tokenizer: StreamTokenizer,
    identity: dict[str, Any],
    source: str,
    workers: int = 1,
) -> tuple[Stream, bool]:
    """The stream of `identity` from the cache, tokenized first if the cache lacks it (a build
    that was killed goes on where it stopped); and whether it was tokenized now."""
    full = {"split": identity, "tokenizer": tokenizer.key}
    entry = cache_dir / "streams" / cache_key(full)
    built = build_once(
        entry,
        lambda partial: write_stream(partial, units, tokenizer, full, source, workers),
        resumable=True,
        unusable=sealed_empty,
    )
    return Stream(entry), built


def sealed_empty(entry: Path) -> str | None:
    """Why a stream entry of 0 tokens, which attnlab seals no longer (an older one did, from
    an edited progress.json), is built again; None for any other entry."""
    meta = json.loads((entry / "meta.json").read_text())
    empty = meta.get("present") and meta.get("tokens") == 0
    return (
        "sealed with 0 tokens (by an attnlab that did not check a build's progress)"
        if empty
        else None
    )


def windows(n_targets: int, length: int, stride: int) -> list[Window]:
    """The windows that score each of `n_targets` predictions once (the module docstring)."""
    found: list[Window] = []
    first, end = 0, min(length, n_targets)
    while end > first:
        found.append((first if stride >= length else max(0, end - length), end, first))
        first, end = end, min(end + stride, n_targets)
    return found


class WindowSampler(ResumableSampler):
    """`len(dataset)` random window offsets per epoch (seed + epoch), dealt to ranks."""

    def __init__(self, dataset: TrainWindows, **kwargs: Any) -> None:
        super().__init__(dataset, shuffle=True, **kwargs)
        self.offsets = dataset.offsets

    def order(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        drawn = torch.randint(0, self.offsets, (self.total_size,), generator=generator)
        return drawn[self.rank : self.total_size : self.num_replicas].tolist()


class TrainWindows(Dataset):
    """Item `offset`: the block_size + 1 tokens from there (inputs and next-token targets)."""

    def __init__(self, stream: Stream, block_size: int, count: int) -> None:
        self.stream, self.block_size, self.count = stream, block_size, count
        self.offsets = len(stream) - block_size  # windows start at 0 .. offsets - 1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, offset: int) -> torch.Tensor:
        ids = self.stream.ids[offset : offset + self.block_size + 1]
        return torch.from_numpy(ids.astype(np.int64))


class EvalWindows(Dataset):
    """Every window of the evaluated lengths, cut each way; an item is a whole batch (windows
    of one length, one way and one size), as TokenBatchSampler deals them."""

    def __init__(
        self,
        stream: Stream,
        lengths: list[int],
        ways: tuple[Windows, ...],
        stride: int,
        batch_tokens: int,
    ) -> None:
        rows, self.batches = [], []
        for length in lengths:
            for way in ways:
                step = min(stride, length) if way.sliding else length
                found = windows(len(stream) - 1, length, step)
                sizes = np.asarray([end - start for start, end, _ in found])
                for size in np.unique(sizes):
                    same = [w for w, s in zip(found, sizes, strict=True) if s == size]
                    per_batch = max(1, batch_tokens // int(size))
                    for i in range(0, len(same), per_batch):
                        chunk = same[i : i + per_batch]
                        self.batches.append(np.arange(len(rows), len(rows) + len(chunk)))
                        rows += [(*w, length, WINDOWS.index(way)) for w in chunk]
        self.stream, self.rows = stream, np.asarray(rows, np.int64).reshape(-1, 5)

    def __len__(self) -> int:
        return len(self.rows)

    def shapes(self) -> set[tuple[int, int]]:
        """The (windows, tokens read) of each batch: what a pass over it allocates."""
        return {(len(b), int(self.rows[b[0], 1] - self.rows[b[0], 0])) for b in self.batches}

    def __getitem__(self, positions: list[int]) -> WindowBatch:
        rows = self.rows[positions]
        ids = self.stream.ids
        tokens = np.stack([ids[start : end + 1] for start, end, *_ in rows]).astype(np.int64)
        return {
            "tokens": torch.from_numpy(tokens),
            "first": torch.from_numpy(rows[:, 2] - rows[:, 0]),  # first scored, in the window
            "length": int(rows[0, 3]),
            "windows": WINDOWS[int(rows[0, 4])],
        }
