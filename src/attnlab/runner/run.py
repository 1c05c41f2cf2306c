"""What train and eval share: building a run's objects from its config, and reporting it."""

from __future__ import annotations

import io
import logging
import os
import platform
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from attnlab.config.build import MACHINERY, build, check_complete, own_class, to_dict
from attnlab.config.groups import ARCHITECTURE, DESCRIPTIVE, OUTPUT, REPORTING
from attnlab.config.values import check_ranges
from attnlab.data.task import TaskData
from attnlab.decoding.encoder_decoder import DecodeConfig
from attnlab.errors import ConfigError  # fmt: skip
from attnlab.files import write_text
from attnlab.logger.wandb import WandbLogger
from attnlab.model.architecture import Architecture
from attnlab.runner.callbacks import ScoredExamples, ValidateAtEnd
from attnlab.runner.checkpoints import LatestCheckpoint
from attnlab.runner.job import is_sweep_job
from attnlab.systems.base import System
from attnlab.systems.optim import Optim

log = logging.getLogger(__name__)


def quiet_library_noise() -> None:
    """Print each log line once and skip a warning that is not ours.

    Lightning and torchmetrics add their own stderr handler yet still propagate to the root
    logger, which Hydra has pointed at the console and the run's log file: drop theirs.
    Lightning 2.6 trips torch's LeafSpec deprecation on every rank; nothing to act on.
    """
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics"):
        logging.getLogger(name).handlers.clear()
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its database set-up, every run
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, LightningChatter) for f in rank_zero.filters):
        rank_zero.addFilter(LightningChatter())
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    # attnlab.runner.checkpoints.ExactResume puts the loader back where it was, after this warning
    warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")


class LightningChatter(logging.Filter):
    """Drops what Lightning says on every run that asks nothing of the user: its "💡 Tip"
    about a cloud logger, and that it keeps attnlab's model summary callback."""

    PREFIXES = ("💡 Tip", "Trainer already configured with model summary callbacks")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.PREFIXES)


def command_line_overrides() -> list[str]:
    """The overrides this run was launched with (empty outside a Hydra app)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


@dataclass(frozen=True)
class Plan:
    """What a training run's system is built from, made of the composed config once and
    checked before any data is read: the network built on the meta device (every variant
    against its stack's shape), the optimizer and decoding settings."""

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


def accumulate_for(trainer: L.Trainer, datamodule: TaskData) -> None:
    """Accumulate the batches that the data puts into one optimizer step (before fit)."""
    batches = datamodule.batches_per_step(trainer.world_size)
    if batches is None:
        return
    if trainer.accumulate_grad_batches != 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches} and the "
            f"data's tokens per step ({batches} batches) both set the batches of a step: "
            "keep one"
        )
    trainer.accumulate_grad_batches = batches


def build_trainer(config: dict[str, Any], extra_callbacks: list[L.Callback] = ()) -> L.Trainer:
    """The trainer with the config's loggers and callbacks, `extra_callbacks`, and the two
    every run has: validation of the final weights, and the count of examples scored."""
    check_accelerator(str(config["trainer"].get("accelerator", "auto")))
    loggers = [build(node, MACHINERY) for node in switched_on(config.get("logger"))]
    sweep_job = in_sweep() or is_sweep_job(Path(resolve_output_dir(config)))
    callbacks = [build_callback(node, sweep_job) for node in switched_on(config.get("callbacks"))]
    if not loggers:  # (~logger) Lightning refuses a LearningRateMonitor with nothing to log to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    always = [ValidateAtEnd(), ScoredExamples()]
    trainer = trainer_from(
        config["trainer"], logger=loggers, callbacks=[*callbacks, *always, *extra_callbacks]
    )
    trainer.callbacks = state_savers_last(trainer.callbacks)
    return trainer


