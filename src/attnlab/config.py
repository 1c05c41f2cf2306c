"""Turning config nodes into objects, and the errors that end a run with one sentence.

Every option YAML names its class in `_target_` and carries `name`, `description` and
`paper` for people and dashboards; `build` drops those three and calls the class with the
rest, so `conf/pe/rope.yaml` reads as the keyword arguments of `attnlab.pe.rope.RoPE`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

METADATA = ("name", "description", "paper")

# `${cwd:}`, the directory a run is launched from, for paths.root_dir. Hydra's own
# `${hydra:runtime.cwd}` is unset when a multirun's sweeper resolves hydra.sweep.dir.
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what is wrong and how to fix it."""


class Diverged(ArithmeticError):
    """Training reached a NaN or infinite loss; the message says when and what to change."""


def to_dict(node: Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """A plain, resolved dict from a DictConfig or mapping."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def build(node: Mapping[str, Any] | DictConfig, **context: Any) -> Any:
    """Call `node._target_` with the node's other keys (minus metadata) and `context`.

    Nested nodes are passed through as plain dicts: a variant that composes others
    (URPE's base, a synthesizer mixture) builds them itself with this function.
    """
    params = to_dict(node)
    if "_target_" not in params:
        raise ConfigError(f"config node {params} has no _target_ naming the class to build")
    target = params.pop("_target_")
    label = params.get("name", target)
    for key in METADATA:
        params.pop(key, None)
    cls = get_object(target)
    accepted = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(set(params) - set(accepted)) if not takes_any else []
    if unknown:
        valid = sorted(set(accepted) - set(context))
        raise ConfigError(
            f"'{label}' has no option {', '.join(unknown)}; its options are: {', '.join(valid)}"
        )
    return cls(**params, **context)
