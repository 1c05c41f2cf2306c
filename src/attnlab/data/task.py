"""The contract between a task's data and everything that uses it (train.py, eval.py, the
task's system): what they may ask of a task's LightningDataModule, and the batch it gives
each kind of system (B examples, right-padded)."""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

import lightning as L
from torch import Tensor

IGNORE = -100  # a target excluded from losses and metrics (padding, markers): torch's default


class TaggedBatch(TypedDict):
    """TaggerSystem's (the position probe): a class for each token."""

    tokens: Tensor  # [B, T] ids, padded
    targets: Tensor  # [B, T] each token's class; IGNORE at markers and padding
    padding: Tensor  # [B, T] True at padding


class PairBatch(TypedDict):
    """Seq2SeqSystem's (translation, dialogue): source and target ids, PAD_ID-padded."""

    src: Tensor  # [B, S] source ids, then EOS
    tgt: Tensor  # [B, T] BOS, target ids, EOS
    ref: list[str]  # the raw target texts (whitespace-stripped), for the metrics
    index: Tensor  # [B] each pair's 0-based line in its split: the corpus order


class AnswerBatch(TypedDict):
    """SyntheticSystem's (the length-generalization tasks): what both layouts hold."""

    answers: Tensor  # [B, A] each output, then EOS; IGNORE at padding and given tokens: scored
    forced: Tensor  # [B, A] the given tokens of each output (and its end), IGNORE elsewhere
    lengths: Tensor  # [B] each input's length, in the task's measure
    buckets: Tensor  # [B] each example's test bucket (0 at validation)


class DecoderAnswerBatch(AnswerBatch):
    """task.arch=decoder: one sequence `input SEP output EOS` a row."""

    tokens: Tensor  # [B, T] the sequences, PAD-padded
    targets: Tensor  # [B, T-1] the next token where it is the answer's, else IGNORE
    prompt: Tensor  # [B] len(input) + 1: where the answer starts


class EncoderDecoderAnswerBatch(AnswerBatch):
    """task.arch=encoder_decoder: the input to the encoder, SEP then the output to the decoder."""

    src: Tensor  # [B, S] the inputs, PAD-padded
    tgt: Tensor  # [B, A] SEP, then the output


class Windows(NamedTuple):
    """A way to cut evaluated text into windows of a length L, and the names of what is
    measured over them: perplexity (`ppl<suffix>`) and bits per character (`bpc<suffix>`)."""

    name: str  # as reports say it
    suffix: str
    sliding: bool  # windows every `eval_stride` tokens, each scoring its last tokens only

    @property
    def perplexity(self) -> str:
        return f"ppl{self.suffix}"

    @property
    def bits(self) -> str:
        return f"bpc{self.suffix}"


NON_OVERLAPPING = Windows("non-overlapping", "", sliding=False)
SLIDING = Windows("sliding", "_sliding", sliding=True)
WINDOWS = (NON_OVERLAPPING, SLIDING)


class WindowBatch(TypedDict):
    """LMSystem's at evaluation (training batches are the windows alone, [B, L+1] ids): windows
    of one length, cut one way."""

    tokens: Tensor  # [B, L+1] the window's ids; position i predicts i+1
    first: Tensor  # [B] the first position scored in each window
    length: int  # the evaluation length L
    windows: Windows  # how they were cut: NON_OVERLAPPING or SLIDING


SyntheticBatch = DecoderAnswerBatch | EncoderDecoderAnswerBatch  # by task.arch


class TaskData(L.LightningDataModule):
    def has_split(self, split: str) -> bool:
        """Whether the data has this split ("train", "valid" or "test")."""
        raise NotImplementedError

    def model_kwargs(self) -> dict[str, Any]:
        """The system's constructor arguments that come from the data (vocabulary sizes,
        special ids, tokenizers, classes). Asked before Lightning prepares the data."""
        raise NotImplementedError

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the model will be given, specials included."""
        raise NotImplementedError

    def batches_per_step(self, world: int) -> int | None:
        """Batches each of `world` processes accumulates into one optimizer step, where the
        data fixes it (a language model's tokens_per_step); None: the trainer's setting."""
        return None

    def world(self) -> tuple[int, int]:
        """(processes, this one's rank) of the trainer the data serves; (1, 0) outside one."""
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer else (1, 0)

    def restore(self, checkpoint: dict[str, Any], stage: str) -> None:
        """Serve `stage` ("validate" or "test") with what the checkpoint's model was trained
        with beyond its weights (a vocabulary). Data with nothing of the kind: nothing."""
