"""What a trained model stores, read back as data: a checkpoint file, or the directory
`attnlab export ckpt_path=... out=<dir>` writes from one, the form models are shared in:

    <dir>/model.safetensors    the weights (safetensors: a JSON header and raw tensors)
    <dir>/config.json          the hyperparameters the system is rebuilt from, and the run's
                               record (its overrides and resolved config)
    <dir>/source.model         a translation or dialogue model's SentencePiece model,
    <dir>/target.model         and its target side's where the vocabulary is not joint
    <dir>/tokenizer.model      a language model's SentencePiece model,
    <dir>/tokenizer.chars      or the characters of its char tokenizer (UTF-8)

config.json lists the tokenizer files with their SHA-256: one missing, changed or not
listed is refused when the directory is read, and so is a file that is not a regular file of
the directory's own (a link out of it). A tokenizer, an export's or a checkpoint's, must fit
the model it is loaded with: as many tokens as its embedding, the special ids it reads.
attnlab.export writes such a directory.

Both read as data only: a checkpoint with `weights_only` (tensors and plain data), a
directory as JSON, safetensors and SentencePiece bytes, so loading either runs no code.
Tensors that share memory (tied embeddings) are stored once and named again in the
safetensors header's `aliases`. `eval.py`, `attnlab translate`, `chat` and `generate` take
either as `ckpt_path`; what either names about the run passes the same allow-list
(attnlab.runner.resume), so neither decides where output goes.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from attnlab.config.build import own_class
from attnlab.data.tokenizer import TOKENIZER_KEY, VOCABULARY_KEY
from attnlab.errors import ConfigError

RECORD_KEY = "attnlab"  # checkpoint entry holding the run's overrides and resolved config
WEIGHTS, CONFIG = "model.safetensors", "config.json"
SOURCE, TARGET = "source.model", "target.model"
TOKENIZER_FILES = {"sentencepiece": "tokenizer.model", "char": "tokenizer.chars"}
FORMAT = {"format": "attnlab", "version": 1}
S = TypeVar("S")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file, or a directory `attnlab export` wrote, as plain data and tensors
    (reading it runs no code), or a ConfigError saying what is wrong with it."""
    import torch

    text = str(path)
    if "://" in text:
        raise ConfigError(f"{text} is a URL: download the checkpoint and pass its local path")
    if Path(text).is_dir():
        return read_exported(Path(text))
    if not Path(text).is_file():
        raise ConfigError(
            f"{text} is not a file: pass a checkpoint written by train.py, or a directory "
            "attnlab export wrote"
        )
    try:
        checkpoint = torch.load(text, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise ConfigError(unreadable(text, error)) from None
    if not isinstance(checkpoint, dict) or RECORD_KEY not in checkpoint:
        raise ConfigError(f"{text} holds no attnlab run record: was it written by train.py?")
    check_record(checkpoint, text)
    return checkpoint


def unreadable(path: str, error: Exception) -> str:
    """Why torch could not read the checkpoint `path`, in attnlab's words: the Python object
    torch's data-only unpickler refused, by name, or the error's first line. Torch's own
    message for a refused object advises loading the file as code; it is never passed on."""
    message = str(error).strip()
    if isinstance(error, pickle.UnpicklingError):
        found = re.search(r"GLOBAL ([\w.]+)", message)
        if found:
            return (
                f"{path} holds a Python object ({found.group(1)}) besides tensors and plain "
                "data, and attnlab loads only data (reading a checkpoint runs no code): use a "
                "checkpoint that train.py wrote, or a directory that attnlab export wrote"
            )
        message = ""  # torch's advice again
    reason = f": {message.splitlines()[0][:200]}" if message else ""
    return (
        f"{path} cannot be read as a checkpoint ({type(error).__name__}{reason}): it is "
        "truncated, not a checkpoint, or holds objects other than tensors and plain data"
    )


# what every checkpoint and export holds, and what of it is read back: (keys, type)
RECORD_FORM = (
    (("state_dict",), dict),
    (("hyper_parameters",), dict),
    ((RECORD_KEY, "overrides"), list),
    ((RECORD_KEY, "config"), dict),
    ((RECORD_KEY, "config", "task"), dict),
    ((RECORD_KEY, "config", "task", "name"), str),
    ((RECORD_KEY, "config", "paths", "root_dir"), str),
)


def check_record(checkpoint: dict[str, Any], where: str) -> None:
    """Refuse a checkpoint whose hyperparameters or run record (overrides and config) lack an
    entry, or hold one of another type, in one sentence naming the entry."""
    for keys, kind in RECORD_FORM:
        node: Any = checkpoint
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, kind):
            found = (
                "is missing" if node is None else f"is {type(node).__name__}, not {kind.__name__}"
            )
            raise ConfigError(
                f"{where}'s entry {'.'.join(keys)} {found}: the file "
                "was damaged or edited; use the checkpoint train.py wrote, or export it again"
            )
    if not all(isinstance(o, str) for o in checkpoint[RECORD_KEY]["overrides"]):
        raise ConfigError(
            f"{where}'s entry {RECORD_KEY}.overrides holds something other than text: the file "
            "was damaged or edited; use the checkpoint train.py wrote, or export it again"
        )


