"""Evaluate a checkpoint: `python eval.py ckpt_path=... [split=val] [other overrides]`.

The run is rebuilt from the overrides stored in the checkpoint (see `attnlab.run.RunRecord`),
placed before the ones given here on the command line, so those win: the model is the one trained, the data and
evaluation settings may change (a longer eval length, another data directory, decode.beam).
What the model depends on beyond its weights (a translation model's vocabulary) comes from
the checkpoint too, never from the data it is evaluated on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from attnlab.config import ConfigError, to_dict
from attnlab.train import CONFIG_DIR

STAGES = {"test": "test", "val": "validate"}  # split=... -> Lightning's stage


def load_checkpoint(ckpt_path: str) -> dict:
    from attnlab.run import RECORD_KEY

    path = Path(ckpt_path)
    if not path.is_file():
        raise ConfigError(
            f"ckpt_path={ckpt_path} is not a file: pass a checkpoint written by train.py"
        )
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if RECORD_KEY not in checkpoint:
        raise ConfigError(f"{ckpt_path} holds no attnlab run record: was it written by train.py?")
    return checkpoint


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test (or validate) the checkpoint `cfg.ckpt_path` on the configured data."""
    from hydra.utils import get_class

    from attnlab import run

    if cfg.split not in STAGES:
        raise ConfigError(f"split={cfg.split!r} is not one of: {', '.join(STAGES)}")
    run.quiet_library_noise()
    if cfg.extras.print_config:
        run.print_config(cfg)
    datamodule = run.build_datamodule(cfg)
    system_class = get_class(cfg.task.system._target_)
    system_class.restore_data(datamodule, load_checkpoint(cfg.ckpt_path), STAGES[cfg.split])
    settings = {k: v for k, v in to_dict(cfg.task.system).items() if k != "_target_"}
    system = system_class.load_from_checkpoint(cfg.ckpt_path, map_location="cpu", **settings)
    system.check_lengths(datamodule)
    trainer = run.build_trainer(cfg)
    method = trainer.test if cfg.split == "test" else trainer.validate
    with run.closing_loggers(trainer):
        (results,) = method(system, datamodule, verbose=False)
    metrics = run.scalar_metrics(results)
    print(
        run.summary(cfg, system.parameter_counts(), metrics, run.resolve_output_dir(cfg)),
        flush=True,
    )
    return metrics


def stored_overrides(args: list[str]) -> list[str]:
    """The overrides of the training run whose checkpoint `args` name (none without one)."""
    from attnlab.run import RECORD_KEY

    paths = [arg.split("=", 1)[1] for arg in args if arg.startswith("ckpt_path=")]
    return list(load_checkpoint(paths[-1])[RECORD_KEY]["overrides"]) if paths else []


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def evaluate_main(cfg: DictConfig) -> dict[str, float]:
    try:
        return evaluate(cfg)
    except ConfigError as error:
        raise SystemExit(f"attnlab: {error}") from None


def main() -> None:
    """Run Hydra with the checkpoint's overrides ahead of the command line's."""
    try:
        sys.argv[1:1] = stored_overrides(sys.argv[1:])
    except ConfigError as error:
        raise SystemExit(f"attnlab: {error}") from None
    evaluate_main()


if __name__ == "__main__":
    main()
