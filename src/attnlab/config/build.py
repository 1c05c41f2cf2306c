"""Turning config nodes into objects, each option checked against the class it builds.

Every option YAML names its class in `_target_` and carries `name`, `description` and
`paper` for people and dashboards; `build` drops those three and calls the class with the
rest, so `conf/pe/rope.yaml` reads as the keyword arguments of `attnlab.pe.rope.RoPE`.
`build` makes attnlab's own classes only: it also builds models from what a checkpoint
stored (their hyperparameters), and a file must not be able to name any other callable.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from attnlab.config.groups import METADATA
from attnlab.config.values import SCALARS, fits, scalar_annotation
from attnlab.errors import ConfigError

T = TypeVar("T")


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"pe": {"name": "rope"}} -> {"pe.name": "rope"}."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_dict(node: Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """A plain, resolved dict from a DictConfig or mapping."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def _locate(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


# Each task family's data, system and report moved into one package (attnlab.tasks.<family>);
# runs recorded before still resume, evaluate and export.
MOVED = {  # the `_target_` a run's config or checkpoint recorded -> where its class is now
    "attnlab.tasks.lm.LMDataModule": "attnlab.tasks.lm.data.LMDataModule",
    "attnlab.systems.lm.LMSystem": "attnlab.tasks.lm.system.LMSystem",
    "attnlab.tasks.synthetic.SyntheticData": "attnlab.tasks.synthetic.data.SyntheticData",
    "attnlab.systems.synthetic.SyntheticSystem": "attnlab.tasks.synthetic.system.SyntheticSystem",
    "attnlab.tasks.addition.Addition": "attnlab.tasks.synthetic.addition.Addition",
    "attnlab.tasks.copy.Copy": "attnlab.tasks.synthetic.copy.Copy",
    "attnlab.tasks.mqar.MQAR": "attnlab.tasks.synthetic.mqar.MQAR",
    "attnlab.tasks.parity.Parity": "attnlab.tasks.synthetic.parity.Parity",
    "attnlab.tasks.passkey.Passkey": "attnlab.tasks.synthetic.passkey.Passkey",
    "attnlab.tasks.reverse.Reverse": "attnlab.tasks.synthetic.reverse.Reverse",
    "attnlab.tasks.sort.Sort": "attnlab.tasks.synthetic.sort.Sort",
    "attnlab.tasks.probe.ProbeDataModule": "attnlab.tasks.probe.data.ProbeDataModule",
    "attnlab.systems.tagger.TaggerSystem": "attnlab.tasks.probe.system.TaggerSystem",
    "attnlab.tasks.translation.TranslationDataModule": "attnlab.tasks.seq2seq.translation.TranslationDataModule",
    "attnlab.tasks.dialogue.DialogueDataModule": "attnlab.tasks.seq2seq.dialogue.DialogueDataModule",
    "attnlab.systems.seq2seq.Seq2SeqSystem": "attnlab.tasks.seq2seq.system.Seq2SeqSystem",
}


def current(target: Any) -> Any:
    """Where the class a recorded `_target_` names is now (`MOVED`); anything else as it is."""
    return MOVED.get(target, target) if isinstance(target, str) else target


OWN = ("attnlab.",)
MACHINERY = ("attnlab.", "lightning.")  # a run's trainer, loggers and callbacks


def own_class(target: Any, roots: tuple[str, ...] = OWN) -> type:
    """The class `target` names, if it is one of attnlab's (or, with `roots`, of those
    packages); else a ConfigError."""
    found, target = None, current(target)
    if isinstance(target, str) and target.startswith(roots):
        with contextlib.suppress(ImportError, AttributeError):
            found = _locate(target)
    if not (inspect.isclass(found) and found.__module__.startswith(roots)):
        if roots != OWN:
            packages = " or ".join(root.rstrip(".") for root in roots)
            raise ConfigError(f"_target_ {target!r} is not a class of {packages}")
        raise ConfigError(
            f"_target_ {target!r} is not a class of attnlab: variants, tasks and systems are "
            "built from attnlab's own classes (add a new one under src/attnlab/)"
        )
    return found


VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def declared(target: Any, name: str, default: T) -> T:
    """What the attnlab class `target` names declares as `name` (a class attribute, so that
    subclasses inherit it); `default` where `target` names no attnlab class."""
    try:
        return getattr(own_class(target), name, default)
    except ConfigError:
        return default


