"""Data the runs read is checked before it is trusted: damaged caches are rebuilt (with one
warning), a read-only complete cache serves without writes, and every data file's text is
read alike (a byte order mark changes nothing; a binary file stops with its file and line).
"""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_translation_data import local, sentence_pairs, write_split

from attnlab.data import tokenizer as tokenizer_module
from attnlab.data.cache import SplitData
from attnlab.data.text import read_lines
from attnlab.errors import ConfigError
from attnlab.metrics import translation_scores


@pytest.fixture
def corpus(tmp_path) -> Path:
    directory = tmp_path / "corpus"
    write_split(directory, "train", sentence_pairs(200))
    write_split(directory, "valid", sentence_pairs(30, seed=1))
    return directory


def rows(data: SplitData) -> list[tuple]:
    examples = (data.example(row) for row in range(len(data)))
    return [(e.src.tolist(), e.tgt.tolist(), e.ref, e.index) for e in examples]


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def scramble(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def break_json(path: Path) -> None:
    path.write_text('{"present": tr')


DAMAGE = [
    ("src.bin", truncate, "src.bin has"),
    ("tgt.bin", scramble, "content of tgt.bin differs"),
    ("meta.json", break_json, "meta.json has"),
    ("record.json", break_json, "record.json is unreadable"),
]


@pytest.mark.parametrize(
    "name,damage,found", DAMAGE, ids=[f"{d[1].__name__}-{d[0]}" for d in DAMAGE]
)
def test_a_damaged_token_cache_is_rebuilt_with_one_warning(
    name, damage, found, corpus, tmp_path, caplog
):
    fresh = local(corpus, tmp_path / "cache").split_data("valid")
    expected, entry = rows(fresh), fresh.directory
    damage(entry / name)
    with caplog.at_level(logging.INFO, logger="attnlab"):
        rebuilt = local(corpus, tmp_path / "cache").split_data("valid")
    assert rows(rebuilt) == expected
    [warning] = warnings(caplog)
    assert str(entry) in warning and found in warning and "rebuilding it" in warning


def test_a_damaged_tokenizer_model_is_retrained_not_loaded(corpus, tmp_path, caplog):
    model_file = local(corpus, tmp_path / "cache").tokenizers.src.model_file
    truncate(model_file)
    with caplog.at_level(logging.INFO, logger="attnlab"):
        tokenizer = local(corpus, tmp_path / "cache").tokenizers.src
    assert tokenizer.decode(tokenizer.encode("dog runs in park")) == "dog runs in park"
    [warning] = warnings(caplog)
    assert str(model_file.parent) in warning and "spm.model has" in warning


# --- a read-only cache ------------------------------------------------------------------------


def refuse_locks(monkeypatch) -> None:
    """Every build lock fails as in a directory without write permission."""

    class Unwritable(tokenizer_module.FileLock):
        def acquire(self, *args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", self.lock_file)

    monkeypatch.setattr(tokenizer_module, "FileLock", Unwritable)


def test_a_complete_cache_is_read_without_its_lock(corpus, tmp_path, monkeypatch):
    expected = rows(local(corpus, tmp_path / "cache").split_data("valid"))
    refuse_locks(monkeypatch)
    assert rows(local(corpus, tmp_path / "cache").split_data("valid")) == expected


def test_a_damaged_cache_that_cannot_be_rebuilt_is_one_sentence(corpus, tmp_path, monkeypatch):
    entry = local(corpus, tmp_path / "cache").split_data("valid").directory
    truncate(entry / "src.bin")
    refuse_locks(monkeypatch)
    with pytest.raises(
        ConfigError,
        match=rf"{entry} is damaged \(src\.bin has \d+ bytes where \d+ were written\) and cannot "
        r"be built because \S+ is not writable: .* pass paths\.data_dir=<a writable directory>",
    ):
        local(corpus, tmp_path / "cache").split_data("valid")


def snapshot(directory: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.rglob("*"))}


def set_writable(directory: Path, writable: bool) -> None:
    for path in [directory, *directory.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


def permissions_apply(directory: Path) -> bool:
    """Whether this process is refused a write into a read-only directory (root is not)."""
    directory.mkdir()
    directory.chmod(0o555)
    try:
        (directory / "probe").touch()
    except PermissionError:
        return True
    finally:
        directory.chmod(0o755)
    return False


def test_a_read_only_complete_cache_serves_and_writes_nothing(corpus, tmp_path):
    if not permissions_apply(tmp_path / "probe"):
        pytest.skip("this user (root) writes whatever the permissions: run as another user")
    cache = tmp_path / "cache"
    module = local(corpus, cache)
    module.setup()
    expected = [ref for batch in module.val_dataloader() for ref in batch["ref"]]
    shutil.rmtree(cache / "digests")  # the corpus digests are then computed, not remembered
    before = snapshot(cache)
    set_writable(cache, False)
    try:
        again = local(corpus, cache)
        again.setup()
        assert [ref for batch in again.val_dataloader() for ref in batch["ref"]] == expected
        assert snapshot(cache) == before
        (corpus / "test.en").write_text("a dog\n")
        (corpus / "test.de").write_text("ein hund\n")
        with pytest.raises(ConfigError, match=r"is missing and cannot be built .* not writable"):
            local(corpus, cache).split_data("test")
    finally:
        set_writable(cache, True)


# --- text as read from data files ---------------------------------------------------------------


def test_a_byte_order_mark_changes_neither_sources_nor_references_nor_bleu(corpus, tmp_path):
    plain = local(corpus, tmp_path / "cache").split_data("valid")
    marked = tmp_path / "marked"
    shutil.copytree(corpus, marked)
    for lang in ("en", "de"):
        path = marked / f"valid.{lang}"
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    with_mark = local(marked, tmp_path / "cache").split_data("valid")
    assert rows(with_mark) == rows(plain)
    references = [with_mark.example(row).ref for row in range(len(with_mark))]
    hypotheses = [plain.example(row).ref for row in range(len(plain))]
    assert translation_scores(hypotheses, references)["bleu"] == pytest.approx(100)


def test_read_lines_drops_a_byte_order_mark_only_at_the_start_of_a_file(tmp_path):
    path = tmp_path / "dialogues.train.txt"
    path.write_bytes("\ufeffa __eou__ b __eou__\r\n\ufeffc\n".encode())
    assert list(read_lines(path)) == ["a __eou__ b __eou__", "\ufeffc"]


@pytest.mark.parametrize("byte", [b"\x00", b"\x07", b"\x1b"])
def test_a_control_character_in_a_data_file_names_the_file_and_line(byte, corpus, tmp_path):
    lines = (corpus / "valid.de").read_bytes().split(b"\n")
    lines[2] = b"ein hund" + byte + b"im park"
    (corpus / "valid.de").write_bytes(b"\n".join(lines))
    with pytest.raises(
        ConfigError,
        match=rf"valid\.de line 3 holds the control character 0x{byte[0]:02x} at byte 8 of the "
        r"line, which is not text \(a binary file\?\): give a UTF-8 text file",
    ):
        local(corpus, tmp_path / "cache").prepare_data()


def test_tabs_and_carriage_returns_are_text(tmp_path):
    path = tmp_path / "train.en"
    path.write_bytes(b"a\tdog\r\n\tin park \r\n")
    assert list(read_lines(path)) == ["a\tdog", "in park"]