def read_exported(directory: Path) -> dict[str, Any]:
    """The checkpoint entries an exported directory holds: state_dict, hyper_parameters, the
    run record and the tokenizers."""
    from safetensors import SafetensorError, safe_open

    if not (directory / CONFIG).exists() or not (directory / WEIGHTS).exists():
        raise ConfigError(
            f"{directory} is a directory without {CONFIG} and {WEIGHTS}: pass a checkpoint "
            "file, or a directory attnlab export wrote"
        )
    check_own(directory, CONFIG)
    check_own(directory, WEIGHTS)
    try:
        config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
        with safe_open(directory / WEIGHTS, framework="pt") as weights:
            state = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118
            aliases = json.loads((weights.metadata() or {}).get("aliases", "{}"))
    except (OSError, UnicodeDecodeError, ValueError, SafetensorError) as error:
        raise ConfigError(
            f"{directory} cannot be read as an exported model ({type(error).__name__}): its "
            "files are damaged; export the checkpoint again"
        ) from None
    shape = {**FORMAT, "hyper_parameters": dict, "run": dict}
    if not isinstance(config, dict) or any(
        not isinstance(config.get(k), v) if isinstance(v, type) else config.get(k) != v
        for k, v in shape.items()
    ):
        raise ConfigError(
            f"{directory / CONFIG} is not the config of an attnlab {FORMAT['version']} export: "
            "export the checkpoint again with this version of attnlab"
        )
    if not isinstance(aliases, dict) or not all(a in state for a in aliases.values()):
        raise ConfigError(f"{directory / WEIGHTS} names tensors it does not hold: export again")
    state.update({name: state[kept] for name, kept in aliases.items()})
    checkpoint = {
        "state_dict": state,
        "hyper_parameters": config["hyper_parameters"],
        RECORD_KEY: config["run"],
    }
    check_record(checkpoint, str(directory))
    check_files(directory, config.get("files"))
    return checkpoint | read_tokenizers(directory)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_files(directory: Path, files: Any) -> None:
    """A ConfigError unless each tokenizer file that config.json lists (with its SHA-256,
    recorded at export) is there, unchanged, and no other tokenizer file is."""
    if not isinstance(files, dict):
        raise ConfigError(
            f"{directory / CONFIG} lists no files (an export of an earlier version): export "
            "the checkpoint again"
        )
    known = {SOURCE, TARGET, *TOKENIZER_FILES.values()}
    for name in sorted(known):
        path = directory / name
        if name not in files:
            if path.exists():
                raise ConfigError(f"{path} is not one of the files {CONFIG} lists: remove it")
            continue
        if not path.exists():
            raise ConfigError(f"{path}, which {CONFIG} lists, is missing: export again")
        check_own(directory, name)
        if digest(path.read_bytes()) != files[name]:
            raise ConfigError(
                f"{path} is not the file that was exported (its SHA-256 differs): it is damaged "
                "or edited; export again"
            )


def check_own(directory: Path, name: str) -> None:
    """A ConfigError unless the export's file `name` is a regular file of its own: not a
    link to a file outside the directory (whatever it names would be read as the model's),
    nor a directory, pipe or device."""
    path = directory / name
    where = path.resolve()
    if not where.is_relative_to(directory.resolve()):
        raise ConfigError(
            f"{path} links to {where}, outside the export: an exported model reads only its "
            "own files; put the file itself there, or export the checkpoint again"
        )
    if not where.is_file():
        raise ConfigError(f"{path} is not a regular file: export the checkpoint again")


def read_tokenizers(directory: Path) -> dict[str, Any]:
    """The tokenizer entries of a checkpoint, from an exported directory's files."""
    if (directory / SOURCE).is_file():
        source = (directory / SOURCE).read_bytes()
        target = directory / TARGET
        return {VOCABULARY_KEY: [source, target.read_bytes() if target.is_file() else source]}
    for kind, name in TOKENIZER_FILES.items():
        if (directory / name).is_file():
            return {TOKENIZER_KEY: {"kind": kind, "model": (directory / name).read_bytes()}}
    return {}  # a model that reads no text (the probe, the synthetic tasks)


