"""AdamW with linear warmup and a decay schedule, as Lightning's `configure_optimizers` wants."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

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


def check_optim(
    lr: Any = 1e-3,
    weight_decay: Any = 0.01,
    betas: Any = (0.9, 0.98),
    eps: Any = 1e-8,
    warmup_steps: Any = 100,
    schedule: Any = "cosine",
    min_lr_ratio: Any = 0.0,
) -> None:
    """ConfigError naming the first task.optim setting out of range (before any training)."""
    checks = {
        "lr": (lr, is_number(lr) and lr > 0, "a positive number"),
        "weight_decay": (weight_decay, is_number(weight_decay) and weight_decay >= 0, "at least 0"),
        "eps": (eps, is_number(eps) and eps > 0, "a positive number"),
        "min_lr_ratio": (min_lr_ratio, is_number(min_lr_ratio) and 0 <= min_lr_ratio <= 1, "in [0, 1]"),
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
    require_counts("task.optim", least=0, warmup_steps=warmup_steps)
    if schedule not in SCHEDULES:
        raise ConfigError(f"task.optim.schedule={schedule!r} is not one of: {', '.join(SCHEDULES)}")


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
    """Weight decay on matrices only (not on biases, norms' gains or scalar mixing weights);
    on a GPU, torch's fused AdamW."""
    check_optim(lr, weight_decay, betas, eps, warmup_steps, schedule, min_lr_ratio)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [  # named for LearningRateMonitor: train/lr/decay, train/lr/no_decay
        {
            "params": [p for p in params if p.dim() >= 2],
            "weight_decay": weight_decay,
            "name": "decay",
        },
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"},
    ]
    fused = bool(params) and params[0].is_cuda  # one kernel for every tensor (nanoGPT's choice)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, schedule, min_lr_ratio)
    )
    schedule_config = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}
    return {"optimizer": optimizer, "lr_scheduler": schedule_config}
