"""`attnlab tokenize KEY=VALUE ...`: a language model's data made ready once, before any run
reads it: the tokenizer trained and every split encoded into the stream cache, in parallel
processes, resumed where a killed build stopped. It takes train.py's settings (`task=lm`,
`experiment=lm_*`, `task.data.*`); every run and every seed of a sweep with the same data
and tokenizer settings then reads the cache instead of tokenizing.
"""

from __future__ import annotations

from hydra.errors import HydraException
from omegaconf import DictConfig

from attnlab.errors import ConfigError, MachineError, refused_by_machine
from attnlab.runner.job import compose_run, job_config
from attnlab.runner.plan import build_datamodule
from attnlab.tasks.lm.data import LMDataModule


def composed(overrides: list[str]) -> DictConfig:
    try:
        return job_config(compose_run("train", overrides))
    except HydraException as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"tokenize takes train.py's settings: {reason}") from None


def tokenize(overrides: list[str]) -> list[str]:
    """Build the tokenizer and every split's stream; a line for each split. A disk that
    fills up is one sentence (a MachineError), and what was written is kept to go on from."""
    data = build_datamodule(composed(overrides))
    if not isinstance(data, LMDataModule):
        raise ConfigError(
            "attnlab tokenize prepares a language model's data: pass task=lm (or an "
            "experiment=lm_* config) and its task.data settings"
        )
    try:
        data.prepare_data()
    except OSError as error:
        if (refusal := refused_by_machine(error, data.cache / "streams")) is None:
            raise
        raise MachineError(
            f"{refusal}; then run the same command again, and the build goes on where it stopped"
        ) from None
    lines = []
    for split in data.splits:
        stream = data.stream(split)
        found = f"{len(stream):,} tokens" if stream.present else "absent"
        lines.append(f"{split}: {found} ({data.source.describe(split)}) in {stream.directory}")
    return lines
