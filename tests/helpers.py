"""Helpers for tests: the real Hydra config, and attention parts built from the real YAMLs."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.attention.core import AttentionParts
from attnlab.config.build import build, own_class
from attnlab.config.options import CONF_DIR, causal_only, options, shrink, variant
from attnlab.errors import ConfigError
from attnlab.shape import StackShape
from attnlab.systems.optim import Optim

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def train_py(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """train.py in a process of its own: one epoch of a tiny probe model into `run_dir`,
    quiet, `overrides` after those settings; it must succeed."""
    result = subprocess.run(
        [
            sys.executable, "train.py", "model=tiny", "trainer.max_epochs=1",
            "extras.print_config=false", "callbacks.progress_bar.refresh_rate=0", *overrides,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def attnlab(*args: str, stdin_closed: bool = False) -> subprocess.CompletedProcess:
    """`attnlab ARGS` in a process of its own, its standard input closed (as `<&-` closes it)
    or empty."""
    return subprocess.run(
        [sys.executable, "-m", "attnlab.commands.cli", *args], cwd=ROOT, capture_output=True,
        text=True, timeout=300, stdin=None if stdin_closed else subprocess.DEVNULL,
        preexec_fn=(lambda: os.close(0)) if stdin_closed else None,
    )  # fmt: skip


# every pe runs in a causal stack; a few lines of Shakespeare for language-model tests
CAUSAL_PES = options("pe")
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"

# a system's optimizer where a test builds one without a task's config
OPTIM = Optim(
    lr=1e-3, weight_decay=0.01, betas=(0.9, 0.98), eps=1e-8, warmup_steps=100,
    schedule="cosine", min_lr_ratio=0.0,
)  # fmt: skip
SHAPE = StackShape(d_model=16, n_heads=2, head_dim=8, value_dim=8, n_layers=2, causal=False)


def task_data(task: str, cache: Path | None = None, **settings: Any) -> Any:
    """The datamodule of `task` built from its real YAML (task.data), caching under `cache`
    (for tasks with a cache); each of `settings` replaces the node's key of that name, or the
    key of that name in one of its nodes (tokenizer, batching) when it lives there."""
    node = variant("task", task, *([f"data.cache_dir={cache}"] if cache else []))["data"]
    for name, value in settings.items():
        holders = [child for child in node.values() if isinstance(child, dict) and name in child]
        (holders[0] if name not in node and holders else node)[name] = value
    return build(node)


def decode_node(**options: Any) -> dict[str, Any]:
    """conf/train.yaml's decode node, with `options` over it."""
    return {**OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml"))["decode"], **options}


def compose_config(
    overrides: list[str], output_dir: Path, config_name: str = "train"
) -> DictConfig:
    """The config train.py would see for these overrides, writing under output_dir."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.hydra.runtime.cwd = str(ROOT)
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def evaluated(checkpoint: Path, output: Path, *overrides: str) -> dict[str, float]:
    """eval.py's metrics for `checkpoint` with `overrides`, in this process (its stored
    overrides first, as on the command line), writing under `output`."""
    from attnlab.runner.evaluate import evaluate
    from attnlab.runner.resume import evaluation_arguments

    arguments = evaluation_arguments([f"ckpt_path={checkpoint}", *overrides])
    try:
        return evaluate(compose_config(arguments, output, "eval"))
    finally:
        GlobalHydra.instance().clear()


def make_parts(
    pe: str | dict = "none",
    norm: str | dict = "softmax",
    synthesizer: str | dict = "dot",
    shape: StackShape | None = None,
) -> AttentionParts:
    """Attention parts from option names (real YAML defaults) or ready config dicts, for
    `shape` or else SHAPE (causal where the pe or norm works in causal self-attention only)."""
    nodes = [
        variant(group, choice) if isinstance(choice, str) else choice
        for group, choice in (("pe", pe), ("norm", norm), ("synthesizer", synthesizer))
    ]
    if shape is None:
        causal = any(own_class(node["_target_"]).causal_only for node in nodes[:2])
        shape = replace(SHAPE, causal=causal)
    return AttentionParts.from_config(*nodes, shape)


# options that make a variant give the same output at every evaluation (randomized draws
# new positions at each pass by default, as its paper does), for tests that compare passes
REPEATABLE = {("pe", "randomized"): ("eval_positions=plain",)}


def repeatable(group: str, option: str) -> dict:
    return variant(group, option, *REPEATABLE.get((group, option), ()))


def small_variant(group: str, option: str) -> dict:
    return shrink(repeatable(group, option))


# Set by conftest's pytest_configure where the session deselects the slow tests (`make test`:
# -m "not slow"): the cases below are then not made at all, since making some 20,000
# parametrized cases only to deselect them costs each worker seconds of its collection.
SLOW_DESELECTED = False


def unless_deselected(cases: list[Any]) -> list[Any]:
    """`cases` (pytest.param), less those marked slow where the session deselects them."""
    return [
        case for case in cases
        if not (SLOW_DESELECTED and any(mark.name == "slow" for mark in case.marks))
    ]  # fmt: skip


def first_then_slow(cases: list[Any], ids: list[str] | None = None) -> list[Any]:
    """Parametrize cases that each start a process: the first runs in `make test`, the rest
    are marked slow (`make test-all`)."""
    return unless_deselected([
        pytest.param(*(case if isinstance(case, tuple) else (case,)), id=ids[i] if ids else None,
                     marks=[pytest.mark.slow] if i else [])
        for i, case in enumerate(cases)
    ])  # fmt: skip


def pairwise_cover(groups: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Combinations, one value per group, in which every pair of values of any two groups
    appears at least once (a covering array of strength 2). Deterministic: each case fixes
    the first pair not yet covered, the two largest groups first, and fills the other
    groups with the values that cover the most new pairs."""
    if len(groups) < 2:
        return list(itertools.product(*groups))
    order = sorted(range(len(groups)), key=lambda g: -len(groups[g]))

    def pair(*values: tuple[int, Any]) -> tuple[tuple[int, Any], ...]:
        return tuple(sorted(values, key=lambda value: order.index(value[0])))

    uncovered = dict.fromkeys(
        pair((a, x), (b, y))
        for a, b in itertools.combinations(order, 2)
        for x in groups[a]
        for y in groups[b]
    )
    cover = []
    while uncovered:
        case = dict(next(iter(uncovered)))
        for g in (g for g in order if g not in case):
            covers = {
                v: sum(pair((h, case[h]), (g, v)) in uncovered for h in case) for v in groups[g]
            }
            case[g] = max(groups[g], key=covers.__getitem__)
        for values in itertools.combinations(case.items(), 2):
            uncovered.pop(pair(*values), None)
        cover.append(tuple(case[g] for g in range(len(groups))))
    return cover


