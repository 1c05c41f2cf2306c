"""AdamW with linear warmup and a decay schedule, as Lightning's `configure_optimizers` wants."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from torch import nn

from attnlab.config.build import settings_node
from attnlab.config.values import is_number, require_counts
from attnlab.errors import ConfigError

SCHEDULES = ("constant", "linear", "cosine", "inverse_sqrt")


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Multiplier on the peak learning rate at optimizer step `step` (0-based)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / (step + 1))
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * decay


@dataclass(frozen=True)
class Optim:
    """The `task.optim` node: AdamW (Loshchilov & Hutter 2019), its learning rate warmed up
    linearly for `warmup_steps` and then decayed by `schedule` to `min_lr_ratio` of the peak.
    Checked when made, before any training."""

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    warmup_steps: int
    schedule: str
    min_lr_ratio: float
    # what runs recorded before eps and min_lr_ratio were set in the task's YAML trained with
    recorded_before: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"eps": 1e-8, "min_lr_ratio": 0.0}
    )

    def __post_init__(self) -> None:
        betas = self.betas
        checks = {
            "lr": (self.lr, is_number(self.lr) and self.lr > 0, "a positive number"),
            "weight_decay": (
                self.weight_decay, is_number(self.weight_decay) and self.weight_decay >= 0,
                "at least 0",
            ),
            "eps": (self.eps, is_number(self.eps) and self.eps > 0, "a positive number"),
            "min_lr_ratio": (
                self.min_lr_ratio, is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1,
                "in [0, 1]",
            ),
            "betas": (
                betas,
                isinstance(betas, list | tuple) and len(betas) == 2
                and all(is_number(b) and 0 <= b < 1 for b in betas),
                "two numbers in [0, 1), e.g. [0.9, 0.98]",
            ),
        }  # fmt: skip
        for name, (value, ok, expected) in checks.items():
            if not ok:
                raise ConfigError(f"task.optim.{name}={value!r} must be {expected}")
        require_counts("task.optim", least=0, warmup_steps=self.warmup_steps)
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"task.optim.schedule={self.schedule!r} is not one of: {', '.join(SCHEDULES)}"
            )
        object.__setattr__(self, "betas", tuple(betas))

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> Optim:
        return settings_node(cls, "task.optim", node)

    def as_data(self) -> dict[str, Any]:
        return {**asdict(self), "betas": list(self.betas)}

    def configure(self, model: nn.Module, total_steps: int) -> dict:
        """Lightning's optimizer and step-wise scheduler for `model`: weight decay on matrices
        only (not on biases, norms' gains or scalar mixing weights); on a GPU, torch's fused
        AdamW."""
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [  # named for LearningRateMonitor: train/lr/decay, train/lr/no_decay
            {
                "params": [p for p in params if p.dim() >= 2],
                "weight_decay": self.weight_decay,
                "name": "decay",
            },
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"},
        ]
        fused = bool(params) and params[0].is_cuda  # one kernel for every tensor (nanoGPT's)
        optimizer = torch.optim.AdamW(
            groups, lr=self.lr, betas=self.betas, eps=self.eps, fused=fused or None
        )
        factor = functools.partial(
            lr_factor, warmup=self.warmup_steps, total=total_steps, schedule=self.schedule,
            min_ratio=self.min_lr_ratio,
        )  # fmt: skip
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        schedule_config = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}
        return {"optimizer": optimizer, "lr_scheduler": schedule_config}
