"""`attnlab export ckpt_path=... out=<dir>`: a checkpoint's model as the directory
attnlab.stored reads back (its docstring lists the files). The export is written into a
hidden sibling directory and renamed into place: whole, or not there; a full disk is one
sentence and leaves nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from attnlab.data.tokenizer import TOKENIZER_KEY, VOCABULARY_KEY
from attnlab.errors import ConfigError, MachineError, refused_by_machine
from attnlab.stored import (
    CONFIG,
    FORMAT,
    RECORD_KEY,
    SOURCE,
    TARGET,
    TOKENIZER_FILES,
    WEIGHTS,
    digest,
    read_checkpoint,
)


def tokenizer_files(checkpoint: dict[str, Any]) -> dict[str, bytes]:
    """The files holding a checkpoint's tokenizers, by name."""
    if VOCABULARY_KEY in checkpoint:
        source, target = checkpoint[VOCABULARY_KEY]
        return {SOURCE: source} | ({} if target == source else {TARGET: target})
    if TOKENIZER_KEY in checkpoint:
        stored = checkpoint[TOKENIZER_KEY]
        return {TOKENIZER_FILES[stored["kind"]]: stored["model"]}
    return {}


def shared_once(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors of `state`, each memory stored once (safetensors refuses shared memory),
    and the names that repeat an earlier one: {name: name of the tensor kept}."""
    kept: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        place = (
            tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
            tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
        )  # fmt: skip
        if place in seen:
            aliases[name] = seen[place]
        else:
            seen[place] = name
            kept[name] = tensor.detach().clone().contiguous()  # a storage of its own
    return kept, aliases


def export(ckpt_path: str, out: str) -> list[str]:
    """Write the model of `ckpt_path` into the new directory `out`; the files written."""
    if Path(ckpt_path).is_dir():
        raise ConfigError(f"{ckpt_path} is an export already: pass a checkpoint file")
    checkpoint = read_checkpoint(ckpt_path)
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"out={out} already exists and is not empty: pass a new directory")
    files = tokenizer_files(checkpoint)
    config = {
        **FORMAT,
        "hyper_parameters": checkpoint.get("hyper_parameters", {}),
        "run": checkpoint[RECORD_KEY],
        "files": {name: digest(model) for name, model in files.items()},
    }
    try:
        text = json.dumps(config, indent=1, ensure_ascii=False)
    except TypeError as error:  # a value JSON cannot hold: the checkpoint is not train.py's
        raise ConfigError(f"{ckpt_path} holds settings JSON cannot hold ({error})") from None
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        write_export(partial, target, checkpoint, text, files)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)  # before the free space is measured
        refusal = refused_by_machine(OSError(error.errno, error.strerror, str(target)))
        if refusal is not None:
            raise MachineError(f"{refusal}, then export again (nothing of it was left)") from None
        raise ConfigError(
            f"cannot write the export into {out} ({error.strerror or error}): pass out= a new "
            "directory in a place you can write to, with room for the model"
        ) from None
    return sorted(path.name for path in target.iterdir())


def write_export(
    partial: Path, target: Path, checkpoint: dict[str, Any], text: str, files: dict[str, bytes]
) -> None:
    """Write the export into `partial`, then rename it to `target` (whole or not at all).
    The weights are serialized in memory and written here, so that a full disk is the
    OSError it is (safetensors' own writer reports it as a SafetensorError, in words)."""
    from safetensors.torch import save

    partial.mkdir(parents=True)
    tensors, aliases = shared_once(checkpoint["state_dict"])
    (partial / WEIGHTS).write_bytes(save(tensors, metadata={"aliases": json.dumps(aliases)}))
    (partial / CONFIG).write_text(text + "\n", encoding="utf-8")
    for name, model in files.items():
        (partial / name).write_bytes(model)
    if target.exists():
        target.rmdir()  # empty (checked above)
    partial.rename(target)
