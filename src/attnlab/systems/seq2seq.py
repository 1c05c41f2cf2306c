"""Sequence to sequence with an encoder-decoder: translation's system.

Trains with label-smoothed cross-entropy on teacher-forced targets. Each validation logs
val/loss and the corpus BLEU and chrF of greedy (decode.val_beam) hypotheses; testing uses
beam search (decode.beam). BLEU and chrF are sacreBLEU's own (its defaults: 13a
tokenization, exp smoothing; 0-100), on detokenized hypotheses against the raw references,
computed once every rank has every hypothesis, so each rank logs the same value.
Hypotheses are written in corpus order to <run dir>/hypotheses/; a few sample translations
go to the log at each validation, and to W&B as a table.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger
from sacrebleu.metrics import BLEU, CHRF
from torch import Tensor

from attnlab.data.task import TaskData
from attnlab.decoding import DecodeConfig, translate
from attnlab.model.config import AttentionConfig, ModelConfig
from attnlab.model.maps import attention_maps
from attnlab.model.transformer import EncoderDecoder
from attnlab.systems.base import System
from attnlab.tokenizer import VOCABULARY_KEY, Tokenizers

log = logging.getLogger(__name__)
SAMPLES = 3  # sample translations logged per validation


def metric_signatures() -> dict[str, str]:
    """sacreBLEU's signatures of the BLEU and chrF computed here (one reference per sentence;
    sacreBLEU states a signature only once it has scored something)."""
    signatures = {}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        metric.corpus_score(["a"], [["a"]])
        signatures[name] = str(metric.get_signature())
    return signatures


def gather_objects(items: list) -> list:
    """Everyone's items on every rank (a no-op without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return items
    gathered: list[list] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


class Seq2SeqSystem(System):
    def __init__(
        self,
        model: dict,
        pe: dict,
        norm: dict,
        synthesizer: dict,
        optim: dict,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        joint_vocab: bool = True,
        label_smoothing: float = 0.1,
        decode: dict | None = None,
        tokenizers: Tokenizers | None = None,
    ) -> None:
        super().__init__(optim)
        # loggers get the run's config (train.py); the tokenizers go in as bytes (below)
        self.save_hyperparameters(logger=False, ignore=["tokenizers"])
        self.tokenizers = tokenizers  # from the data; from the checkpoint when loaded
        self.net = EncoderDecoder(
            ModelConfig.from_config(model),
            AttentionConfig.from_config(pe, norm, synthesizer),
            src_vocab_size,
            tgt_vocab_size,
            joint_vocab,
        )
        self.decode_config = DecodeConfig(**(decode or {}))
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.label_smoothing = label_smoothing
        self.hypotheses: list[
            tuple[int, str, str, str]
        ] = []  # index, source, reference, hypothesis

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sacrebleu": metric_signatures()}

    def attention_maps(self, batch: dict) -> dict[str, Tensor]:
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

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, int]:
        src, tgt = batch["src"], batch["tgt"]
        logits = self.net(src, src == self.pad_id, tgt[:, :-1])
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            tgt[:, 1:].flatten(),
            ignore_index=self.pad_id,
            label_smoothing=self.label_smoothing,
        )
        return loss, int((tgt[:, 1:] != self.pad_id).sum())

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, tokens = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens)
        return loss

    def _evaluate(self, batch: dict, stage: str, beam: int) -> None:
        loss, tokens = self.loss(batch)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", batch_size=tokens, sync_dist=True)
        src = batch["src"]
        ids = translate(
            self.net, src, src == self.pad_id, self.bos_id, self.eos_id, self.decode_config, beam
        )
        hypotheses = [self.tokenizers.tgt.decode(h) for h in ids]
        sources = [self.tokenizers.src.decode(s) for s in src]
        self.hypotheses += zip(
            batch["index"].tolist(), sources, batch["ref"], hypotheses, strict=True
        )

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.decode_config.val_beam)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.decode_config.beam)

    def _finish(self, stage: str) -> None:
        rows = sorted(gather_objects(self.hypotheses))
        self.hypotheses = []
        hypotheses, references = [row[3] for row in rows], [[row[2] for row in rows]]
        bleu, chrf = BLEU(), CHRF()
        bleu_score = bleu.corpus_score(hypotheses, references)
        # every rank scored every hypothesis: the values agree, sync_dist only confirms it
        self.log(f"{stage}/bleu", bleu_score.score, prog_bar=True, sync_dist=True)
        self.log(f"{stage}/chrf", chrf.corpus_score(hypotheses, references).score, sync_dist=True)
        if stage == "test":
            log.info("%s (%s)", bleu_score, bleu.get_signature())
        if self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        name = f"{stage}_epoch{self.current_epoch:03d}.txt" if stage == "val" else "test.txt"
        path = Path(self.trainer.default_root_dir) / "hypotheses" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{hypothesis}\n" for *_, hypothesis in rows), encoding="utf-8")
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
        checkpoint[VOCABULARY_KEY] = self.tokenizers.serialized()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizers = Tokenizers.from_serialized(checkpoint[VOCABULARY_KEY])

    def on_validation_epoch_end(self) -> None:
        self._finish("val")

    def on_test_epoch_end(self) -> None:
        self._finish("test")
