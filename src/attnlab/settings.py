"""Turning config nodes into objects, and the errors that end a run with one sentence.

Every option YAML names its class in `_target_` and carries `name`, `description` and
`paper` for people and dashboards; `build` drops those three and calls the class with the
rest, so `conf/pe/rope.yaml` reads as the keyword arguments of `attnlab.pe.rope.RoPE`.
`build` makes attnlab's own classes only: it also builds models from what a checkpoint
stored (their hyperparameters), and a file must not be able to name any other callable.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib
import inspect
import itertools
import os
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

T = TypeVar("T")
METADATA = ("name", "description", "paper")
DESCRIPTIVE = ("_target_", "description", "paper")  # what a node is and where its class lives
# The config groups (conf/<group>/) by what they decide; every other list of them derives
# from these.
VARIANTS = ("pe", "norm", "synthesizer")  # the attention's parts
ARCHITECTURE = ("model", "block", *VARIANTS)  # what the weights are built for
REPORTING = ("logger", "callbacks", "extras")  # what a run records and prints, not what ran
PRESETS = ("experiment", "hparams_search", "debug")  # choices of the groups above, bundled
OUTPUT = ("paths", "hydra", "hydra/launcher")  # where output goes and how jobs are launched
GROUPS = ("task", *VARIANTS, "block", "model", "schedule", "trainer", *REPORTING, *PRESETS, *OUTPUT)
# model settings that choose kernels or a starting point, not what the trained weights are
NOT_WEIGHTS = ("fast_attention", "flex_attention", "attention_chunk", "compile", "init_std")


_reserved: list[Path] = []  # directories unique_directory made in this process


def unique_directory(path: str) -> str:
    """`path`, else `path_2`, `path_3`, ...: the first that did not exist, created by this call
    (mkdir is exclusive: runs started in the same second, by any launcher, never share one).

    Hydra also resolves a run directory that a later config replaces (debug=..., eval.py)
    while it merges configs; what that made stays empty and is removed when the process ends.
    """
    base = Path(path)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            candidate = base if n == 1 else base.with_name(f"{base.name}_{n}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            _reserved.append(candidate)
            return str(candidate)
    except OSError as error:
        # an exit, not an error: OmegaConf turns a resolver's errors into 100-line reports
        raise SystemExit(f"attnlab: {unwritable(base.parent, error.strerror)}") from None
    raise AssertionError("unreachable")


def unwritable(directory: Path, reason: str) -> str:
    return (
        f"cannot write in {directory} ({reason}): make it writable, or pass "
        "paths.log_dir=<a writable directory>"
    )


def check_writable(directory: Path) -> None:
    """Make `directory` (a run's, named on the command line) or say why it cannot be made."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(unwritable(directory, error.strerror)) from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(unwritable(directory, "permission denied"))


@atexit.register
def _release_unused() -> None:
    for directory in _reserved:
        with contextlib.suppress(OSError):  # not empty: a run used it
            directory.rmdir()


def register_resolvers() -> None:
    """The resolvers the configs use; called by every entry point before Hydra composes.

    `${cwd:}`, the directory a run is launched from, for paths.root_dir (Hydra's own
    `${hydra:runtime.cwd}` is unset when a multirun's sweeper resolves hydra.sweep.dir).
    `${unique:path}` for run and sweep directories, cached, so that every later read of
    hydra.run.dir (and every job's copy of a sweep's config) gives the one directory made.
    """
    OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
    OmegaConf.register_new_resolver("unique", unique_directory, replace=True, use_cache=True)


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what is wrong and how to fix it."""


class Diverged(ArithmeticError):
    """Training reached a NaN or infinite loss; the message says when and what to change."""


class MachineError(RuntimeError):
    """The machine refused what a run needs (disk space, a writable directory); the message
    says what to do."""


# the errors of a file system that says no, and what to do about each
REFUSED = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space there (the disk quota is used up)",
    errno.EROFS: "choose a writable place (paths.log_dir=<dir>)",
    errno.EACCES: "make it writable, or choose another place (paths.log_dir=<dir>)",
    errno.EPERM: "make it writable, or choose another place (paths.log_dir=<dir>)",
}


def refused_by_machine(error: BaseException, path: Path | None = None) -> MachineError | None:
    """The one-sentence MachineError for an error that a file system's refusal (disk full,
    read-only, no permission) caused, directly or underneath (torch.save reports a full disk
    as a RuntimeError whose context is the OSError), writing `path` (or the error's file);
    None for any other error."""
    seen: BaseException | None = error
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in REFUSED):
        if isinstance(seen, MachineError):
            return seen
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    target = Path(seen.filename) if seen.filename else path
    if target is None:
        return MachineError(f"the machine refused a write ({seen.strerror}): {REFUSED[seen.errno]}")
    free = shutil.disk_usage(target.parent).free / 2**20 if target.parent.is_dir() else None
    room = f", {free:.1f} MiB free there" if free is not None else ""
    return MachineError(f"could not write {target} ({seen.strerror}{room}): {REFUSED[seen.errno]}")


def is_count(value: Any, least: int = 1) -> bool:
    """An integer (not a bool) of at least `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def require_counts(prefix: str, least: int = 1, **values: Any) -> None:
    """ConfigError for the first value that is not an integer of at least `least`."""
    for name, value in values.items():
        if not is_count(value, least):
            kind = "a positive integer" if least == 1 else f"an integer of at least {least}"
            raise ConfigError(f"{prefix}.{name}={value!r} must be {kind}")


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


OWN = ("attnlab.",)
MACHINERY = ("attnlab.", "lightning.")  # a run's trainer, loggers and callbacks


def own_class(target: Any, roots: tuple[str, ...] = OWN) -> type:
    """The class `target` names, if it is one of attnlab's (or, with `roots`, of those
    packages); else a ConfigError."""
    found = None
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


SCALARS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def scalar_annotation(annotation: Any) -> list[str] | None:
    """The names of `int | float | bool | str | None`-style annotations; None for any other."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    names = [name.strip() for name in text.split("|")]
    return names if all(name in SCALARS or name == "None" for name in names) else None


def fits(names: list[str], value: Any) -> bool:
    """Whether `value` is of one of the scalar types `names` (an int is a float, a bool is
    neither)."""
    kinds = {
        "None": value is None,
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": is_number(value),
        "str": isinstance(value, str),
    }
    return any(kinds[name] for name in names)


VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


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
