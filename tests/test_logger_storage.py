"""A logger whose directory or database cannot be written is one sentence naming its setting,
when the run starts (not a traceback at its first write, nor MLflow's minutes of retries)."""

from __future__ import annotations

import sqlite3

import pytest

from attnlab.errors import ConfigError
from attnlab.logger.csv import CSVLogger
from attnlab.logger.mlflow import MLflowLogger
from attnlab.logger.storage import writable_database, writable_directory
from attnlab.logger.tensorboard import TensorBoardLogger


@pytest.fixture
def blocker(tmp_path):
    """A file where a directory is wanted: unwritable below it for any user, root included."""
    path = tmp_path / "a_file"
    path.write_text("")
    return path


def test_a_directory_below_a_file_is_one_sentence_naming_the_setting(blocker):
    with pytest.raises(ConfigError, match=rf"^x.dir={blocker}/logs cannot be written \(.*"):
        writable_directory(blocker / "logs", "x.dir")


def test_a_writable_directory_is_made_and_left_empty(tmp_path):
    assert writable_directory(tmp_path / "a" / "b", "x.dir") == tmp_path / "a" / "b"
    assert list((tmp_path / "a" / "b").iterdir()) == []


def test_a_file_that_is_not_a_database_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "mlflow.db"
    path.write_bytes(b"not a database " * 100)
    with pytest.raises(ConfigError, match=r"cannot be written \(file is not a database\)"):
        writable_database(path, "logger.mlflow.database")
    assert path.read_bytes() == b"not a database " * 100


def test_a_database_is_created_or_opened(tmp_path):
    path = writable_database(tmp_path / "new" / "mlflow.db", "logger.mlflow.database")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    assert writable_database(path, "logger.mlflow.database") == path


@pytest.mark.parametrize(
    ("build", "setting"),
    [
        (lambda place: CSVLogger(str(place), "csv", ""), "logger.csv.save_dir"),
        (
            lambda place: TensorBoardLogger(str(place), None, None, "probe", []),
            "logger.tensorboard.save_dir",
        ),
        (
            lambda place: MLflowLogger(str(place / "m.db"), None, None, "probe", []),
            "logger.mlflow.database",
        ),
    ],
    ids=["csv", "tensorboard", "mlflow"],
)
def test_each_logger_checks_where_it_writes_when_built(build, setting, blocker):
    with pytest.raises(
        ConfigError,
        match=rf"^{setting}={blocker}\S* cannot be written \(Not a directory: {blocker}/below\)",
    ):
        build(blocker / "below")
