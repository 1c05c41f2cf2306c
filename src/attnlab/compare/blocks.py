"""A RESULTS.md block's options (`<!-- results:<study> <kind> key=value ... -->`), read and
checked: each bad one is one sentence naming the block."""

from __future__ import annotations

from attnlab.compare.seeds import Configuration
from attnlab.errors import ConfigError

OPTIONS = ("baseline", "among", "margin", "beside")  # a block's key=value options, any order


def block_options(study: str, text: str) -> dict[str, str]:
    """A block's options ("baseline=pe=none among=a;b") by name."""
    pairs = [option.partition("=") for option in text.split()]
    if bad := [key + equals + value for key, equals, value in pairs
               if key not in OPTIONS or not value]:  # fmt: skip
        raise ConfigError(
            f"RESULTS.md block {study} has option {', '.join(bad)}: write each option as "
            f"{' or '.join(f'{name}=<value>' for name in OPTIONS)}"
        )
    return {key: value for key, _, value in pairs}


def bleu_margin(study: str, margin: str | None) -> float | None:
    """A block's `margin=` as a number of BLEU points (None without one)."""
    if margin is None:
        return None
    try:
        value = float(margin)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(
            f"RESULTS.md block {study} has margin={margin}: write a positive number of BLEU "
            "points, e.g. margin=0.4"
        )
    return value


def named(configs: list[Configuration], labels: list[str], study: str) -> list[Configuration]:
    """The configurations labelled `labels` (without the task), in that order."""
    found = {config.label_without("task") for config in configs}
    if missing := [label for label in labels if label not in found]:
        raise ConfigError(
            f"RESULTS.md block {study} names {', '.join(missing)} among its configurations, "
            f"which its records do not hold: use labels of {'; '.join(sorted(found))}"
        )
    kept = [config for config in configs if config.label_without("task") in labels]
    return sorted(kept, key=lambda config: labels.index(config.label_without("task")))