def options_of(cls: type) -> tuple[dict[str, inspect.Parameter], bool]:
    """The named options `cls` takes, and whether it takes any other. An attnlab class whose
    constructor passes **options on to its attnlab parent's (a variant stating only what
    differs from its parent, as PRoPE from RoPE) takes the parent's options too, and no
    others; a **options that goes anywhere else takes any."""
    found: dict[str, inspect.Parameter] = {}
    constructors = [k for k in cls.__mro__ if "__init__" in vars(k) and k is not object]
    if not constructors:  # object's, or one Python cannot see into
        parameters = list(inspect.signature(cls).parameters.values())
        variadic = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
        return {p.name: p for p in parameters if p.kind not in VARIADIC}, variadic
    for klass, parent in zip(constructors, [*constructors[1:], None], strict=True):
        parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]  # self
        for parameter in parameters:
            if parameter.kind not in VARIADIC:
                found.setdefault(parameter.name, parameter)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return found, False
        if parent is None or not parent.__module__.startswith("attnlab."):
            return found, True
    return found, False


def check_types(label: str, cls: type, params: Mapping[str, Any]) -> None:
    """ConfigError for the first option whose value is not of its scalar annotation's type
    (options of other annotations are the class's to check)."""
    accepted, _ = options_of(cls)
    for name, value in params.items():
        names = scalar_annotation(accepted[name].annotation) if name in accepted else None
        if names is not None and not fits(names, value):
            wanted = " or ".join(SCALARS.get(n, "null") for n in names)
            raise ConfigError(f"'{label}' option {name}={value!r} must be {wanted}")


def build(
    node: Mapping[str, Any] | DictConfig, roots: tuple[str, ...] = OWN, /, **context: Any
) -> Any:
    """Call `node._target_` (a class of one of the packages `roots`) with the node's other
    keys (minus metadata), and `context` over them.

    Nested nodes are passed through as plain dicts: a variant that composes others
    (URPE's base, a synthesizer mixture) builds them itself with this function.
    """
    params = to_dict(node)
    if "_target_" not in params:
        raise ConfigError(f"config node {params} has no _target_ naming the class to build")
    target = params.pop("_target_")
    label = params.get("name", target)
    cls = own_class(target, roots)
    accepted, _ = options_of(cls)
    for key in METADATA:
        if key not in accepted:  # a logger's name is its own setting
            params.pop(key, None)
    check_options(label, cls, params, context)
    check_complete(label, cls, params, context)
    return cls(**(params | context))


def check_options(
    label: str, cls: type, params: Mapping[str, Any], provided: Collection[str] = ()
) -> None:
    """ConfigError for an option `cls` does not take, or of the wrong scalar type; the
    options listed are those the config may set (not the `provided` ones)."""
    accepted, takes_any = options_of(cls)
    unknown = sorted(set(params) - set(accepted)) if not takes_any else []
    if unknown:
        valid = sorted(set(accepted) - set(provided))
        raise ConfigError(
            f"'{label}' has no option {', '.join(unknown)}; its options are: {', '.join(valid)}"
        )
    check_types(label, cls, params)


def check_complete(
    label: str, cls: type, params: Mapping[str, Any], provided: Collection[str] = ()
) -> None:
    """ConfigError for an option `cls` needs that neither the config nor `provided` gives
    (defaults live in the YAML, so a node that lost one has no fallback)."""
    missing = [
        name
        for name, parameter in options_of(cls)[0].items()
        if parameter.default is inspect.Parameter.empty
        and name not in params and name not in provided
    ]  # fmt: skip
    if missing:
        raise ConfigError(
            f"'{label}' needs the option {', '.join(missing)}: set it in its YAML or on the "
            "command line"
        )


def settings_node(cls: type[T], label: str, node: Mapping[str, Any], **given: Any) -> T:
    """`cls` (a settings dataclass) from the config node `label`, with `given` beside its
    keys; a ConfigError for a key it does not take, a missing or a mistyped one."""
    if not isinstance(node, Mapping):
        names = [name for name in options_of(cls)[0] if name not in given]
        raise ConfigError(f"{label}={node!r} must be a node of settings ({', '.join(names)})")
    check_options(label, cls, node, given)
    check_complete(label, cls, node, given)
    return cls(**node, **given)
