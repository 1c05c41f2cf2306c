"""(source, target) text pairs -> SentencePiece ids -> token-budget batches: the data of
every sequence-to-sequence task (translation, dialogue). A task gives the corpus and the
names of its two sides; this module does the rest.

Vocabulary (task.data.tokenizer): one SentencePiece model for both sides (`joint_vocab`) or
one per side, trained on a fixed sample of `pairs` training pairs and cached (attnlab.data.tokenizer). Each
split is tokenized once into the token cache (attnlab.data.cache), keyed by the corpus's
content, the sides and the tokenizers. Caches are built in `prepare_data`; `setup`,
`model_kwargs()` and `max_seq_len` open them, building whatever is missing or damaged under
a file lock (so that every DDP rank may ask, and the model may be built before Lightning
calls `prepare_data`). A whole cache is checked against its record and read without the lock,
so a read-only shared cache serves (attnlab.data.tokenizer.build_once).

Batching (task.data.batching): training pairs longer than `max_len` tokens or with a token-count
ratio above `max_len_ratio` are dropped (and counted); `train_size` keeps a random sample,
drawn with `data_seed` (fixed across run seeds: a seed sweep varies initialization and batch
order, never the data). Training batches are cut from a shuffled, chunk-wise length-sorted order once per run; each
epoch visits every batch once, in a new order. Validation and test keep every pair, sorted by
length, with sequences over `max_eval_len` tokens cut to it (their lines logged). Every
batch holds at most `max_tokens` padded tokens (B * (S + T)); the padding fraction is logged.

A split the corpus lacks is recorded as absent; asking for it raises a ConfigError rather
than using another split in its place.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import DataLoader

from attnlab.config.build import settings_node
from attnlab.config.values import require_counts
from attnlab.data.batching import (
    PairDataset,
    TokenBatchSampler,
    bucketed_order,
    collate,
    length_filter,
    length_order,
    padding_fraction,
    token_batches,
)
from attnlab.data.cache import SplitData, write_split
from attnlab.data.corpus import SPLITS, Corpus
from attnlab.data.loader import ResumableLoader
from attnlab.data.task import TaskData
from attnlab.data.text import available_cores
from attnlab.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    VOCABULARY_KEY,
    Tokenizer,
    Tokenizers,
    TokenizerSettings,
    build_once,
    cache_key,
    from_serialized,
    load_or_train,
)
from attnlab.errors import ConfigError

log = logging.getLogger(__name__)

TOKENIZER, BATCHING = "task.data.tokenizer", "task.data.batching"  # the nodes' names
STAGE_SPLITS = {"fit": ("train", "valid"), "validate": ("valid",), "test": ("test",)}
SAMPLE_SEED = 0  # the tokenizer's training sample: fixed, so runs with other seeds share it
MISSING_SPLIT_HINT = {
    "train": "training needs it",
    "valid": "training validates on it: provide it",
    "test": "pass test=false to skip testing after training (eval.py: split=val), "
    "or provide test files; no other split is used in its place",
}


@dataclass(frozen=True)
class Batching:
    """How pairs become batches (the module docstring): the node task.data.batching, with
    `data_seed` from task.data and `cut_sources` decided by the task."""

    max_tokens: int
    max_len: int
    max_len_ratio: float | None  # None: no ratio filter
    max_eval_len: int
    train_size: int | None
    sort_chunk: int
    data_seed: int  # draws the train_size sample; the batch order follows the run's seed
    cut_sources: bool  # cut long sources to their end instead of dropping the pair

    def __post_init__(self) -> None:
        if not (isinstance(self.max_len, int) and self.max_len >= 3):
            raise ConfigError(f"{BATCHING}.max_len={self.max_len} cannot hold BOS, a token and EOS")
        if self.max_tokens < 2 * self.max_len:
            raise ConfigError(
                f"{BATCHING}.max_tokens={self.max_tokens} cannot hold a training pair of "
                f"max_len={self.max_len} tokens a side: use max_tokens >= {2 * self.max_len} or "
                "a smaller max_len"
            )
        require_counts(BATCHING, least=3, max_eval_len=self.max_eval_len)
        require_counts(BATCHING, sort_chunk=self.sort_chunk)
        if self.train_size is not None:
            require_counts(BATCHING, train_size=self.train_size)
        if self.max_len_ratio is not None and self.max_len_ratio < 1:
            raise ConfigError(
                f"{BATCHING}.max_len_ratio={self.max_len_ratio} must be at least 1, or null"
            )


@dataclass(frozen=True)
class Vocabulary:
    """The node task.data.tokenizer: the SentencePiece settings (`TokenizerSettings`, which key
    the tokenizer cache), whether both sides share one vocabulary, how many training pairs
    the tokenizer is trained on, and its threads."""

    vocab_size: int
    model_type: str
    character_coverage: float
    joint_vocab: bool
    pairs: int
    num_threads: int | None  # SentencePiece's, training it and encoding; None: every core

    def settings(self, user_symbols: tuple[str, ...]) -> TokenizerSettings:
        return TokenizerSettings(
            self.vocab_size, self.model_type, self.character_coverage, user_symbols, TOKENIZER
        )


class Seq2SeqDataModule(TaskData):
    """For the system (`model_kwargs()`): the vocabulary sizes, special ids and Tokenizers.
    `max_seq_len`: the longest sequence the model can be given, i.e. max_len (longer
    training pairs are dropped) or the longest validation/test sequence (cut at
    max_eval_len) if longer. After `restore`, all of this concerns the evaluated split alone.
    """

    # Runs recorded before `data_seed` existed drew their data with task.data.seed, and those
    # recorded before the nodes task.data.batching and task.data.tokenizer spelled their
    # settings flat: both are evaluated or resumed as they ran (attnlab.runner.resume).
    data_seed_added = True
    earlier_spellings: ClassVar[Mapping[str, str]] = {
        **{f"task.data.{key}": f"task.data.batching.{key}" for key in (
            "max_tokens", "max_len", "max_len_ratio", "max_eval_len", "train_size", "sort_chunk")},
        **{f"task.data.{key}": f"task.data.tokenizer.{key}" for key in (
            "vocab_size", "model_type", "character_coverage", "joint_vocab", "num_threads")},
        "task.data.tokenizer_pairs": "task.data.tokenizer.pairs",
    }  # fmt: skip

    def __init__(
        self,
        sides: tuple[str, str],
        tokenizer: Mapping[str, Any],
        batching: Mapping[str, Any],
        cache_dir: Path,
        data_seed: int,
        seed: int,
        num_workers: int,
        user_symbols: tuple[str, ...] = (),
        cut_sources: bool = False,
    ) -> None:
        super().__init__()
        vocabulary = settings_node(Vocabulary, TOKENIZER, tokenizer)
        require_counts(TOKENIZER, pairs=vocabulary.pairs)
        require_counts("task.data", least=0, num_workers=num_workers)
        self.sides, self.joint_vocab = sides, vocabulary.joint_vocab
        self.vocabulary, self.tokenizer_pairs = vocabulary.settings(user_symbols), vocabulary.pairs
        self.batching = settings_node(
            Batching, BATCHING, batching, data_seed=data_seed, cut_sources=cut_sources
        )
        self.cache_dir, self.seed, self.num_workers = cache_dir, seed, num_workers
        self.num_threads = vocabulary.num_threads or available_cores()
        self.corpus: Corpus  # the task's, set after these settings are checked
        self.splits = SPLITS  # the splits it reads; an evaluation reads one (`restore`)
        self._tokenizers: Tokenizers | None = None
        self._splits: dict[str, SplitData] = {}
        self._sets: dict[str, tuple[PairDataset, list[np.ndarray]]] = {}

    # tokenizers and caches

    @property
    def tokenizers(self) -> Tokenizers:
        if self._tokenizers is None:
            if self.joint_vocab:
                joint = self._train_or_load(self.sides)
                self._tokenizers = Tokenizers(joint, joint)
            else:
                self._tokenizers = Tokenizers(
                    *(self._train_or_load((side,)) for side in self.sides)
                )
        return self._tokenizers

    def _train_or_load(self, sides: tuple[str, ...]) -> Tokenizer:
        identity = {
            "corpus": self.corpus.identity("train"),
            "languages": sorted(sides),  # the sides' names (the key's first users were languages)
            "pairs": self.tokenizer_pairs,
        }
        return load_or_train(
            self.cache_dir / "tokenizers",
            identity,
            self.vocabulary,
            lambda: self._tokenizer_text(sides),
            self.num_threads,
        )

    def _tokenizer_text(self, sides: tuple[str, ...]) -> list[str]:
        """Both sides (or one, per `sides`) of a fixed random sample of training pairs."""
        total = self.corpus.num_rows("train")
        rng = np.random.default_rng(SAMPLE_SEED)
        rows = np.sort(rng.choice(total, min(total, self.tokenizer_pairs), replace=False))
        columns = [column for column, side in enumerate(self.sides, 1) if side in sides]
        text = [
            pair[column]
            for pair in self.corpus.pairs("train", rows)
            if pair[1] and pair[2]
            for column in columns
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
            self._splits[split] = self._open_split(split, self.tokenizers)
        return self._splits[split]

    def _open_split(self, split: str, tokenizers: Tokenizers) -> SplitData:
        identity = {
            "corpus": self.corpus.identity(split),
            "direction": list(self.sides),
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
                split, len(data), data.meta["source"], "tokenized into" if built else "cached in",
                entry, data.meta["empty"],
            )  # fmt: skip
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

    # the contract (attnlab.data.task)

    def restore(self, checkpoint: dict[str, Any], stage: str) -> None:
        """Serve only the splits of `stage`, tokenized with the checkpoint's SentencePiece
        models: no tokenizer is trained, no other split read."""
        directory = self.cache_dir / "tokenizers"
        src_model, tgt_model = checkpoint[VOCABULARY_KEY]
        src = from_serialized(src_model, directory)
        tgt = src if tgt_model == src_model else from_serialized(tgt_model, directory)
        self._tokenizers, self._splits, self._sets = Tokenizers(src, tgt), {}, {}
        self.splits = STAGE_SPLITS[stage]

    def model_kwargs(self) -> dict[str, Any]:
        tokenizers = self.tokenizers
        return {
            "src_vocab_size": tokenizers.src.vocab_size,
            "tgt_vocab_size": tokenizers.tgt.vocab_size,
            "joint_vocab": tokenizers.src is tokenizers.tgt,
            "pad_id": PAD_ID,
            "bos_id": BOS_ID,
            "eos_id": EOS_ID,
            "tokenizers": tokenizers,
        }

    @property
    def max_seq_len(self) -> int:
        evals = [self.split_data(split) for split in ("valid", "test") if split in self.splits]
        trained = [self.batching.max_len] if "train" in self.splits else []
        cut = self.batching.max_eval_len
        longest = [min(data.longest(), cut) for data in evals if data.present]
        return max([*trained, *longest], default=0)

    def has_split(self, split: str) -> bool:
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

    def batched(self, split: str) -> tuple[PairDataset, list[np.ndarray]]:
        """A split's dataset and its batches (positions into the dataset), made once."""
        if split not in self._sets:
            data = self._require(split)
            self._sets[split] = (
                self._training(data) if split == "train" else self._eval(split, data)
            )
        return self._sets[split]

    def _training(self, data: SplitData) -> tuple[PairDataset, list[np.ndarray]]:
        b = self.batching
        too_long, skewed = length_filter(
            data.src_lengths(), data.tgt_lengths(), b.max_len, b.max_len_ratio, b.cut_sources
        )
        rows = np.flatnonzero(~(too_long | skewed))
        ratio = f" and {skewed.sum()} with a length ratio over {b.max_len_ratio}"
        cut = f"; {(data.src_lengths()[rows] > b.max_len).sum()} sources cut to their last "
        cut += f"{b.max_len} tokens"
        log.info(
            "train: dropped %d pairs longer than max_len=%d%s%s", too_long.sum(), b.max_len,
            "" if b.max_len_ratio is None else ratio, cut if b.cut_sources else "",
        )  # fmt: skip
        if b.train_size is not None:
            if b.train_size > len(rows):
                raise ConfigError(
                    f"task.data.train_size={b.train_size} exceeds the {len(rows)} training "
                    "pairs left after filtering: lower it, or set null to use them all"
                )
            rng = np.random.default_rng(b.data_seed)
            rows = np.sort(rng.choice(rows, b.train_size, replace=False))
        cut = b.max_len if b.cut_sources else None
        dataset = PairDataset(data, rows, cut=cut, keep_end=b.cut_sources)
        src, tgt = dataset.src_lengths(), dataset.tgt_lengths()
        order = bucketed_order(src, tgt, b.sort_chunk, np.random.default_rng(self.seed))
        return dataset, self._log_batches(
            "train", token_batches(order, src, tgt, b.max_tokens), dataset
        )

    def _eval(self, split: str, data: SplitData) -> tuple[PairDataset, list[np.ndarray]]:
        cut = self.batching.max_eval_len
        long = (data.src_lengths() > cut) | (data.tgt_lengths() > cut)
        if long.any():
            lines = (np.asarray(data.line)[long] + 1).tolist()
            shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
            log.warning(
                "%s: %d pairs are longer than task.data.max_eval_len=%d tokens and are cut to "
                "it (lines %s); their references are scored whole",
                split, len(lines), cut, shown,
            )  # fmt: skip
        dataset = PairDataset(data, np.arange(len(data)), cut, self.batching.cut_sources)
        src, tgt = dataset.src_lengths(), dataset.tgt_lengths()
        batches = token_batches(length_order(src, tgt), src, tgt, self.batching.max_tokens)
        return dataset, self._log_batches(split, batches, dataset)

    def _log_batches(
        self, split: str, batches: list[np.ndarray], dataset: PairDataset
    ) -> list[np.ndarray]:
        log.info(
            "%s: %d pairs in %d batches of at most %d tokens; %.1f%% of batch tokens are padding",
            split, len(dataset), len(batches), self.batching.max_tokens,
            100 * padding_fraction(batches, dataset.src_lengths(), dataset.tgt_lengths()),
        )  # fmt: skip
        return batches

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset, batches = self.batched(split)
        world, rank = self.world()
        sampler = TokenBatchSampler(batches, shuffle, self.seed, world, rank)
        return ResumableLoader(
            dataset, sampler=sampler, batch_size=None, collate_fn=collate,
            num_workers=self.num_workers,
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
