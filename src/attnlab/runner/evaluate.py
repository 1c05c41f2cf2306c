"""Evaluate a checkpoint: `python eval.py ckpt_path=... [split=val] [other overrides]`.

The run is rebuilt from the overrides stored in the checkpoint (those an allow-list passes,
see `attnlab.runner.resume`), placed before the ones given here on the command line: the data and
evaluation settings may change (a longer eval length, another data directory, decode.beam);
the model may not (an override of pe, norm, synthesizer, model.* or the task is an error),
except in how a RoPE reads positions past its training context (pe.scaling and the options
it reads: the PE class's `evaluation_options`, set in the model the checkpoint holds).
What the model depends on beyond its weights (a translation model's vocabulary) comes from
the checkpoint too, never from the data it is evaluated on. Checkpoints are read as tensors
and plain data only, and a directory `attnlab export` wrote is read as JSON, safetensors
and tokenizer files (attnlab.stored): reading either runs no code.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from attnlab import status
from attnlab.config.build import own_class, to_dict
from attnlab.config.options import CONF_DIR
from attnlab.config.resolvers import register_resolvers
from attnlab.config.values import check_ranges
from attnlab.errors import ConfigError, check_writable, refused_by_machine
from attnlab.files import refusals_stop_logging
from attnlab.runner import command_line
from attnlab.runner.job import run_composed
from attnlab.runner.lock import check_contained
from attnlab.runner.preflight import check_setting_keys
from attnlab.runner.resume import evaluation_arguments
from attnlab.runner.same_model import check_same_model, evaluation_options, with_settings
from attnlab.stored import RECORD_KEY, read_checkpoint, rebuild
from attnlab.tensors import flush_denormals

STAGES = {"test": "test", "val": "validate"}  # split=... -> Lightning's stage


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test (or validate) the checkpoint `cfg.ckpt_path` on the configured data."""
    from attnlab.runner.loggers import closing_loggers, quiet_library_noise
    from attnlab.runner.plan import build_datamodule, resolve_output_dir
    from attnlab.runner.summary import closing_summary, print_config, report, scalar_metrics
    from attnlab.runner.trainer import build_trainer

    if cfg.split not in STAGES:
        raise ConfigError(f"split={cfg.split!r} is not one of: {', '.join(STAGES)}")
    quiet_library_noise()
    if cfg.extras.print_config:
        print_config(cfg)
    config = to_dict(cfg)  # the config as data, once
    check_ranges(config)
    datamodule = build_datamodule(config)
    checkpoint = read_checkpoint(config["ckpt_path"])
    changeable = evaluation_options(config)
    check_same_model(config, checkpoint[RECORD_KEY]["config"], "eval.py", changeable)
    settings = dict(config["task"]["system"])
    system_class = own_class(settings.pop("_target_"))
    if changeable:
        architecture = checkpoint["hyper_parameters"]["architecture"]
        settings["architecture"] = with_settings(architecture, changeable)
    system = rebuild(system_class, checkpoint, settings)  # its tokenizers checked against it
    datamodule.restore(checkpoint, STAGES[config["split"]])
    system.check_lengths(datamodule)
    trainer = build_trainer(config)
    method = trainer.test if config["split"] == "test" else trainer.validate
    with closing_loggers(trainer):
        (results,) = method(system, datamodule, verbose=False)
    metrics = scalar_metrics(results)
    output_dir = resolve_output_dir(config)
    report(closing_summary(config, system.parameter_counts(), metrics, output_dir))
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="eval")
def evaluate_main(cfg: DictConfig) -> dict[str, float]:
    refusals_stop_logging(logging.getLogger())  # eval.log, on a disk that fills
    try:
        return evaluate(cfg)
    except ConfigError as error:
        raise SystemExit(f"attnlab: {error}") from None


def check_evaluation_directory(directory: Path) -> None:
    """Refuse, before Hydra writes its record there, a directory that holds a training run
    (eval.py would write over its .hydra record and add to its metrics), that a link leads
    out of, or that cannot be written."""
    if (directory / status.FILE).is_file():
        raise ConfigError(
            f"hydra.run.dir={directory} holds a training run, whose record and metrics eval.py "
            "would write over: leave hydra.run.dir to its default (logs/<task>/evals/<time>), "
            "or pass a new directory"
        )
    check_contained(directory)
    check_writable(directory)


def evaluate_composed(arguments: list[str], existed: bool) -> None:
    """Run the evaluation of `arguments`; a write the machine refuses (a full disk) ends it in
    one sentence, and removes the evaluation's directory where this evaluation made it (its
    metrics, half written, would read as an evaluation's; `existed`: it was there before,
    named on the command line): run again, it starts whole."""
    try:
        run_composed("eval", arguments, evaluate_main)
    except Exception as error:
        if refused_by_machine(error) is None:
            raise
        removed, directory = "", None
        if HydraConfig.initialized():
            directory = Path(HydraConfig.get().runtime.output_dir)
        if directory is not None and not existed:
            shutil.rmtree(directory, ignore_errors=True)
            removed = f" (its unfinished directory {directory} is removed)"
        refusal = refused_by_machine(error, directory)  # free space measured after the removal
        raise SystemExit(f"attnlab: {refusal}, then run eval.py again{removed}") from None


def main() -> None:
    """The checkpoint's overrides ahead of the command line's, composed (`attnlab.runner.job`);
    flags (--help, --cfg, ...) go to Hydra's app with the command line as given."""
    flush_denormals()
    register_resolvers()
    args = command_line.given()
    if command_line.flags(args):
        evaluate_main()
        return
    try:
        if command_line.value(args, "ckpt_path") is None:
            raise ConfigError(
                "eval.py needs the checkpoint to evaluate: pass ckpt_path=<run>/checkpoints/"
                "last.ckpt (the latest state) or <run>/checkpoints/epoch_NNN.ckpt (the best; "
                "step_NNNNNN.ckpt in a run that validates by steps)"
            )
        arguments = evaluation_arguments(args)
        from_run = [arg for arg in arguments if arg not in args]
        arguments = check_setting_keys(arguments, "eval", stored=from_run)
        run_dir = command_line.value(args, "hydra.run.dir")
        existed = run_dir is not None and Path(run_dir).exists()
        if run_dir is not None:
            check_evaluation_directory(Path(run_dir))
    except ConfigError as error:
        raise SystemExit(f"attnlab: {error}") from None
    evaluate_composed(arguments, existed)


if __name__ == "__main__":
    main()
