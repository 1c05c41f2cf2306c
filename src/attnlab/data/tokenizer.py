"""SentencePiece subword vocabularies, trained once per corpus and setting.

A model is trained on first use from sentences the caller supplies (a capped sample of the
training split) and stored under `<directory>/<key>/`, where the key hashes the corpus identity
and every setting that shapes the model: a changed setting trains a new model, an unchanged
one is loaded and never retrained. A checkpoint stores its model's bytes, and
`from_serialized` restores them, so evaluation always uses the vocabulary a model was
trained with, whatever data it is pointed at. Each entry holds `spm.model`, `spm.vocab` and
`identity.json` (what the key was made of, for people browsing the cache) and the entry's
record (attnlab.data.record): a damaged model file is found and the model retrained.

Special ids are fixed so that every model, batch and decoder agrees on them:
pad 0, unk 1, bos 2, eos 3.

A language model's tokenizer, of either kind (`attnlab.tasks.lm.stream`), is a
`StreamTokenizer`, stored in a checkpoint under `TOKENIZER_KEY`: what generation, exports and
checkpoints read of it without the language model's data.

`cache_key` and `build_once` are the disk-cache primitives that the token cache
(`attnlab.data.cache`) shares.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np
import sentencepiece as spm
from filelock import FileLock, Timeout

from attnlab.data.record import record_problem, write_record
from attnlab.errors import ConfigError

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# where every tokenizer of the project holds its special pieces, and its models read them
SPECIAL_IDS = MappingProxyType({"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID})
MODEL_TYPES = ("unigram", "bpe")
MODEL_FILE = "spm.model"


def cache_key(identity: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-able description of what a cache entry was built from."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_once(
    directory: Path,
    build: Callable[[Path], None],
    resumable: bool = False,
    unusable: Callable[[Path], str | None] | None = None,
) -> bool:
    """Create `directory` by calling `build(partial_directory)` unless it exists already.

    An existing entry is checked against its record (attnlab.data.record) and, if whole,
    read without taking a lock or writing anything, so a read-only shared cache serves. A
    missing entry is built, a damaged one rebuilt (one warning says what was wrong), under a
    file lock that serializes processes asking for the same entry (DDP ranks on one node:
    the first builds, the others wait and reuse it); the final rename means an interrupted
    build never leaves an entry that looks complete. With `resumable`, what an interrupted
    build left in the partial directory is kept for `build` to go on from (it checks it).
    `unusable` says why an entry that matches its record must still be rebuilt (one that an
    older attnlab sealed wrongly), or None. Returns whether it built the entry.
    """
    problem = entry_problem(directory, unusable)
    if problem is None:
        return False
    lock = acquire_build_lock(directory, problem)
    try:
        problem = entry_problem(directory, unusable)
        if problem is None:
            return False  # another process built it while this one waited
        if problem != MISSING:
            log.warning("the cache entry %s is %s: rebuilding it", directory, problem)
        partial = directory.with_name(f"{directory.name}.partial")
        if not resumable:
            shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(exist_ok=True)
        try:
            build(partial)
            write_record(partial)
        except BaseException:
            if not resumable:
                shutil.rmtree(partial, ignore_errors=True)
            raise
        if directory.is_dir():
            shutil.rmtree(directory)
        partial.rename(directory)
        return True
    finally:
        lock.release()


MISSING = "missing"


def entry_problem(
    directory: Path, unusable: Callable[[Path], str | None] | None = None
) -> str | None:
    """None for a whole entry; else why it must be built: MISSING, damaged and how, or
    what `unusable` finds."""
    if not directory.is_dir():
        return MISSING
    damage = record_problem(directory)
    if damage is not None:
        return f"damaged ({damage})"
    return None if unusable is None else unusable(directory)


def acquire_build_lock(directory: Path, problem: str) -> FileLock:
    """The lock for building `directory`, held; a ConfigError if its parent is not writable."""
    lock = FileLock(f"{directory}.lock")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process to finish %s", directory)
        lock.acquire()
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise ConfigError(
            f"the cache entry {directory} is {problem} and cannot be built because "
            f"{directory.parent} is not writable: make it writable, or pass "
            "paths.data_dir=<a writable directory> to build the caches there"
        ) from None
    return lock


@dataclass(frozen=True)
class TokenizerSettings:
    """Everything that shapes a trained model (all of it goes into the cache key), and the
    config node it came from (`label`, for messages)."""

    vocab_size: int
    model_type: str
    character_coverage: float  # 1.0 suits alphabetic languages; ~0.9995 for CJK
    user_symbols: tuple[str, ...] = ()  # pieces kept whole, e.g. a dialogue's speaker markers
    label: str = field(default="task.data", compare=False)

    def identity(self) -> dict[str, Any]:
        """What the cache key is made of (without user symbols when there are none, so that
        the keys of vocabularies without them stay what they were)."""
        settings = asdict(self)
        del settings["label"]
        if not self.user_symbols:
            del settings["user_symbols"]
        else:
            settings["user_symbols"] = list(self.user_symbols)
        return settings

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ConfigError(
                f"{self.label}.model_type={self.model_type!r} is not one of: {', '.join(MODEL_TYPES)}"
            )
        if self.vocab_size <= EOS_ID + 1:
            raise ConfigError(
                f"{self.label}.vocab_size={self.vocab_size} leaves no room beside the 4 special "
                "pieces (pad, unk, bos, eos): use a few hundred or more"
            )
        if not 0 < self.character_coverage <= 1:
            raise ConfigError(
                f"{self.label}.character_coverage={self.character_coverage} must be in (0, 1]"
            )


class Tokenizer:
    """A trained SentencePiece model with the project's fixed special ids."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model: bytes, model_file: Path | None = None) -> None:
        self.model, self.model_file = model, model_file  # model_file: its cache entry, if any
        self.processor = spm.SentencePieceProcessor(model_proto=model)
        # what token caches are keyed by: the model itself, wherever it came from
        self.key = hashlib.sha256(model).hexdigest()[:16]

    @classmethod
    def from_file(cls, model_file: Path) -> Tokenizer:
        return cls(Path(model_file).read_bytes(), Path(model_file))

    def serialized(self) -> bytes:
        """The model's bytes (what a checkpoint stores)."""
        return self.model

    @property
    def vocab_size(self) -> int:
        return self.processor.vocab_size()

    def special_ids(self) -> dict[str, int]:
        """Where the model holds its special pieces (-1: it has none), as SentencePiece reads
        it: SPECIAL_IDS for a model the project trained."""
        p = self.processor
        return {"pad": p.pad_id(), "unk": p.unk_id(), "bos": p.bos_id(), "eos": p.eos_id()}

    def encode(self, text: str) -> list[int]:
        """Subword ids of one sentence, without BOS or EOS."""
        return self.processor.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        return self.processor.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Sequence[int] | Any) -> str:
        """Detokenized text of ids (a list or a 1-d tensor/array): everything up to the first
        EOS, skipping BOS and padding, so a decoder's raw output can be passed as is."""
        values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if self.eos_id in values:
            values = values[: values.index(self.eos_id)]
        return self.processor.decode([i for i in values if i not in (self.pad_id, self.bos_id)])


