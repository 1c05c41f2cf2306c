"""What a training run is built from: its plan (the composed config, checked before any data is
read), the data module and the system, and the directory it writes in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from attnlab.config.build import build, check_complete, own_class, to_dict
from attnlab.config.groups import ARCHITECTURE
from attnlab.config.values import check_ranges
from attnlab.data.task import TaskData
from attnlab.decoding.encoder_decoder import DecodeConfig
from attnlab.model.architecture import Architecture
from attnlab.systems.base import System
from attnlab.systems.optim import Optim


@dataclass(frozen=True)
class Plan:
    """What a training run's system is built from, made of the composed config once and
    checked before any data is read: the network built once on the meta device, each stack
    only as deep as it must be to hold every kind of layer the full one has (every variant
    against its stack's shape; the full network's parameters counted from it against the
    memory free: `System.check_network`), the optimizer and decoding settings. `build_system`
    then builds the network for real, once: each variant is built twice before training."""

    config: dict[str, Any]  # the whole config, resolved, as plain data
    system_class: type[System]
    arguments: dict[str, Any]  # the system's, but for what the data gives (its vocabulary)

    @classmethod
    def from_config(cls, cfg: DictConfig | dict[str, Any]) -> Plan:
        config = to_dict(cfg)
        check_ranges(config)
        system = dict(config["task"]["system"])
        system_class = own_class(system.pop("_target_"))
        decode = DecodeConfig.from_config(config["decode"])  # checked whoever decodes
        made = {
            "architecture": Architecture.from_config({g: config[g] for g in ARCHITECTURE}),
            "optim": Optim.from_config(config["task"]["optim"]),
            **({"decode": decode} if "decode" in system else {}),
        }
        system_class.check_network(made["architecture"], system)
        return cls(config, system_class, {**system, **made})


def build_datamodule(config: DictConfig | dict[str, Any]) -> TaskData:
    return build(config["task"]["data"])


def build_system(plan: Plan, datamodule: TaskData) -> System:
    """The plan's system for `datamodule`, which gives it its vocabulary."""
    given = datamodule.model_kwargs()
    label = f"{plan.system_class.__module__}.{plan.system_class.__name__}"
    check_complete(label, plan.system_class, plan.arguments, given)
    system = plan.system_class(**plan.arguments, **given)
    system.check_lengths(datamodule)
    return system


def resolve_output_dir(config: DictConfig | dict[str, Any]) -> str:
    return str(Path(config["paths"]["output_dir"]).resolve())
