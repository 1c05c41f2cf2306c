"""An installed attnlab (not the checkout) carries its configs and trains from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` would install, built from a copy (a build writes build/ and
    *.egg-info/ beside the sources)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info", "local")
    for tree in ("src", "conf"):  # as a clone holds them: src/attnlab/conf links to conf/
        shutil.copytree(ROOT / tree, source / tree, symlinks=True, ignore=ignored)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (path,) = out.glob("attnlab-*.whl")
    return path


def test_the_wheel_ships_every_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    in_checkout = {
        f"attnlab/conf/{path.relative_to(ROOT / 'conf')}"
        for path in (ROOT / "conf").rglob("*.yaml")
        if "local" not in path.parts
    }
    assert "attnlab/conf/train.yaml" in in_checkout and "attnlab/conf/pe/rope.yaml" in in_checkout
    assert in_checkout <= names


def test_the_installed_entry_point_trains_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the unpacked wheel ahead of everything, so the checkout's editable install is not used
    env = {**os.environ, "PYTHONPATH": str(site)}
    program = (
        "import sys, attnlab; from pathlib import Path; "
        f"assert Path(attnlab.__file__).is_relative_to({str(site)!r}), attnlab.__file__; "
        "from attnlab.runner.train import main; sys.argv[0] = 'attnlab-train'; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, "pe=rope", "task=probe", "model=tiny", "debug=fast",
         "extras.print_config=false"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rope" in result.stdout
    assert (elsewhere / "logs").is_dir() and not (ROOT / "src" / "attnlab" / "logs").exists()
