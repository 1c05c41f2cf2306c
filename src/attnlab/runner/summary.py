"""What a run prints and keeps about itself: its config tree at the start, and its closing
summary at the end."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from attnlab.files import write_text

log = logging.getLogger(__name__)


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
