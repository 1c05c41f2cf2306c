"""Datasets from the Hugging Face hub, with a fast, clear failure when it cannot be reached.

The hub is probed with a short timeout before `datasets` is asked for anything, so a
machine without network stops at once with a ConfigError carrying the caller's `hint`
(the local alternative); set HF_HUB_OFFLINE=1 to read the HF cache without probing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attnlab.errors import ConfigError

COMMIT = re.compile(r"[0-9a-f]{40}")  # a revision that is a commit, which needs no hub to resolve
HUB_TIMEOUT_S = 10.0
HUB_BATCH = 1_000  # rows read from an Arrow table at a time
HUB_SPLIT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


def hub_modules(hint: str) -> tuple[Any, Any, Any, type[Exception]]:
    """datasets, HfApi, huggingface_hub.constants and HfHubHTTPError, or one sentence."""
    try:
        import datasets
        from huggingface_hub import HfApi, constants
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise ConfigError(
            f"the hub needs the `datasets` package (pip install datasets); or {hint}"
        ) from None
    return datasets, HfApi, constants, HfHubHTTPError


def unreachable(dataset: str, error: Exception, hint: str) -> ConfigError:
    reason = f"{type(error).__name__}: {error}"
    return ConfigError(f"could not reach {dataset!r} on the Hugging Face hub ({reason}): {hint}")


def probe_hub(dataset: str, revision: str | None, hint: str) -> str:
    """The commit of `dataset` at `revision` (a branch, tag or commit; None: the main
    branch) as the hub gives it now, with a short timeout."""
    _, HfApi, _, HfHubHTTPError = hub_modules(hint)
    try:
        info = HfApi().dataset_info(dataset, revision=revision, timeout=HUB_TIMEOUT_S)
    except HfHubHTTPError as error:
        raise ConfigError(
            f"the hub refused dataset {dataset!r} ({error}): check task.data.dataset"
        ) from None
    except Exception as error:  # DNS, refused, timeout, proxy: the class is the HTTP
        # library's (httpx, requests), which depends on the huggingface_hub version
        raise unreachable(dataset, error, hint) from None
    return info.sha


def load_hub(
    dataset: str, subset: str | None, revision: str | None, cache_dir: Path, hint: str
) -> Any:
    """A DatasetDict from the Hugging Face hub; fails fast, with `hint`, when it is unreachable."""
    datasets, _, constants, _ = hub_modules(hint)
    if not constants.HF_HUB_OFFLINE:  # offline mode reads the HF cache: nothing to probe
        probe_hub(dataset, revision, hint)
    try:
        return datasets.load_dataset(dataset, subset, revision=revision, cache_dir=str(cache_dir))
    except ConnectionError as error:  # offline mode without a cached copy, or a lost download
        raise unreachable(dataset, error, hint) from None


def stream_hub(dataset: str, subset: str | None, commit: str, split: str, hint: str) -> Any:
    """The rows of one split of `dataset` at `commit`, streamed as they are read (an
    IterableDataset: nothing is downloaded ahead of them)."""
    datasets, _, _, _ = hub_modules(hint)
    try:
        return datasets.load_dataset(dataset, subset, revision=commit, split=split, streaming=True)
    except ValueError as error:  # datasets' unknown split or configuration
        raise ConfigError(f"hub dataset {dataset!r} ({subset}): {error}") from None
    except ConnectionError as error:
        raise unreachable(dataset, error, hint) from None


def built_commits(streams: Path, identity: dict[str, Any]) -> list[str]:
    """The commits at which the streams cached in `streams` (each entry's meta.json names
    what it was built from) hold the corpus `identity` (its "commit" aside), sorted."""
    found = set()
    for meta in streams.glob("*/meta.json"):
        if meta.parent.name.endswith(".partial"):
            continue
        try:
            built = json.loads(meta.read_text())["identity"]["split"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(built, dict) and {**built, "commit": None} == identity:
            found.add(str(built["commit"]))
    return sorted(found)


def offline_hint(revision: str | None, built: list[str], streams: Path) -> str:
    """What a hub corpus asked for at `revision` can do without network, given the commits
    `built` in `streams`: pass one of them, or build it once with network."""
    other = "or task.data.source=corpus task.data.dir=<directory of corpus files>"
    if not built:
        return (
            f"no stream of it is built in {streams}: run the same command once with network, "
            "then pass the commit its lines name (task.data.revision=<40 hex digits>) to read "
            f"it without network, {other}"
        )
    asked = (
        f"task.data.revision={revision} is not built in {streams}"
        if revision and COMMIT.fullmatch(revision)
        else f"only the hub knows the commit of task.data.revision={revision or 'null'}"
    )
    return (
        f"{asked}; without network, pass task.data.revision=<a commit built there: "
        f"{', '.join(built)}>, {other}"
    )
