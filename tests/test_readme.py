"""The documentation's promises: the README's opening commands, docs/options.md's options table."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from helpers import ROOT

from attnlab.config.options import options_table


def section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_the_readme_opens_with_the_install_train_and_test_commands():
    opening = (ROOT / "README.md").read_text().splitlines()[:6]
    assert any(line.startswith("make install && make train") for line in opening)
    assert any(line.startswith("make test") for line in opening)


def test_the_options_table_lists_every_option_as_the_yaml_files_describe_it():
    page = (ROOT / "docs" / "options.md").read_text()
    table = section(page, "<!-- options:start -->", "<!-- options:end -->")
    assert table == options_table(), (
        "regenerate it with python -m attnlab.config.options and paste it into docs/options.md"
    )


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)
def test_the_documented_export_writes_into_a_folder_git_ignores():
    text = (ROOT / "docs" / "outputs.md").read_text()
    (out,) = set(re.findall(r"attnlab export \S+ out=(\S+)", text))
    ignored = subprocess.run(
        ["git", "check-ignore", "--quiet", "--no-index", f"{out}/model.safetensors"], cwd=ROOT
    )
    assert ignored.returncode == 0, f"add {out.split('/')[0]}/ to .gitignore"