def every_combination(*groups: Sequence[Any], strength: int = 2) -> list[Any]:
    """Parametrize every combination of the groups' values: a cover runs in `make test`,
    the rest are marked slow (`make test-all`). Strength 2: each value of every group meets
    each value of every other group; strength 1: each value of every group appears."""
    if strength == 1:
        n = max(len(group) for group in groups)
        cover = {tuple(group[i % len(group)] for group in groups) for i in range(n)}
    else:
        cover = set(pairwise_cover(groups))
    return unless_deselected(
        [
            pytest.param(*case, marks=[] if case in cover else [pytest.mark.slow])
            for case in itertools.product(*groups)
        ]
    )


def refused_unless(
    causal: bool, pe: str, norm: str = "softmax", heads: int = 2, synthesizer: str = "dot"
) -> contextlib.AbstractContextManager:
    """Where a pe or norm defined for causal self-attention only meets a bidirectional stack,
    a norm that combines heads in pairs meets an odd number of `heads` (block=gau has one),
    or a pe that replaces q·k meets a synthesizer that weighs q·k in a mixture, expect its
    refusal (the block stops there); elsewhere, expect nothing."""
    if not causal and (causal_only(pe) or causal_only(norm, "norm")):
        return pytest.raises(ConfigError, match="works in causal self-attention only")
    if heads % 2 and own_class(variant("norm", norm)["_target_"]).paired_heads:
        return pytest.raises(ConfigError, match="needs an even number of heads")
    if dot_replaced_in_a_mixture(pe, synthesizer):
        return pytest.raises(ConfigError, match="weighs q·k in a mixture")
    return contextlib.nullcontext()


def dot_replaced_in_a_mixture(pe: str, synthesizer: str) -> bool:
    """Whether a pe that replaces q·k (pe=path) meets a synthesizer that weighs q·k in a
    mixture: a combination refused at build."""
    return weighs_dot(synthesizer) and bool(own_class(variant("pe", pe)["_target_"]).replaces_dot)


@functools.cache
def weighs_dot(synthesizer: str) -> bool:
    """Whether a synthesizer weighs q·k beside other scores (a mixture): built once each, as
    the parametrizations of thousands of cases ask it at collection."""
    built = build(variant("synthesizer", synthesizer), shape=SHAPE)  # a mixture reads q, k
    return built.needs_query and built.needs_key and not built.plain_dot


def decoded_one_at_a_time(model: Any, tokens: torch.Tensor, prefix: int = 1) -> torch.Tensor:
    """A DecoderLM's logits for `tokens` [B, T] from cached decoding: the first `prefix`
    tokens in one step, then one token a step; to compare with `model(tokens)`."""
    from attnlab.model.transformer import StackCache

    cache = StackCache.empty(model.stack.n_layers)
    steps = [model(tokens[:, :prefix], cache)]
    steps += [model(tokens[:, t : t + 1], cache) for t in range(prefix, tokens.shape[1])]
    return torch.cat(steps, 1)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill `disk` with one file until only `leave` bytes are free; the file, to free it."""
    filler = disk / "filler"
    with filler.open("wb") as file, contextlib.suppress(OSError):  # the disk is full
        while (room := shutil.disk_usage(disk).free - leave) > 0:
            file.write(b"\0" * min(room, 65536))
            file.flush()
    return filler
