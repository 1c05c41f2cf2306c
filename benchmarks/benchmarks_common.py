"""What the benchmarks share: writing their section of BENCHMARKS.md.

Results are always printed; a section of BENCHMARKS.md is rewritten only by a run at the
documented settings (every option at its default, as the Makefile's targets run it), so
that a `--smoke` run or a run at other sizes never replaces the documented figures.
`ATTNLAB_BENCHMARKS_MD` names another file to read and write instead (the tests' copy).
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Iterable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
NOT_WRITING = "not writing BENCHMARKS.md: settings differ from the documented ones"


def benchmarks_file() -> Path:
    return Path(os.environ.get("ATTNLAB_BENCHMARKS_MD", ROOT / "BENCHMARKS.md"))


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def documented(
    parser: argparse.ArgumentParser, args: argparse.Namespace, free: Iterable[str] = ()
) -> bool:
    """Whether every option of `args` except those in `free` (which benchmark to run, which
    rows) has `parser`'s default, the setting BENCHMARKS.md documents."""
    return all(
        value == parser.get_default(name) for name, value in vars(args).items() if name not in free
    )


def write_section(name: str, body: str) -> None:
    """Replace the text between this benchmark's markers in BENCHMARKS.md (or append it)."""
    path = benchmarks_file()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text:
        before, rest = text.split(start, 1)
        text = before + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def report(name: str, body: str, at_documented_settings: bool) -> None:
    """Print a benchmark's section, and write it to BENCHMARKS.md at the documented settings."""
    print(body)
    if at_documented_settings:
        write_section(name, body)
        print(f"wrote section {name} of {benchmarks_file()}")
    else:
        print(NOT_WRITING)
