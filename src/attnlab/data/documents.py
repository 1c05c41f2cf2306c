"""A corpus as documents read one at a time: a directory of text, JSON-lines and Parquet
files, however large, never a whole file in memory.

  .txt                              one document a line (a blank line is none)
  .jsonl, .jsonl.gz, .jsonl.zst     one JSON object a line; its `column` holds the text
  .parquet                          one row a document; its `column` holds the text

Files are read in the sorted order of their paths below the directory; hidden files and
directories are skipped, and a file of any other kind is refused in one sentence naming it,
as is a file whose first bytes say it holds another kind (a .jsonl.zst that is gzip or
text) and a line that is not a JSON object holding the column as text. A document's own line
breaks are kept; downstream, documents are separated by EOS (attnlab.data.encoding).
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from attnlab.data.text import NOT_TEXT
from attnlab.errors import ConfigError

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
HOLDS = {  # what a file of each kind holds: one of MAGIC, or text
    ".txt": "text", ".jsonl": "text", ".jsonl.gz": "gzip", ".jsonl.zst": "Zstandard",
    ".parquet": "Parquet",
}  # fmt: skip
MAGIC = {  # the first bytes of a file that holds each
    "gzip": b"\x1f\x8b", "Zstandard": b"\x28\xb5\x2f\xfd", "Parquet": b"PAR1",
    "xz": b"\xfd7zXZ\x00", "bzip2": b"BZh", "zip": b"PK\x03\x04",
}  # fmt: skip
PARQUET_ROWS = 1024  # rows read at a time
READ_BYTES = 1 << 20  # of a compressed file, read at a time


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
        buffered = io.BufferedReader(ZstdFrames(path), READ_BYTES)
        return io.TextIOWrapper(buffered, encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


class ZstdFrames(io.RawIOBase):
    """A Zstandard file's frames, decompressed as they are read; an EOFError where the file
    ends inside a frame (zstandard's stream reader ends there silently: the rest of a cut
    file would be lost unnoticed), an OSError for bytes that are not Zstandard."""

    def __init__(self, path: Path) -> None:
        import zstandard

        self.file, self.error = path.open("rb"), zstandard.ZstdError
        self.new = zstandard.ZstdDecompressor().decompressobj
        self.frame, self.inside = self.new(), False
        self.ready, self.at = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.at == len(self.ready):
            data = self.file.read(READ_BYTES)
            if not data:
                if self.inside:
                    raise EOFError("the file ends inside a Zstandard frame (it was cut short)")
                return 0
            self.ready, self.at = self.decompress(data), 0
        size = min(len(buffer), len(self.ready) - self.at)
        buffer[:size] = self.ready[self.at : self.at + size]
        self.at += size
        return size

    def decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            try:
                out.append(self.frame.decompress(data))
            except self.error as error:
                raise OSError(f"not Zstandard data ({error})") from None
            self.inside = not self.frame.eof
            data = self.frame.unused_data if self.frame.eof else b""
            if self.frame.eof:
                self.frame = self.new()
        return b"".join(out)

    def close(self) -> None:
        self.file.close()
        super().close()


def held(start: bytes) -> str | None:
    """What a file starting with `start` holds: a kind of MAGIC, "text", or None (neither)."""
    found = next((name for name, magic in MAGIC.items() if start.startswith(magic)), None)
    if found is not None:
        return found
    try:
        codecs.getincrementaldecoder("utf-8")().decode(start)  # a cut last character is fine
    except UnicodeDecodeError:
        return None
    return None if NOT_TEXT.search(start) else "text"


def check_contents(path: Path, kind: str) -> None:
    """A ConfigError where `path` holds something else than its name says (a .jsonl.zst
    that is gzip or text, a .txt that is compressed); an empty file holds nothing wrong."""
    with path.open("rb") as file:
        start = file.read(16)
    expected, found = HOLDS[kind], held(start)
    if start and found != expected and (expected != "text" or found in MAGIC):
        holds = f"{found} data" if found in MAGIC else found or "neither text nor compressed data"
        fix = (
            "give it the suffix of what it holds (.jsonl.gz gzip, .jsonl.zst Zstandard, "
            ".parquet Parquet, .txt or .jsonl text)"
            if found in HOLDS.values()
            else "turn it into a .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet file"
        )
        raise ConfigError(
            f"{path} is not a {expected} file as its name says: it holds {holds}; {fix}, or "
            "move it out of the corpus directory"
        )


def read_documents(path: Path, column: str) -> Iterator[str]:
    """The documents of one corpus file, in order (the module docstring)."""
    kind = kind_of(path)
    assert kind is not None, "corpus_files lists files of SUFFIXES only"
    check_contents(path, kind)
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
