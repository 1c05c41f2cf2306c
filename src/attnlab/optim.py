"""AdamW with linear warmup and a decay schedule, as Lightning's `configure_optimizers` wants."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.config import ConfigError

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


def configure_adamw(
    model: nn.Module,
    total_steps: int,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-8,
    warmup_steps: int = 100,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.0,
) -> dict:
    """Weight decay on matrices only (not on biases, norms' gains or scalar mixing weights)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"optim.schedule={schedule!r} is not one of: {', '.join(SCHEDULES)}")
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [  # named for LearningRateMonitor: train/lr/decay, train/lr/no_decay
        {
            "params": [p for p in params if p.dim() >= 2],
            "weight_decay": weight_decay,
            "name": "decay",
        },
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, schedule, min_lr_ratio)
    )
    schedule_config = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}
    return {"optimizer": optimizer, "lr_scheduler": schedule_config}
