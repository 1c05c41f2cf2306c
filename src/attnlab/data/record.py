"""The record of a cache entry: the size and SHA-256 of each of its files, written when the
entry is built and checked before every use, so that a truncated, overwritten or
half-copied entry is found (and rebuilt, by attnlab.data.tokenizer.build_once) instead of read.

Checking reads every byte of the entry, streamed (1 MiB at a time; SHA-256 runs at 1 to
1.4 GB/s on one core of this machine when the pages are cached): about a second for the
token cache of a WMT-sized corpus (~1.5 GB), once per process and split. The first epoch
reads the same pages anyway, so every open is checked in full rather than by sizes alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

RECORD = "record.json"


CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in chunks (hashlib.file_digest is Python 3.11+)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_record(directory: Path) -> None:
    """Record every file of `directory` (sizes and SHA-256) in its RECORD."""
    files = {
        path.name: {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != RECORD
    }
    (directory / RECORD).write_text(json.dumps({"files": files}, indent=2) + "\n")


def read_record(directory: Path) -> dict[str, dict[str, object]] | str:
    """The recorded files, or what is wrong with the record."""
    try:
        files = json.loads((directory / RECORD).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return f"it has no {RECORD} (an interrupted copy, or a build by an older attnlab)"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its {RECORD} is unreadable ({type(error).__name__}: {error})"
    well_formed = isinstance(files, dict) and all(
        isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("sha256"), str)
        for entry in files.values()
    )
    return files if well_formed else f"its {RECORD} does not list files with sizes and sums"


def record_problem(directory: Path) -> str | None:
    """What is wrong with the entry in `directory` against its record, or None if nothing."""
    files = read_record(directory)
    if isinstance(files, str):
        return files
    for name, entry in files.items():  # every size first: cheap, and the usual damage
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if (size := path.stat().st_size) != entry["bytes"]:
            return f"{name} has {size} bytes where {entry['bytes']} were written"
    for name, entry in files.items():
        try:
            digest = file_sha256(directory / name)
        except OSError as error:
            return f"{name} cannot be read ({error.strerror})"
        if digest != entry["sha256"]:
            return f"the content of {name} differs from what was written (SHA-256 mismatch)"
    return None
