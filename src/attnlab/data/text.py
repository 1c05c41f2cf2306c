"""Reading text files: line counts, chunks, `read_lines`, the one reader of line-based data
files (translation pairs and the references they are scored against, dialogues), and
`read_text`, the reader of running text (a language model's), so that every file's text is
normalized alike: a byte order mark at its start dropped, and lines stripped of whitespace
(running text keeps it). Bytes that are not UTF-8, and control characters (a binary file), stop with the
file and line.
"""

from __future__ import annotations

import codecs
import itertools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from attnlab.errors import ConfigError

NOT_TEXT = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")  # C0 controls but tab, LF and CR


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
    """The normalized lines of a UTF-8 text file (the module docstring)."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            yield text_line(raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw, path, number)


def read_text(path: Path) -> str:
    """A UTF-8 text file's whole text as it is, newlines and spacing kept (a language model
    reads them), a byte order mark at its start dropped; bytes that are not UTF-8 and control
    characters stop with the file and line, as in `read_lines`."""
    raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or NOT_TEXT.search(raw):
        for number, line in enumerate(raw.split(b"\n"), 1):
            text_line(line, path, number)  # raises for the first line that is not text
    assert text is not None
    return text


def text_line(raw: bytes, path: Path, number: int) -> str:
    """Line `number` of `path`, decoded and stripped; a ConfigError if it is not text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path} line {number} is not valid UTF-8 ({error.reason} at byte "
            f"{error.start} of the line): re-encode the file as UTF-8 (e.g. iconv)"
        ) from None
    if control := NOT_TEXT.search(raw):  # UTF-8 never uses these bytes inside a character
        raise ConfigError(
            f"{path} line {number} holds the control character 0x{control[0][0]:02x} at byte "
            f"{control.start()} of the line, which is not text (a binary file?): give a "
            "UTF-8 text file, or remove the character"
        )
    return text.strip()


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
