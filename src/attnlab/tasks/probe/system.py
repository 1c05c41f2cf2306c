"""Per-token classification with an encoder (or a causal stack): the position probe's system.

Logs train/loss, train/acc; {val,test}/loss, /acc (token accuracy), /seq_acc (every token of
the sequence right) and /acc_pos/<p> (accuracy at position p, 1-based).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from attnlab.data.task import IGNORE, TaggedBatch, TaskData
from attnlab.errors import ConfigError
from attnlab.metrics import AccuracyByPosition
from attnlab.model.architecture import Architecture
from attnlab.model.maps import attention_maps
from attnlab.model.transformer import Tagger
from attnlab.systems.base import System
from attnlab.systems.optim import Optim


def token_accuracy(num_classes: int) -> MulticlassAccuracy:
    return MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE)


def eval_metrics(num_classes: int) -> nn.ModuleDict:
    return nn.ModuleDict(
        {
            "acc": token_accuracy(num_classes),
            "seq_acc": MeanMetric(),
            "acc_pos": AccuracyByPosition(num_classes),
        }
    )


class TaggerSystem(System):
    def __init__(
        self,
        architecture: Architecture,
        optim: Optim,
        vocab_size: int,
        num_classes: int,
        causal: bool,
    ) -> None:
        super().__init__(architecture, optim)
        self.net = self.network(
            self.architecture, vocab_size=vocab_size, num_classes=num_classes, causal=causal
        )
        self.train_metrics = nn.ModuleDict({"acc": token_accuracy(num_classes)})
        self.val_metrics = eval_metrics(num_classes)
        self.test_metrics = eval_metrics(num_classes)

    @classmethod
    def network(
        cls, architecture: Architecture, vocab_size: int, num_classes: int, causal: bool,
        **unused: Any,
    ) -> Tagger:  # fmt: skip
        model, attention = architecture.model, architecture.attention
        return Tagger(model, attention, vocab_size, num_classes, causal)

    def _step(self, batch: TaggedBatch, stage: str) -> Tensor:
        logits = self.net(batch["tokens"], batch["padding"])
        targets = batch["targets"]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        preds = logits.argmax(-1)
        scored = targets != IGNORE
        metrics = getattr(self, f"{stage}_metrics")
        batch_size = targets.shape[0]
        evaluating = stage != "train"  # epoch-level metrics, over every rank's batches
        metrics["acc"].update(preds, targets)
        self.log(f"{stage}/loss", loss, prog_bar=True, batch_size=batch_size, sync_dist=evaluating)
        self.log(f"{stage}/acc", metrics["acc"], prog_bar=True, batch_size=batch_size)
        if evaluating:
            metrics["seq_acc"].update(((preds == targets) | ~scored).all(-1).float())
            metrics["acc_pos"].update(preds[scored], targets[scored])
            self.log(f"{stage}/seq_acc", metrics["seq_acc"], batch_size=batch_size)
        return loss

    def _log_by_position(self, stage: str) -> None:
        accuracy = getattr(self, f"{stage}_metrics")["acc_pos"]
        for position, value in enumerate(accuracy.compute().tolist(), start=1):
            if value == value:  # NaN: no token at this position was evaluated
                self.log(f"{stage}/acc_pos/{position}", value, sync_dist=True)  # equal on all ranks
        accuracy.reset()

    def attention_maps(self, batch: TaggedBatch) -> dict[str, Tensor]:
        visible = ~batch["padding"]
        row = int(visible.sum(-1).argmax())
        tokens = batch["tokens"][row : row + 1, visible[row]].to(self.device)
        maps = attention_maps(self.net, lambda: self.net(tokens, None))
        return {name: weights[0] for name, weights in maps.items()}

    def check_lengths(self, data: TaskData) -> None:
        self.net.stack.check_length(data.max_seq_len)
        needed, classes = data.model_kwargs()["num_classes"], self.hparams.num_classes
        if needed > classes:
            raise ConfigError(
                f"the data has positions up to {needed} but the model predicts positions 1.."
                f"{classes} (the larger of its training run's max_len and eval_max_len): "
                f"evaluate at most {classes} positions, or train with "
                f"task.data.eval_max_len={needed} so that its output covers them"
            )

    def batch_tokens(self, batch: TaggedBatch) -> int:
        return int((~batch["padding"]).sum())

    def batch_examples(self, batch: TaggedBatch) -> int:
        return batch["padding"].shape[0]

    def training_step(self, batch: TaggedBatch, batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: TaggedBatch, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: TaggedBatch, batch_idx: int) -> None:
        self._step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_by_position("val")

    def on_test_epoch_end(self) -> None:
        self._log_by_position("test")
