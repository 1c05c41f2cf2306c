"""Hybrid stacks: a per-layer schedule of encodings and attention spans (`model.schedule`,
the presets in `conf/schedule/`).

    layer ℓ takes pattern[ℓ mod len(pattern)]: {pe, window, chunk}
    pe       `pe` (the run's encoding) or a name in `encodings` (a pe config node each)
    window   W: query i attends key j only where |i − j| < W (sliding window; in a causal
             stack the W most recent keys, its own included); null: every key
    chunk    C: only where ⌊i/C⌋ = ⌊j/C⌋ (chunked attention); null: no chunks

E.g. Llama 4's interleaved layers put no encoding in every fourth layer (Meta 2025, "The
Llama 4 herd"; its RoPE layers also attend in chunks of 8,192 tokens), and Cohere's
RNoPE-SWA puts RoPE with a sliding window in three layers of four and global NoPE in the
fourth (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention Strategy",
arXiv 2501.18795). A schedule of the run's encoding everywhere with no spans is the plain
stack, and a window or chunk as long as the sequence is global attention (both tested).
Spans act on self-attention only, and both may be given (a window within chunks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnlab.config.groups import METADATA
from attnlab.config.values import is_number
from attnlab.errors import ConfigError

RUN_PE = "pe"  # the name of the run's encoding in a pattern


def _span(entry: Mapping[str, Any], key: str, where: str) -> int | None:
    value = entry.get(key)
    if value is not None and not (is_number(value) and int(value) == value and value >= 1):
        raise ConfigError(
            f"{where}.{key}={value!r} must be a positive number of tokens, or null for none"
        )
    return None if value is None else int(value)


@dataclass(frozen=True)
class LayerPlan:
    """One layer's encoding (a name: RUN_PE or a key of the schedule's encodings) and span."""

    pe: str = RUN_PE
    window: int | None = None
    chunk: int | None = None

    @property
    def global_span(self) -> bool:
        return self.window is None and self.chunk is None

    def span_mask(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """[Lq, Lk] True where the span lets query i see key j; None where it hides nothing."""
        if self.global_span:
            return None
        visible = torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
        if self.window is not None:
            visible &= (k_pos[None, :] - q_pos[:, None]).abs() < self.window
        if self.chunk is not None:
            visible &= (k_pos[None, :] // self.chunk) == (q_pos[:, None] // self.chunk)
        return None if bool(visible.all()) else visible


@dataclass(frozen=True)
class Schedule:
    """The pattern of layer plans, repeated over the layers, and the encodings it names."""

    pattern: tuple[LayerPlan, ...]
    encodings: Mapping[str, dict[str, Any]]

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> Schedule:
        """From `model.schedule` (see the module docstring); one sentence where it is wrong."""
        unknown = sorted(set(node) - {"pattern", "encodings", *METADATA})
        if unknown:
            raise ConfigError(
                f"model.schedule has no key {', '.join(unknown)}: it has pattern and encodings"
            )
        encodings = dict(node.get("encodings") or {})
        pattern = node.get("pattern")
        if not isinstance(pattern, Sequence) or isinstance(pattern, str) or not pattern:
            raise ConfigError(
                "model.schedule.pattern must be a list of layers, each {pe, window, chunk}: "
                "choose a preset (schedule=nope_every_4, rnope_swa) or write one"
            )
        plans = []
        for i, entry in enumerate(pattern):
            where = f"model.schedule.pattern[{i}]"
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{where} must be a mapping {{pe, window, chunk}}, not {entry!r}")
            unknown = sorted(set(entry) - {"pe", "window", "chunk"})
            if unknown:
                raise ConfigError(f"{where} has no key {', '.join(unknown)}: use pe, window, chunk")
            name = entry.get("pe", RUN_PE)
            if name != RUN_PE and name not in encodings:
                names = ", ".join([RUN_PE, *sorted(encodings)])
                raise ConfigError(
                    f"{where}.pe={name!r} names no encoding of the schedule (it has: {names}); "
                    f"add one with +pe@model.schedule.encodings.{name}=<pe option>"
                )
            plans.append(
                LayerPlan(name, _span(entry, "window", where), _span(entry, "chunk", where))
            )
        return cls(tuple(plans), encodings)

    def at(self, layer: int) -> LayerPlan:
        return self.pattern[layer % len(self.pattern)]

    def names(self, n_layers: int) -> list[str]:
        """The encodings the first n_layers layers use, in order of first use."""
        return list(dict.fromkeys(self.at(i).pe for i in range(n_layers)))
