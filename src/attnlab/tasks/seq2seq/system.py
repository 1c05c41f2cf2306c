"""Sequence to sequence with an encoder-decoder: the system of translation and dialogue.

Trains with label-smoothed cross-entropy on teacher-forced targets. Each evaluation logs
`<stage>/loss` and `<stage>/ppl` (the perplexity of the targets, without smoothing, over
every target token), then the scores of the task (`scores`, attnlab.metrics: BLEU and chrF for
translation; BLEU-1/4, ROUGE-L, distinct-1/2 and the length ratio for dialogue) of generated
hypotheses against the references. Validation generates with beam search of decode.val_beam
(1: greedy), for the first `val_generate` pairs of the split (null: all); testing generates
for every pair with decode.strategy (attnlab.decoding.encoder_decoder). Scores are computed once every rank
has every hypothesis, so each rank logs the same value. Hypotheses are written in corpus
order to <run dir>/hypotheses/; a few (source, reference, hypothesis) triples go to the log
at each validation, and to W&B as a table.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger
from torch import Tensor
from torchmetrics import MeanMetric

from attnlab.config.values import require_counts
from attnlab.data.task import PairBatch, TaskData
from attnlab.data.tokenizer import UNK_ID, VOCABULARY_KEY, Tokenizers
from attnlab.decoding.encoder_decoder import DecodeConfig, generate
from attnlab.errors import ConfigError
from attnlab.files import write_text
from attnlab.metrics import SCORERS, signatures
from attnlab.model.architecture import Architecture
from attnlab.model.maps import attention_maps
from attnlab.model.transformer import EncoderDecoder
from attnlab.systems.base import System, Vocabulary
from attnlab.systems.optim import Optim

log = logging.getLogger(__name__)
SAMPLES = 3  # (source, reference, hypothesis) triples logged per validation


def gather_objects(items: list) -> list:
    """Everyone's items on every rank (a no-op without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return items
    gathered: list[list] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


