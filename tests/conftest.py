"""Fixtures shared by the tests (helper functions live in helpers.py)."""

from __future__ import annotations

import os
import subprocess

import helpers
import pytest
import torch
from helpers import compose_config
from hydra.core.global_hydra import GlobalHydra
from hypothesis import settings
from omegaconf import DictConfig

from attnlab.config.resolvers import register_resolvers

register_resolvers()  # what train.py and eval.py do before Hydra composes
# no per-example time limit: a loaded machine made correct examples fail (speed is measured
# in benchmarks, never in tests)
settings.register_profile("attnlab", deadline=None)
settings.load_profile("attnlab")
if os.environ.get("PYTEST_XDIST_WORKER"):  # a core a worker, and for the processes it starts
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # a child with a thread a core would share the other's


def pytest_configure(config: pytest.Config) -> None:
    """`make test` (-m "not slow") is not given the slow cases of helpers' parametrizations."""
    helpers.SLOW_DESELECTED = config.option.markexpr.replace(" ", "") == "notslow"


@pytest.fixture(autouse=True)
def subnormal_floats():
    """A test that calls an entry point in this process (train.py's main) turns on flushing
    subnormal floats, as every run does; turn it off again for the next test, whose checks
    (hypothesis's among them) count on IEEE arithmetic."""
    yield
    torch.set_flush_denormal(False)


QUIET = [
    "~logger",
    "callbacks.progress_bar.refresh_rate=0",
    "callbacks.model_summary.max_depth=0",  # no model summary
    "extras.print_config=false",
]


@pytest.fixture
def make_config(tmp_path):
    """compose_config(overrides) for a quiet run writing into tmp_path."""

    def make(overrides: list[str], config_name: str = "train") -> DictConfig:
        return compose_config([*QUIET, *overrides], tmp_path, config_name)

    yield make
    GlobalHydra.instance().clear()


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB file system of its own (tmpfs), to fill while a run trains."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip("mounting a small tmpfs (a disk to fill) needs root and mount rights")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)