class Tokenizers(NamedTuple):
    """The source and target tokenizers of a sequence-to-sequence model: one object twice
    with a joint vocabulary. A checkpoint stores their models under VOCABULARY_KEY."""

    src: Tokenizer
    tgt: Tokenizer

    def serialized(self) -> list[bytes]:
        return [self.src.serialized(), self.tgt.serialized()]

    @classmethod
    def from_serialized(cls, models: Sequence[bytes]) -> Tokenizers:
        src = Tokenizer(models[0])
        return cls(src, src if models[1] == models[0] else Tokenizer(models[1]))


VOCABULARY_KEY = "tokenizers"  # checkpoint entry: Tokenizers.serialized()
TOKENIZER_KEY = "lm_tokenizer"  # a language model's checkpoint entry: {"kind": ..., "model": bytes}


class StreamTokenizer(Protocol):
    """What a language model's data and generation need from a tokenizer (its kinds, char and
    sentencepiece: attnlab.tasks.lm.stream)."""

    kind: str  # "char" or "sentencepiece": what `tasks.lm.stream.restore_tokenizer` rebuilds from the bytes
    key: str  # what stream caches are keyed by
    unk_id: int

    @property
    def vocab_size(self) -> int: ...

    def special_ids(self) -> Mapping[str, int]: ...

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Any) -> str: ...

    def serialized(self) -> bytes: ...


