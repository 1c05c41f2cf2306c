"""Language modeling data: running text, from files or the hub, as windows of a token stream.

Sources (`source`):
  local  `dir`: a directory of {train,valid,test}.txt (test optional); or `file`: one text
         file cut into contiguous train/valid[/test] parts by `fractions` of its characters
         (nanoGPT's 0.9/0.1 by default).
  hub    Hugging Face `datasets` by `dataset`, `subset` and `revision` (WikiText-103 raw,
         PG-19): the rows of `text_column`, one line each (attnlab.data.hub: an unreachable
         hub stops at once, naming the local alternative).
  corpus `dir`: .txt, .jsonl(.gz, .zst) and .parquet files of documents, one stream whose
         last `val_tokens` (and `test_tokens` before them) are held out.
  hub_corpus  the training split of a hub `dataset` (FineWeb-Edu, OpenWebText) streamed as
         documents, held out as a corpus; keyed by the commit `revision` resolves to.
Each is a class of attnlab.data.text_sources.

Tokenizers, the stream cache and evaluation windows: attnlab.tasks.lm.stream. Training draws
`batch_size` windows of `block_size` + 1 tokens at random offsets of the training stream (an
epoch is `train_windows` of them, by default as many as the stream has tokens / block_size),
seeded by `seed` and the epoch and restored exactly on resume (attnlab.data.loader); DDP
ranks draw from the same offsets, every num_replicas-th. Validation during training scores
the validation stream in non-overlapping windows of `block_size` (all of it); an evaluation
(the test, or eval.py's split=val) scores the split at every length of `eval_lengths` both in
non-overlapping windows and in sliding windows of stride `eval_stride`. A length beyond what
the model's positional encoding was built for is not applicable, and said so (`limit_lengths`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from attnlab.config.values import require_counts
from attnlab.data.batching import TokenBatchSampler
from attnlab.data.loader import ResumableLoader
from attnlab.data.task import NON_OVERLAPPING, WINDOWS, TaskData, Windows
from attnlab.data.text import available_cores
from attnlab.data.text_sources import SPLITS, make_source
from attnlab.data.tokenizer import (
    TOKENIZER_KEY,
    StreamTokenizer,
    TokenizerSettings,
    build_once,
    cache_key,
    load_or_train,
)
from attnlab.errors import ConfigError
from attnlab.tasks.lm.stream import (
    CharTokenizer,
    EvalWindows,
    PieceTokenizer,
    Stream,
    TrainWindows,
    WindowSampler,
    open_stream,
    restore_tokenizer,
)

log = logging.getLogger(__name__)

TOKENIZERS = ("char", "sentencepiece")
STAGE_SPLITS = {"fit": ("train", "valid"), "validate": ("valid",), "test": ("test",)}


class LMDataModule(TaskData):
    """The options are task.data's (conf/task/lm.yaml)."""

    def __init__(
        self,
        source: str,
        dir: str | None,
        file: str | None,
        fractions: list[float],
        dataset: str | None,
        subset: str | None,
        revision: str | None,
        text_column: str,
        val_tokens: int,
        test_tokens: int,
        tokenizer: str,
        vocab_size: int,
        model_type: str,
        character_coverage: float,
        tokenizer_lines: int,
        block_size: int,
        batch_size: int,
        tokens_per_step: int | None,
        train_windows: int | None,
        eval_lengths: list[int] | None,
        eval_stride: int | None,
        eval_batch_tokens: int,
        seed: int,
        num_workers: int,
        num_threads: int | None,
        cache_dir: str,
    ) -> None:
        super().__init__()
        if tokenizer not in TOKENIZERS:
            raise ConfigError(
                f"task.data.tokenizer={tokenizer!r} is not one of: {', '.join(TOKENIZERS)}"
            )
        require_counts("task.data", least=2, block_size=block_size)
        require_counts("task.data", batch_size=batch_size, eval_batch_tokens=eval_batch_tokens)
        require_counts("task.data", tokenizer_lines=tokenizer_lines)
        require_counts("task.data", least=0, num_workers=num_workers)
        if train_windows is not None:
            require_counts("task.data", train_windows=train_windows)
        if tokens_per_step is not None:
            require_counts("task.data", tokens_per_step=tokens_per_step)
        self.tokens_per_step = tokens_per_step
        self.lengths = list(eval_lengths or [block_size * k for k in (1, 2, 4, 8, 16)])
        for length in self.lengths:
            require_counts("task.data.eval_lengths", least=1, item=length)
        self.stride = block_size if eval_stride is None else eval_stride
        require_counts("task.data", eval_stride=self.stride)
        self.cache = Path(cache_dir).expanduser().resolve()
        hub = (dataset, subset, revision, text_column)
        held_out = (val_tokens, test_tokens)
        self.source = make_source(source, dir, file, list(fractions), hub, held_out, self.cache)
        self.kind, self.block_size, self.batch_size = tokenizer, block_size, batch_size
        self.settings = TokenizerSettings(vocab_size, model_type, character_coverage)
        self.tokenizer_lines, self.train_windows = tokenizer_lines, train_windows
        self.batch_tokens, self.seed, self.num_workers = eval_batch_tokens, seed, num_workers
        self.num_threads = num_threads or available_cores()
        self.splits = SPLITS
        self.not_applicable: list[int] = []  # eval lengths beyond the model's (limit_lengths)
        self._tokenizer: StreamTokenizer | None = None
        self._streams: dict[str, Stream] = {}

    # tokenizer and streams

    @property
    def tokenizer(self) -> StreamTokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._train_tokenizer()
        return self._tokenizer

    def _train_tokenizer(self) -> StreamTokenizer:
        identity = {"corpus": self.source.identity("train")}
        if self.kind == "char":
            entry = self.cache / "tokenizers" / cache_key({**identity, "tokenizer": "char"})
            build_once(entry, lambda partial: self._write_characters(partial))
            return CharTokenizer((entry / "characters.txt").read_text(encoding="utf-8"))
        identity["lines"] = self.tokenizer_lines
        model = load_or_train(
            self.cache / "tokenizers", identity, self.settings,
            lambda: self.source.sample_lines(self.tokenizer_lines), self.num_threads,
        )  # fmt: skip
        return PieceTokenizer(model)

    def _write_characters(self, partial: Path) -> None:
        text = self.source.vocabulary_text(self.tokenizer_lines)
        characters = CharTokenizer(text).characters
        (partial / "characters.txt").write_text(characters, encoding="utf-8")

    def stream(self, split: str) -> Stream:
        if split not in self._streams:
            whole, built = open_stream(
                self.cache,
                lambda: self.source.units(split),
                self.tokenizer,
                self.source.identity(split),
                self.source.describe(split),
                self.num_threads,
            )
            where = self.source.part(split, len(whole)) if whole.present else None
            stream = whole.part(*where) if where is not None else whole.absent()
            if stream.present:
                log.info(
                    "%s: %d tokens (%s %s)", self.source.describe(split), len(stream),
                    "tokenized into" if built else "cached in", stream.directory,
                )  # fmt: skip
            if stream.present and split != "train" and stream.unknown:
                log.warning(
                    "%s: %d of %d %s are not in the training split's vocabulary and are "
                    "scored as one unknown symbol", split, stream.unknown, len(stream),
                    "characters" if self.kind == "char" else "tokens",
                )  # fmt: skip
            self._streams[split] = stream
        return self._streams[split]

    def _require(self, split: str, least: int) -> Stream:
        stream = self.stream(split)
        if not stream.present or len(stream) < least:
            hint = {
                "test": "pass test=false to skip testing (eval.py: split=val), or give "
                "a test split (test.txt, three task.data.fractions, or a corpus's "
                "task.data.test_tokens)",
                "train": f"one window of task.data.block_size={self.block_size} tokens and "
                "the token after it; give a longer text, a larger share of it "
                "(task.data.fractions, or a corpus's val_tokens) or a smaller block_size",
            }.get(
                split,
                "a token and the one after it, to score; give a longer text or a larger share "
                "of it (valid.txt, or task.data.fractions)",
            )
            found = f"{len(stream)} tokens" if stream.present else "not found"
            raise ConfigError(
                f"the {split} split ({self.source.describe(split)}: {found}) needs at least "
                f"{least} tokens: {hint}"
            )
        return stream

    # the contract (attnlab.data.task)

    def restore(self, checkpoint: dict[str, Any], stage: str) -> None:
        """Serve only `stage`'s split, tokenized by the checkpoint's tokenizer."""
        self._tokenizer = restore_tokenizer(checkpoint.get(TOKENIZER_KEY))
        self._streams, self.splits = {}, STAGE_SPLITS[stage]

    def model_kwargs(self) -> dict[str, Any]:
        return {"vocab_size": self.tokenizer.vocab_size, "tokenizer": self.tokenizer}

    def batches_per_step(self, world: int) -> int | None:
        """tokens_per_step / (batch_size · block_size · world), which must be a whole number."""
        if self.tokens_per_step is None:
            return None
        per_batch = self.batch_size * self.block_size * world
        if self.tokens_per_step % per_batch:
            raise ConfigError(
                f"task.data.tokens_per_step={self.tokens_per_step} is not a multiple of the "
                f"{per_batch:,} tokens that {world} process(es) train on in one batch "
                f"(batch_size={self.batch_size} x block_size={self.block_size}): pick a "
                "multiple, or another batch_size"
            )
        return self.tokens_per_step // per_batch

    @property
    def max_seq_len(self) -> int:
        """The training windows' length: evaluation lengths beyond what the model takes are
        not applicable (limit_lengths) rather than an error."""
        return self.block_size

    def limit_lengths(self, bound: int | None) -> list[int]:
        """Evaluate only the lengths up to `bound` (the model's positions); return the others."""
        self.not_applicable = [n for n in self.lengths if bound is not None and n > bound]
        return self.not_applicable

    def has_split(self, split: str) -> bool:
        return split in self.splits and self.stream(split).present

    # Lightning hooks

    def prepare_data(self) -> None:
        for split in self.splits:
            self.stream(split)

    def train_dataloader(self) -> DataLoader:
        stream = self._require("train", self.block_size + 1)
        count = self.train_windows or max(1, len(stream) // self.block_size)
        if self.tokens_per_step is not None:  # whole steps: each of tokens_per_step tokens
            per_step = self.tokens_per_step // self.block_size
            count = -(-count // per_step) * per_step
        dataset = TrainWindows(stream, self.block_size, count)
        world, rank = self.world()
        sampler = WindowSampler(dataset, num_replicas=world, rank=rank, seed=self.seed)
        return ResumableLoader(
            dataset, sampler=sampler, batch_size=self.batch_size, num_workers=self.num_workers
        )

    def evaluated(self) -> tuple[list[int], tuple[Windows, ...]]:
        """The lengths and ways of cutting windows an evaluation scores: while fitting,
        non-overlapping windows of block_size; else every applicable eval length, both ways."""
        if self.trainer is not None and self.trainer.state.fn == TrainerFn.FITTING:
            return [self.block_size], (NON_OVERLAPPING,)
        return [n for n in self.lengths if n not in self.not_applicable], WINDOWS

    def _eval_loader(self, split: str) -> DataLoader:
        stream = self._require(split, 2)
        dataset = EvalWindows(stream, *self.evaluated(), self.stride, self.batch_tokens)
        world, rank = self.world()
        sampler = TokenBatchSampler(dataset.batches, False, self.seed, world, rank)
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("valid")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