def rebuild(system_class: type[S], checkpoint: dict[str, Any], changes: dict[str, Any]) -> S:
    """The system a checkpoint (or export) holds: built from its stored hyperparameters that
    `system_class` takes, with `changes` set over them, then its tokenizers and weights."""
    from attnlab.memory import EVALUATION_BYTES, check_fits

    accepted = inspect.signature(system_class).parameters
    recorded = {**system_class.recorded_before, **checkpoint["hyper_parameters"]}
    stored = {k: v for k, v in recorded.items() if k in accepted}
    if not isinstance(stored.get("architecture"), dict):
        raise ConfigError(
            "the checkpoint's hyperparameters hold no architecture: it was not written by "
            "train.py or attnlab export; pass one that was"
        )
    built = system_class.arguments(stored | changes)
    bound = inspect.signature(system_class).bind_partial(**built)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    architecture = arguments.pop("architecture")
    check_fits(functools.partial(system_class.network, **arguments), architecture, EVALUATION_BYTES)
    system = system_class(**built)
    system.on_load_checkpoint(checkpoint)
    check_vocabularies(system.vocabularies())
    check_weights(checkpoint["state_dict"], system.state_dict())
    system.load_state_dict(checkpoint["state_dict"])
    system.run_record = checkpoint[RECORD_KEY]
    return system


def check_vocabularies(vocabularies: dict[str, Any]) -> None:
    """A ConfigError for a tokenizer that does not fit the network it was stored with (a
    vocabulary of another size, or special pieces at other ids): its text would be read as
    other tokens, and tokens past the vocabulary written as replacement characters."""
    for side, (tokenizer, size, used) in vocabularies.items():
        held = tokenizer.special_ids()
        moved = [
            f"{name} at {held.get(name)} (not {i})"
            for name, i in used.items()
            if held.get(name) != i
        ]
        if tokenizer.vocab_size != size or moved:
            differs = (
                f"has {tokenizer.vocab_size} tokens where its model has {size}"
                if tokenizer.vocab_size != size
                else f"holds {', '.join(moved)}"
            )
            raise ConfigError(
                f"the checkpoint's {side} {differs}: it is not the tokenizer the model was "
                "trained with; use the tokenizer files exported with the model, or export "
                "its checkpoint again"
            )


def listed(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def check_weights(stored: dict[str, Any], expected: dict[str, Any]) -> None:
    """A ConfigError for the first way the stored tensors differ from the rebuilt model's:
    a name missing or unknown, a shape, a dtype, a value that is not finite."""
    import torch

    missing = sorted(set(expected) - set(stored))
    unknown = sorted(set(stored) - set(expected))
    if missing or unknown:
        lacks = f"lacks {listed(missing)}" if missing else ""
        extra = f"holds {listed(unknown)}, which the model has not" if unknown else ""
        raise ConfigError(
            f"the checkpoint's weights do not fit the model its config builds: it "
            f"{' and '.join(filter(None, (lacks, extra)))}; it is damaged or edited, so "
            "export or save it again"
        )
    for name, want in expected.items():
        got = stored[name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            held = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got)
            raise ConfigError(
                f"the checkpoint's {name} is {held} where the model its config builds has "
                f"{tuple(want.shape)} {want.dtype}: it is damaged or edited, so export or save "
                "it again"
            )
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            raise ConfigError(
                f"the checkpoint's {name} holds NaN or infinite values: the run diverged or the "
                "file is damaged; use a checkpoint saved before"
            )


def nested(node: Any, *keys: str) -> dict[str, Any]:
    """node[keys[0]][keys[1]]..., or {} where the stored data holds no such dict."""
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def load_system(
    path: str,
    kind: type[S],
    task_check: tuple[Callable[[dict[str, Any]], bool], str],
    stored_key: str,
    program: str,
    changes: Callable[[dict[str, Any]], dict[str, Any]] = lambda stored: {},
) -> S:
    """The system of class `kind` that a checkpoint of a task `task_check` accepts (a test of
    the stored task node, and what it asks for in words) holds, in eval mode, on
    the CPU: read as tensors and plain data (a checkpoint file or an exported directory),
    rebuilt from its hyperparameters with `changes(hyperparameters)` set over them (no code
    named by the file runs, no interpolation is resolved), its weights and the tokenizers it
    stores under `stored_key`, and the run's record (overrides and config, as data) in
    `run_record`."""
    checkpoint = read_checkpoint(path)
    task = nested(checkpoint, RECORD_KEY, "config", "task")
    accepts, wanted = task_check
    if not accepts(task) or stored_key not in checkpoint:
        raise ConfigError(
            f"{path} holds a model of task={task.get('name')}: {program} needs {wanted}"
        )
    system_class = own_class(nested(task, "system").get("_target_"))
    hyperparameters = checkpoint.get("hyper_parameters")
    if not (issubclass(system_class, kind) and isinstance(hyperparameters, dict)):
        raise ConfigError(f"{path} holds no {kind.__name__} to rebuild")
    try:
        system = rebuild(system_class, checkpoint, changes(hyperparameters))
    except ConfigError:
        raise
    except (TypeError, KeyError, RuntimeError, ValueError) as error:
        raise ConfigError(
            f"{path} cannot be rebuilt into its model ({type(error).__name__}): it was written "
            "by another version of attnlab, or damaged"
        ) from None
    return system.eval()
