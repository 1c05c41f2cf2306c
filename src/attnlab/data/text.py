"""Reading text files: line counts, UTF-8 lines that name their bad bytes, chunks."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from attnlab.config import ConfigError


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def count_lines(path: Path) -> int:
    """Lines as iterating over the file yields them (a last line without newline counts)."""
    count, last = 0, b"\n"
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def read_lines(path: Path) -> Iterator[str]:
    """The whitespace-stripped lines of a UTF-8 file; bad bytes stop with the line number."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ConfigError(
                    f"{path} line {number} is not valid UTF-8 ({error.reason} at byte "
                    f"{error.start} of the line): re-encode the file as UTF-8 (e.g. iconv)"
                ) from None
            yield text.strip()


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
