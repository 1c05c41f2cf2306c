"""attnlab.files: a file written whole or not at all gets the mode a plain open() gives."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import pytest

from attnlab.files import write_text, written


@pytest.fixture
def umask() -> Iterator[int]:
    """A known umask (027, not the usual 022) for the test, the process's own after it."""
    before = os.umask(0o027)
    yield 0o027
    os.umask(before)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_file_its_writer_made_private_gets_the_mode_of_a_plain_open(umask, tmp_path):
    target = tmp_path / "report.txt"
    with written(target) as partial:  # as tempfile.mkstemp makes a file: 0600
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT, 0o600))
    assert mode(target) == 0o666 & ~umask


def test_written_text_has_the_mode_of_a_plain_open(umask, tmp_path):
    write_text(tmp_path / "plain.txt", "text\n")
    (tmp_path / "open.txt").write_text("text\n")
    assert mode(tmp_path / "plain.txt") == mode(tmp_path / "open.txt") == 0o666 & ~umask
