"""The contract between a task's data and everything that uses it (train.py, eval.py, the
task's system): what they may ask of a task's LightningDataModule, and nothing else."""

from __future__ import annotations

from typing import Any

import lightning as L

IGNORE = -100  # a target excluded from losses and metrics (padding, markers): torch's default


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

    def world(self) -> tuple[int, int]:
        """(processes, this one's rank) of the trainer the data serves; (1, 0) outside one."""
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer else (1, 0)

    def restore(self, checkpoint: dict[str, Any], stage: str) -> None:
        """Serve `stage` ("validate" or "test") with what the checkpoint's model was trained
        with beyond its weights (a vocabulary). Data with nothing of the kind: nothing."""
