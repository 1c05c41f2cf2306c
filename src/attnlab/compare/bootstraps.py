"""The paired bootstraps of `attnlab results`, kept beside the records they were computed from.

A paired bootstrap of 1,000 resamples takes seconds; RESULTS.md's pages hold hundreds. Each
result (Δ BLEU, p) is kept in `bootstrap.json` in the records directory of the block that
asked for it (docs/results/runs/<study>/), under a key naming everything the result depends
on:

    system=<sha256 of its hypotheses>;baseline=<sha256>;references=<sha256>;
    samples=<resamples>;seed=<resampling seed>;sacrebleu=<version>

so that an entry is used only for the very inputs it was computed from: a run archived
again, other references, another number of resamples or another sacreBLEU computes anew.
The file is checked when read (its version, each key's format, each value a Δ BLEU and a p
in [0, 1]); a damaged file is refused, never partly trusted. `attnlab results` writes each
file whole with the results its blocks used (attnlab.files); `attnlab results --check`
reads them and writes nothing, computing what they lack.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

from attnlab.compare.significance import RESAMPLING_SEED, SAMPLES, Pair, Test, bootstrap
from attnlab.errors import ConfigError
from attnlab.files import write_text

FILE = "bootstrap.json"
VERSION = 1
KEY = re.compile(
    r"system=[0-9a-f]{64};baseline=[0-9a-f]{64};references=[0-9a-f]{64};"
    r"samples=[1-9]\d*;seed=\d+;sacrebleu=[\w.+-]+"
)


def digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def key(
    system: Sequence[str], baseline: Sequence[str], refs: Sequence[str], samples: int, seed: int
) -> str:
    """The key of one paired bootstrap: the digests of its inputs and what else it depends on."""
    return (
        f"system={digest(system)};baseline={digest(baseline)};references={digest(refs)};"
        f"samples={samples};seed={seed};sacrebleu={version('sacrebleu')}"
    )


def read(path: Path) -> dict[str, Pair]:
    """The results `path` holds (none where it does not exist); a ConfigError where it is
    damaged."""
    if not path.is_file():
        return {}
    damaged = f"{path} is damaged ({{}}): delete it and run `attnlab results` to rebuild it"
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ConfigError(damaged.format("not JSON")) from None
    if not isinstance(held, dict) or held.get("version") != VERSION:
        raise ConfigError(damaged.format(f"not a version {VERSION} file"))
    pairs = held.get("pairs")
    if not isinstance(pairs, dict):
        raise ConfigError(damaged.format("no pairs"))
    for name, value in pairs.items():
        if not KEY.fullmatch(name):
            raise ConfigError(damaged.format(f"a key of another format, {name[:40]!r}"))
        if not is_pair(value):
            raise ConfigError(damaged.format(f"{value!r} is not a Δ BLEU and a p-value"))
    return {name: (float(gain), float(p)) for name, (gain, p) in pairs.items()}


def is_pair(value: object) -> bool:
    if not isinstance(value, list) or len(value) != 2:
        return False
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return False
    return math.isfinite(value[0]) and 0.0 <= value[1] <= 1.0


class Bootstraps:
    """The paired bootstraps of one regeneration: those held in each records directory's
    bootstrap.json, read once, and those its blocks used."""

    def __init__(self) -> None:
        self.held: dict[Path, dict[str, Pair]] = {}
        self.used: dict[Path, dict[str, Pair]] = {}

    def test(self, records: Path) -> Test:
        """The paired bootstrap for a block of the records in `records`: the result its
        bootstrap.json holds for the same inputs, else sacreBLEU's."""

        def kept_or_computed(system: list[str], base: list[str], refs: list[str]) -> Pair:
            if records not in self.held:
                self.held[records] = read(records / FILE)
            name = key(system, base, refs, SAMPLES, RESAMPLING_SEED)
            found = self.held[records].get(name)
            result = found if found is not None else bootstrap(system, base, refs)
            self.used.setdefault(records, {})[name] = result
            return result

        return kept_or_computed

    def write(self) -> list[Path]:
        """Write each file whose results differ from those its blocks used; the files written."""
        written = []
        for records, used in self.used.items():
            if used != self.held[records]:
                pairs = {name: list(used[name]) for name in sorted(used)}
                text = json.dumps({"version": VERSION, "pairs": pairs}, indent=1) + "\n"
                write_text(records / FILE, text)
                written.append(records / FILE)
        return written
