"""A corpus as documents read one at a time: a directory of text, JSON-lines and Parquet
files, however large, never a whole file in memory.

  .txt                              one document a line (a blank line is none)
  .jsonl, .jsonl.gz, .jsonl.zst     one JSON object a line; its `column` holds the text
  .parquet                          one row a document; its `column` holds the text

Files are read in the sorted order of their paths below the directory; hidden files and
directories are skipped, and a file of any other kind is refused in one sentence naming it,
as is a line that is not a JSON object holding the column as text. A document's own line
breaks are kept; downstream, documents are separated by EOS (attnlab.data.encoding).
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from attnlab.errors import ConfigError

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
PARQUET_ROWS = 1024  # rows read at a time


def kind_of(path: Path) -> str | None:
    """The suffix of SUFFIXES that `path` ends in (the longest), or None."""
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if path.name.endswith(s)), None)


def corpus_files(directory: Path) -> list[Path]:
    """The corpus files below `directory`, sorted; a ConfigError for a file of another kind
    or a directory without any."""
    if not directory.is_dir():
        raise ConfigError(f"task.data.dir={directory} is not a directory of corpus files")
    visible = [
        path
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not any(p.startswith(".") for p in path.relative_to(directory).parts)
    ]
    if others := [path for path in visible if kind_of(path) is None]:
        raise ConfigError(
            f"{others[0]} is not a corpus file ({', '.join(SUFFIXES)}): move it out of "
            f"task.data.dir={directory}"
        )
    if not visible:
        raise ConfigError(f"task.data.dir={directory} holds no {', '.join(SUFFIXES)} files")
    return visible


def open_text(path: Path) -> IO[str]:
    """A text file, a gzip or a Zstandard stream, decoded as UTF-8 as it is read."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    if path.name.endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
        return io.TextIOWrapper(raw, encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def read_documents(path: Path, column: str) -> Iterator[str]:
    """The documents of one corpus file, in order (the module docstring)."""
    kind = kind_of(path)
    try:
        if kind == ".parquet":
            yield from parquet_documents(path, column)
            return
        with open_text(path) as file:
            for number, line in enumerate(file, 1):
                text = line.rstrip("\r\n")
                if kind == ".txt":
                    if text.strip():
                        yield text
                elif text.strip():
                    yield json_document(text, column, path, number)
    except (UnicodeDecodeError, EOFError, OSError) as error:
        raise ConfigError(
            f"{path} cannot be read to its end ({type(error).__name__}: {error}): it is "
            "damaged or not UTF-8; repair it or move it out of the corpus directory"
        ) from None


def json_document(line: str, column: str, path: Path, number: int) -> str:
    try:
        row = json.loads(line)
    except ValueError:
        row = None
    text = row.get(column) if isinstance(row, dict) else None
    if not isinstance(text, str):
        raise ConfigError(
            f"{path} line {number} is not a JSON object with the text column {column!r}: "
            "repair the line, or set task.data.text_column"
        )
    return text


def parquet_documents(path: Path, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as error:  # pyarrow's errors have no common base but Exception
        raise ConfigError(f"{path} is not a Parquet file ({type(error).__name__})") from None
    if column not in table.schema_arrow.names:
        raise ConfigError(
            f"{path} has no column {column!r} (it has {', '.join(table.schema_arrow.names)}): "
            "set task.data.text_column"
        )
    for batch in table.iter_batches(batch_size=PARQUET_ROWS, columns=[column]):
        for text in batch.column(0).to_pylist():
            if isinstance(text, str) and text.strip():
                yield text
