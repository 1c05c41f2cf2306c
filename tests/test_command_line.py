"""train.py's and eval.py's command line, read in one place (attnlab.runner.command_line)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hydra.errors import OverrideParseException

from attnlab.errors import ConfigError
from attnlab.runner import command_line

RUNNER = Path(command_line.__file__).parent


@pytest.mark.parametrize(
    ("args", "key", "expected"),
    [
        (["run_dir='a b'"], "run_dir", "a b"),
        (["ckpt_path=null"], "ckpt_path", None),
        (["task=copy", "task=sort"], "task", "sort"),  # the last one, as Hydra reads them
        (["pe=rope,alibi"], "pe", "rope,alibi"),  # a sweep, as typed
        (["hydra.run.dir=x"], "run_dir", None),  # another key that ends the same
        (["-m", "seed=3"], "seed", "3"),
    ],
)
def test_a_value_is_read_as_hydra_reads_it(args, key, expected):
    assert command_line.value(args, key) == expected


def test_a_value_that_does_not_parse_is_one_sentence_saying_how_to_quote_it():
    with pytest.raises(ConfigError, match=r"run_dir=a\(b does not parse .*run_dir='\.\.\.'"):
        command_line.value(["run_dir=a(b"], "run_dir")


def test_flags_and_their_values_are_no_overrides():
    args = ["-m", "--cfg", "job", "pe=rope", "model.d_model=64", "~logger", "pe=("]
    assert command_line.flags(args) == ["-m", "--cfg"]
    assert command_line.is_multirun(args) and not command_line.asks_help(args)
    assert command_line.asks_help(["-h"]) and command_line.asks_help(["pe=rope", "--help"])
    # `job` is the value of --cfg; `pe=(` does not parse and is left to Hydra
    assert [text for text, _ in command_line.parsed(args)] == ["pe=rope", "model.d_model=64"]
    (_, override), *_ = command_line.parsed(args)
    assert (override.key_or_group, override.value()) == ("pe", "rope")


def test_a_key_is_dropped_and_a_null_checkpoint_chooses_none():
    args = ["run_dir=a", "seed=2", "run_dir=b"]
    assert command_line.without(args, "run_dir") == ["seed=2"]
    assert not command_line.chooses(["ckpt_path=null"], "ckpt_path")
    assert not command_line.chooses([], "ckpt_path")
    assert command_line.chooses(["ckpt_path=x.ckpt"], "ckpt_path")


def test_a_stored_list_that_does_not_parse_raises():
    assert [o.key_or_group for o in command_line.parse_all(["pe=rope", "+x=1"])] == ["pe", "x"]
    with pytest.raises(OverrideParseException):
        command_line.parse_all(["pe=("])


def readers_of_the_command_line(path: Path) -> set[str]:
    """What a module does that reads a command line itself: sys.argv, Hydra's parser."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "argv":
            found.add("sys.argv")
        if isinstance(node, ast.Name | ast.alias) and "OverridesParser" in (
            getattr(node, "id", None),
            getattr(node, "name", None),
        ):
            found.add("OverridesParser")
    return found


def test_no_other_runner_module_reads_the_command_line_itself():
    readers = {
        path.name: found
        for path in RUNNER.glob("*.py")
        if path.name != "command_line.py" and (found := readers_of_the_command_line(path))
    }
    assert readers == {}
    assert readers_of_the_command_line(RUNNER / "command_line.py") == {
        "sys.argv",
        "OverridesParser",
    }