def switched_on(nodes: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The nodes of a group of callbacks or loggers but those set to null, which is how a run
    leaves one out (callbacks.attention_maps=null)."""
    return [node for node in (nodes or {}).values() if node is not None]


def build_callback(node: dict[str, Any], sweep_job: bool) -> L.Callback:
    """A callback of the config; callbacks.latest's keep_when_done null is decided by the
    kind of run: a job of a -m sweep drops its training state when done, a single run not."""
    if "keep_when_done" in node and node["keep_when_done"] is None:
        return build({**node, "keep_when_done": not sweep_job}, MACHINERY)
    return build(node, MACHINERY)


def state_savers_last(callbacks: list[L.Callback]) -> list[L.Callback]:
    """`callbacks` with LatestCheckpoint last: at the end of an epoch Lightning calls early
    stopping and the checkpoint callbacks after the others, in list order, and last.ckpt
    must hold what the best checkpoint and early stopping made of that epoch."""
    return sorted(callbacks, key=lambda callback: isinstance(callback, LatestCheckpoint))


def trainer_from(node: dict[str, Any], **settings: Any) -> L.Trainer:
    """Lightning's Trainer of the trainer node, its nested nodes (plugins, a profiler) built
    first, and `settings` over it."""
    nested = {key: built(value) for key, value in node.items() if is_node(value)}
    rest = {key: value for key, value in node.items() if key not in nested}
    return build(rest, MACHINERY, **(nested | settings))


def is_node(value: Any) -> bool:
    """A node naming a class to build, or a list of them."""
    if isinstance(value, list):
        return bool(value) and all(is_node(item) for item in value)
    return isinstance(value, dict) and "_target_" in value


def built(value: Any) -> Any:
    return [built(item) for item in value] if isinstance(value, list) else build(value, MACHINERY)


NOT_LOGGED = (*OUTPUT, *REPORTING)  # where outputs go, not what ran


# settings that locate files on one machine, relative or absolute: not logged
LOCATIONS = ("dir", "file", "test_src", "test_tgt", "cache_dir", "data_dir")


def _portable(node: Any) -> Any:
    """`node` without metadata keys and without file locations (machine-specific)."""
    if isinstance(node, dict):
        return {
            key: _portable(value)
            for key, value in node.items()
            if key not in (*DESCRIPTIVE, *LOCATIONS)
            and not (isinstance(value, str) and os.path.isabs(value))
        }
    if isinstance(node, list):
        return [_portable(item) for item in node]
    return node


def logged_config(config: dict[str, Any], system: System) -> dict[str, Any]:
    """What loggers and dashboards record of a run: the resolved config with the groups at
    the top level (pe, norm, synthesizer, task, model, optim, trainer, ...) and what the
    system reports about itself (parameter counts; for translation, sacreBLEU's signature)."""
    config = _portable({k: v for k, v in config.items() if k not in NOT_LOGGED})
    config["optim"] = config["task"].pop("optim")
    config["task"].pop("max_epochs", None)  # trainer.max_epochs holds what the run used
    return {**config, **system.describe()}


def log_hyperparameters(trainer: L.Trainer, config: dict[str, Any]) -> None:
    for logger in trainer.loggers:
        logger.log_hyperparams(config)


@contextmanager
def closing_loggers(trainer: L.Trainer) -> Iterator[None]:
    """End what loggers keep open across a job (a W&B run) when the block ends, however it
    ends, so that the next job of a sweep in this process starts its own."""
    failed = True
    try:
        yield
        failed = False
    finally:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.finish(exit_code=int(failed))


def in_sweep() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


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


def closing_summary(
    config: dict[str, Any], counts: dict[str, int], metrics: dict[str, float], run_dir: str
) -> str:
    """The short report a run ends with."""
    shown = {
        k: v
        for k, v in sorted(metrics.items())
        if "/acc_pos/" not in k and not k.startswith("train/lr/") and not k.endswith("_total")
    }
    width = max(len(k) for k in ["synthesizer", *shown])
    parts = ", ".join(f"{k} {v:,}" for k, v in counts.items() if k != "total")
    design = {
        "task": config["task"]["name"],
        **{group: config[group]["name"] for group in ("pe", "norm", "synthesizer", "block")},
        # the task's own switches of the stack, where it has them (the probe's)
        **{key: str(config["task"][key]).lower() for key in ("markers", "causal")
           if key in config["task"]},
    }  # fmt: skip
    lines = [
        *(f"{k:<{width}}  {v}" for k, v in design.items()),
        f"{'parameters':<{width}}  {counts['total']:,} ({parts})",
        *(f"{k:<{width}}  {_shown(k, v, metrics)}" for k, v in shown.items()),
        f"{'run dir':<{width}}  {run_dir}",
    ]
    return "\n".join(lines)


def report(text: str) -> None:
    """Print the closing summary, and write it to the run's log file (train.log) too."""
    print(text, flush=True)
    record = logging.LogRecord(__name__, logging.INFO, __file__, 0, "\n%s", (text,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _shown(key: str, value: float, metrics: dict[str, float]) -> str:
    if key.endswith("/examples"):
        return f"{value:,.0f} of {metrics.get(f'{key}_total', float('nan')):,.0f}"
    return f"{value:.4f}"


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def resolve_output_dir(config: DictConfig | dict[str, Any]) -> str:
    return str(Path(config["paths"]["output_dir"]).resolve())


def config_tree(cfg: DictConfig, color: bool) -> str:
    """The resolved config as a tree, a branch per group, whole (no line is cut)."""
    from rich.console import Console
    from rich.syntax import Syntax
    from rich.tree import Tree

    tree = Tree("config", guide_style="dim")
    nodes = {k: v for k, v in cfg.items() if isinstance(v, DictConfig)}
    run_keys = {k: v for k, v in cfg.items() if k not in nodes}
    for name, node in {"run": OmegaConf.create(run_keys), **nodes}.items():
        text = OmegaConf.to_yaml(node, resolve=True).rstrip()
        tree.add(str(name), style="bold").add(Syntax(text, "yaml", theme="ansi_dark"))
    out = io.StringIO()
    console = Console(file=out, width=10_000, force_terminal=color, no_color=not color)
    console.print(tree, soft_wrap=True)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


@rank_zero_only
def print_config(cfg: DictConfig) -> None:
    """The config tree at the start of a run or, in a sweep, of its first job only (the
    others differ by their overrides alone)."""
    job = HydraConfig.get().job if HydraConfig.initialized() else None
    if job is None or HydraConfig.get().mode != RunMode.MULTIRUN or job.num == 0:
        print(config_tree(cfg, color=sys.stdout.isatty()), end="", flush=True)


@rank_zero_only
def save_config_tree(cfg: DictConfig, output_dir: str) -> None:
    """<run dir>/config_tree.log: the tree of every run, sweep jobs included."""
    write_text(Path(output_dir, "config_tree.log"), config_tree(cfg, color=False))
