"""The key=value settings of the `attnlab` commands that take a checkpoint (generate,
translate, chat, export): Hydra's override grammar, one plain value per setting, nothing
composed or interpolated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attnlab.errors import ConfigError

QUOTING = "quote a value holding commas or special characters, e.g. 'prompt=\"O Romeo, Romeo!\"'"


def parse_setting(
    arg: str, program: str, names: Sequence[str], text: Sequence[str], known: Callable[[str], bool]
) -> tuple[str, Any]:
    """(key, value) of one `key=value` in Hydra's override grammar, a setting of `program`
    (`known`; `names` lists them), the keys in `text` read as written."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    try:
        override = OverridesParser.create().parse_override(arg)
    except Exception:
        raise ConfigError(f"cannot read {arg!r} as key=value: {QUOTING}") from None
    key = override.key_or_group
    plain = override.type is OverrideType.CHANGE and override.package is None
    if not plain or override.is_sweep_override() or "=" not in arg:
        raise ConfigError(f"{arg!r} is not a plain key=value (one value per setting): {QUOTING}")
    if not known(key):
        raise ConfigError(f"{program} has no setting {key}: its settings are {', '.join(names)}")
    value = override.value()
    if key in text and not isinstance(value, str):
        value = arg.split("=", 1)[1].strip()  # as written, not as a number, bool or null
    return key, value
