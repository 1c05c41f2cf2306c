"""The devices a run trains on: refused where this machine lacks them, and named in its record."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig

from attnlab.errors import ConfigError  # fmt: skip
from attnlab.runner.job import in_sweep


def check_accelerator(accelerator: str) -> None:
    """Refuse an accelerator this machine lacks (Lightning's "gpu" is CUDA or Apple's MPS)."""
    import torch

    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    present = {"gpu": cuda or mps, "cuda": cuda, "mps": mps}.get(accelerator, True)
    if not present:
        raise ConfigError(
            f"trainer.accelerator={accelerator} needs a GPU, and this machine has none: use "
            "trainer=cpu, or trainer.accelerator=auto to use a GPU wherever there is one"
        )


def device_name(device: torch.device) -> str:
    """What trains on `device`: a GPU's name, or the CPU's model and torch's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in
             (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
             if line.startswith("model name")]  # fmt: skip
    model = names[0] if names else (platform.processor() or platform.machine())
    return f"{model}, {torch.get_num_threads()} threads"


def check_sweep_devices(config: dict[str, Any]) -> None:
    """A -m sweep runs one device per job: Lightning's DDP starts the extra processes by
    running this script's command line again, which would start the whole sweep again.
    Submitit (hydra/launcher=slurm) starts every process itself, so it may use several."""
    devices = config["trainer"].get("devices", 1)
    if not in_sweep() or devices in (1, "1") or "submitit" in HydraConfig.get().launcher._target_:
        return
    raise ConfigError(
        f"trainer.devices={devices} inside a -m sweep: Lightning's DDP would start the sweep "
        "again in every extra process; run one device per job (trainer=gpu or trainer=cpu), "
        "or launch the sweep on SLURM (hydra/launcher=slurm), which starts the processes itself"
    )
