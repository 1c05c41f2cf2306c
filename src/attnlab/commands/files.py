"""What the commands that take a checkpoint (translate, chat, export) read and write: an output
is never one of their own inputs, links followed (writing it would lose what it is read
from), and standard input is read only where the process has one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO

from attnlab.errors import ConfigError

STANDARD = "-"  # input=- and output=-: standard input and output, no file


def files_read(path: Path) -> Iterator[Path]:
    """The files a setting naming `path` reads: the file, or every file below a directory (an
    export's weights, config and tokenizer files)."""
    if path.is_dir():
        yield from (inside for inside in path.rglob("*") if inside.is_file())
    elif path.is_file():
        yield path


def check_output(
    setting: str, output: str, inputs: Mapping[str, str], program: str, instead: str
) -> None:
    """Refuse, before anything is read or written, an `output` that is, symbolic and hard
    links followed, a file one of the `inputs` settings (name: path) reads; `instead` says
    what to pass."""
    target = Path(output)
    if output == STANDARD or not target.exists():
        return
    for name, value in inputs.items():
        if value == STANDARD:
            continue
        for read in files_read(Path(value)):
            if os.path.samefile(target, read):
                inside = "" if read == Path(value) else f" ({read})"
                raise ConfigError(
                    f"{setting}={output} is the file {program} reads as {name}={value}{inside} "
                    f"(links followed): writing it would lose that file; {instead}"
                )


def standard_input(program: str) -> TextIO:
    """sys.stdin, or one sentence where the process was started without one (`<&-`: Python
    then has no sys.stdin), rather than reading nothing as if it were an empty input."""
    if sys.stdin is None:
        raise ConfigError(
            f"{program} reads standard input, and this process has none (it was closed): pass "
            "input=<a file>, or give it a terminal, a pipe or < file"
        )
    return sys.stdin