class Seq2SeqSystem(System):
    settings = MappingProxyType({**System.settings, "decode": DecodeConfig})

    def __init__(
        self,
        architecture: Architecture,
        optim: Optim,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        label_smoothing: float,
        scores: str,
        val_generate: int | None,
        decode: DecodeConfig,
        joint_vocab: bool = True,
        tokenizers: Tokenizers | None = None,
    ) -> None:
        super().__init__(architecture, optim)
        self.tokenizers = tokenizers  # from the data; from the checkpoint when loaded
        self.net = self.network(
            self.architecture, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
            joint_vocab=joint_vocab,
        )  # fmt: skip
        self.decode_config = decode
        if scores not in SCORERS:
            raise ConfigError(f"task.system.scores={scores!r} is not one of: {', '.join(SCORERS)}")
        if val_generate is not None:
            require_counts("task.system", val_generate=val_generate)
        self.scores, self.val_generate = scores, val_generate
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.label_smoothing = label_smoothing
        self.nll = MeanMetric()  # per target token, for the perplexity
        self.generator: torch.Generator | None = None  # sampling strategies, at test time
        self.hypotheses: list[tuple[int, str, str, str]] = []  # index, source, ref, hypothesis

    @classmethod
    def network(
        cls, architecture: Architecture, src_vocab_size: int, tgt_vocab_size: int,
        joint_vocab: bool, **unused: Any,
    ) -> EncoderDecoder:  # fmt: skip
        model, attention = architecture.model, architecture.attention
        return EncoderDecoder(model, attention, src_vocab_size, tgt_vocab_size, joint_vocab)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sacrebleu": signatures(self.scores)}

    def attention_maps(self, batch: PairBatch) -> dict[str, Tensor]:
        src_length = (batch["src"] != self.pad_id).sum(-1)
        row = int(src_length.argmax())
        src = batch["src"][row : row + 1, : int(src_length[row])].to(self.device)
        tgt = batch["tgt"][row : row + 1]
        tgt = tgt[:, : int((tgt != self.pad_id).sum()) - 1].to(self.device)  # the decoder's input
        maps = attention_maps(self.net, lambda: self.net(src, src == self.pad_id, tgt))
        return {name: weights[0] for name, weights in maps.items()}

    def check_lengths(self, data: TaskData) -> None:
        self.net.encoder.check_length(data.max_seq_len)
        self.net.decoder.check_length(data.max_seq_len, data.max_seq_len)

    def batch_tokens(self, batch: PairBatch) -> int:
        # each source with its EOS, and the decoder's input (teacher forcing: all but the last
        # column, so BOS, the target, and the EOS of rows shorter than the longest)
        src, read = batch["src"], batch["tgt"][:, :-1]
        return int((src != self.pad_id).sum() + (read != self.pad_id).sum())

    def batch_examples(self, batch: PairBatch) -> int:
        return batch["src"].shape[0]

    def logits(self, batch: PairBatch) -> Tensor:
        src, tgt = batch["src"], batch["tgt"]
        return self.net(src, src == self.pad_id, tgt[:, :-1])

    def loss(self, logits: Tensor, tgt: Tensor, smoothing: float) -> Tensor:
        flat = logits.flatten(0, 1)
        return F.cross_entropy(
            flat, tgt[:, 1:].flatten(), ignore_index=self.pad_id, label_smoothing=smoothing
        )

    def training_step(self, batch: PairBatch, batch_idx: int) -> Tensor:
        loss = self.loss(self.logits(batch), batch["tgt"], self.label_smoothing)
        tokens = int((batch["tgt"][:, 1:] != self.pad_id).sum())
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens)
        return loss

    def _evaluate(self, batch: PairBatch, stage: str) -> None:
        logits, tgt = self.logits(batch), batch["tgt"]
        tokens = int((tgt[:, 1:] != self.pad_id).sum())
        loss = self.loss(logits, tgt, self.label_smoothing)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", batch_size=tokens, sync_dist=True)
        self.nll.update(self.loss(logits, tgt, 0.0), weight=tokens)
        rows = torch.arange(len(tgt), device=tgt.device)
        if stage == "val" and self.val_generate is not None:
            rows = rows[batch["index"] < self.val_generate]
        if len(rows) == 0:
            return
        src = batch["src"][rows]
        strategy, beam = ("beam", self.decode_config.val_beam) if stage == "val" else (
            self.decode_config.strategy, self.decode_config.beam
        )  # fmt: skip
        ids = generate(
            self.net, src, src == self.pad_id, self.bos_id, self.eos_id, self.decode_config,
            strategy, beam, self.generator,
        )  # fmt: skip
        hypotheses = [self.tokenizers.tgt.decode(h) for h in ids]
        sources = [self.tokenizers.src.decode(s) for s in src]
        references = [batch["ref"][i] for i in rows.tolist()]
        indices = batch["index"][rows].tolist()
        self.hypotheses += zip(indices, sources, references, hypotheses, strict=True)

    def validation_step(self, batch: PairBatch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def on_test_epoch_start(self) -> None:
        seed = self.decode_config.seed + self.global_rank  # each rank samples its own pairs
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def test_step(self, batch: PairBatch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _finish(self, stage: str) -> None:
        self.log(f"{stage}/ppl", torch.exp(self.nll.compute()), prog_bar=stage == "val")
        self.nll.reset()
        rows = sorted(gather_objects(self.hypotheses))
        self.hypotheses = []
        if not rows:  # a sanity check's batches may hold none of the first val_generate pairs
            return
        hypotheses, references = [row[3] for row in rows], [row[2] for row in rows]
        # every rank scored every hypothesis: the values agree, sync_dist only confirms it
        for name, value in SCORERS[self.scores](hypotheses, references).items():
            self.log(f"{stage}/{name}", value, sync_dist=True)
        if self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        name = f"{stage}_epoch{self.current_epoch:03d}.txt" if stage == "val" else "test.txt"
        path = Path(self.trainer.default_root_dir) / "hypotheses" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, "".join(f"{hypothesis}\n" for *_, hypothesis in rows))
        if stage == "val":
            self._log_samples(rows[:SAMPLES])

    def _log_samples(self, rows: list[tuple[int, str, str, str]]) -> None:
        for _, source, reference, hypothesis in rows:
            log.info("sample\n  src: %s\n  ref: %s\n  hyp: %s", source, reference, hypothesis)
        for logger in self.loggers:
            if isinstance(logger, WandbLogger):
                data = [list(row[1:]) for row in rows]
                logger.log_text(
                    "val/samples", columns=["source", "reference", "hypothesis"], data=data
                )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[VOCABULARY_KEY] = self.tokenizers.serialized()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizers = Tokenizers.from_serialized(checkpoint[VOCABULARY_KEY])

    def vocabularies(self) -> dict[str, Vocabulary]:
        used = {"pad": self.pad_id, "unk": UNK_ID, "bos": self.bos_id, "eos": self.eos_id}
        return {
            "source tokenizer": Vocabulary(self.tokenizers.src, self.hparams.src_vocab_size, used),
            "target tokenizer": Vocabulary(self.tokenizers.tgt, self.hparams.tgt_vocab_size, used),
        }

    def on_validation_epoch_end(self) -> None:
        self._finish("val")

    def on_test_epoch_end(self) -> None:
        self._finish("test")