def from_serialized(model: bytes, directory: Path) -> Tokenizer:
    """The tokenizer whose model file holds these bytes (e.g. a checkpoint's), stored once
    under `<directory>/restored-<hash>/`."""
    entry = directory / f"restored-{hashlib.sha256(model).hexdigest()[:16]}"

    def write(partial: Path) -> None:
        (partial / MODEL_FILE).write_bytes(model)

    build_once(entry, write)
    return Tokenizer.from_file(entry / MODEL_FILE)


SENTENCE_CHARACTERS = 1000  # SentencePiece skips sentences of over 4,192 bytes: cut below


def cut(sentence: str, most: int = SENTENCE_CHARACTERS) -> Iterator[str]:
    """`sentence` in pieces of at most `most` characters (at most 4 UTF-8 bytes each), cut at
    a space where there is one in the second half of a piece."""
    while len(sentence) > most:
        space = sentence.rfind(" ", most // 2, most)
        end = space if space > 0 else most
        yield sentence[:end]
        sentence = sentence[end:].lstrip(" ")
    if sentence:
        yield sentence


def train_sentencepiece(
    sentences: list[str], model_prefix: Path, settings: TokenizerSettings, num_threads: int
) -> None:
    """Train `<model_prefix>.model/.vocab` on `sentences` (all of them: sample beforehand;
    a long one is cut into pieces, which SentencePiece would otherwise leave out)."""
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=(piece for sentence in sentences for piece in cut(sentence)),
            model_prefix=str(model_prefix),
            vocab_size=settings.vocab_size,
            model_type=settings.model_type,
            character_coverage=settings.character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            input_sentence_size=0,  # the caller samples; 0 keeps every sentence given
            user_defined_symbols=list(settings.user_symbols),
            num_threads=num_threads,
            minloglevel=2,  # SentencePiece logs every EM step otherwise
        )
    except RuntimeError as error:
        reason = str(error).split("] ")[-1].split(". Increase")[0]
        if "Vocabulary size too high" in str(error):
            raise ConfigError(
                f"{settings.label}.vocab_size={settings.vocab_size} is more than {len(sentences)} "
                f"training sentences can fill ({reason}): lower vocab_size"
            ) from None
        if "smaller than required_chars" in str(error):
            raise ConfigError(
                f"{settings.label}.vocab_size={settings.vocab_size} cannot hold every character of the "
                f"training text and the special symbols ({reason}): raise vocab_size"
            ) from None
        raise


def load_or_train(
    directory: Path,
    identity: Mapping[str, Any],
    settings: TokenizerSettings,
    sentences: Callable[[], list[str]],
    num_threads: int,
) -> Tokenizer:
    """The cached model for `identity` (the corpus and languages) and `settings`, training it
    on `sentences()` first if there is none; `sentences` is only called to train."""
    full_identity = {**identity, "settings": settings.identity()}
    entry = directory / cache_key(full_identity)

    def train(partial: Path) -> None:
        started = time.perf_counter()
        text = sentences()
        train_sentencepiece(text, partial / "spm", settings, num_threads)
        (partial / "identity.json").write_text(json.dumps(full_identity, indent=2) + "\n")
        log.info(
            "trained a %s tokenizer (%d pieces) on %d sentences in %.1f s -> %s",
            settings.model_type,
            settings.vocab_size,
            len(text),
            time.perf_counter() - started,
            entry,
        )

    if not build_once(entry, train):
        log.info("reusing the tokenizer in %s", entry)
    return Tokenizer.from_file(entry / MODEL_FILE)
