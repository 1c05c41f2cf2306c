"""Forward+backward time and peak memory of every pe, norm and synthesizer, as ratios to
pe=none norm=softmax synthesizer=dot measured in the same run.

    python benchmarks/attention.py [--lengths 128 512 1024 4096] [--repeats 3] [--rows ...] [--smoke]

The model is a 2-layer encoder (d_model 256, 4 heads, FFN 1024, batch 4) trained on a
token-level loss, with the model's default attention settings (fused SDPA where it applies,
recomputed query blocks of model.attention_chunk for long sequences); each variant changes
one group from the baseline. A pe or norm that works in causal self-attention only (CoPE,
xPos, selective attention) is measured in a causal stack, its row marked "(causal)" and its ratios taken to the baseline
measured in the same causal stack (the "baseline ... (causal)" row). Time is the fastest of `repeats` steps
after a warm-up. Memory is the peak of live tensor bytes during one step, parameters
included: the CPU analogue of torch.cuda.max_memory_allocated, replayed from the profiler's
allocation and free events (peak RSS would also count what the C allocator keeps after a
free). Subnormal floats are flushed first, as every run does (`attnlab.tensors.flush_denormals`).
pe=randomized draws from max(pe.max_position, 2·L) positions, so that longer sequences still
get drawn, not consecutive, positions. Writes BENCHMARKS.md at the documented settings (the
defaults) only; `--rows` measures the baselines and the rows whose label contains one of its
words, and prints them. `--term-path` measures each of those rows twice in one process, with
the CPU term path (`attnlab/attention/term.py`) forced on at every length and forced off (the
plain path), and prints their ratio: the term path's before -> after. `--smoke` runs every variant once at L = 16 with a tiny model,
printing the table: the test that keeps this script working.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))

from benchmarks_common import NOT_WRITING, documented, machine, report

import attnlab.attention.core as core
from attnlab.config.options import causal_only, options, shrink, variant
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import Tagger
from attnlab.tensors import flush_denormals

BASELINE = {"pe": "none", "norm": "softmax", "synthesizer": "dot"}
BASELINE_LABEL = "baseline (none, softmax, dot)"
CAUSAL = " (causal)"
BATCH, VOCAB = 4, 1000
MODEL = ModelConfig(Standard(), d_model=256, n_heads=4, n_layers=2, d_ff=1024, dropout=0.0)
SMOKE_MODEL = replace(MODEL, d_model=32, n_heads=2, n_layers=1, d_ff=64)


def peak_tensor_bytes(step) -> int:
    """Peak of live tensor bytes allocated while `step()` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e.time_range.start, e.self_cpu_memory_usage)
        for e in prof.events()
        if e.self_cpu_memory_usage
    )
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


def attention_at(
    choice: dict[str, str], length: int, pe_overrides: tuple[str, ...] = ()
) -> AttentionConfig:
    """The attention of `choice` for sequences of `length`: every length bound set to it, and
    pe=randomized drawing from max(pe.max_position, 2·length) positions."""
    nodes = {
        g: shrink(variant(g, o, *(pe_overrides if g == "pe" else ())), max_len=length)
        for g, o in choice.items()
    }
    if "max_position" in nodes["pe"]:
        nodes["pe"]["max_position"] = max(nodes["pe"]["max_position"], 2 * length)
    return AttentionConfig(nodes["pe"], nodes["norm"], nodes["synthesizer"])


def measure(
    choice: dict[str, str], causal: bool, length: int, repeats: int, cfg: ModelConfig
) -> tuple[float, float]:
    """(seconds per forward+backward, peak memory in MiB) of one configuration."""
    torch.manual_seed(0)
    attention = attention_at(choice, length)
    model = Tagger(cfg, attention, VOCAB, VOCAB, causal=causal)
    tokens = torch.randint(1, VOCAB, (BATCH, length))

    def step() -> None:
        logits = model(tokens, None)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return min(times), (peak_tensor_bytes(step) + parameters) / 2**20


def in_causal_stack(label: str) -> bool:
    """Whether the row `label` is measured in a causal stack."""
    return label.endswith(CAUSAL)


def baseline_of(label: str) -> str:
    """The row that `label`'s ratios are taken to: the baseline in the same kind of stack."""
    return BASELINE_LABEL + CAUSAL * in_causal_stack(label)


def variants() -> list[tuple[str, dict[str, str]]]:
    """Each row's label and choice: the baseline in an encoder and in a causal stack, then
    one group changed at a time, in a causal stack where the pe or the norm works there only."""
    rows = [(BASELINE_LABEL, BASELINE), (BASELINE_LABEL + CAUSAL, BASELINE)]
    for group in ("pe", "norm", "synthesizer"):
        for option in [o for o in options(group) if o != BASELINE[group]]:
            choice = {**BASELINE, group: option}
            causal = any(causal_only(choice[g], g) for g in ("pe", "norm"))
            rows.append((f"{group}={option}" + CAUSAL * causal, choice))
    return rows


def section(
    results: dict[str, dict[int, tuple[float, float]]],
    lengths: list[int],
    repeats: int,
    cfg: ModelConfig,
) -> str:
    base = results[BASELINE_LABEL]
    header = "| variant | " + " | ".join(f"time ×, L={n}" for n in lengths) + " | "
    header += " | ".join(f"memory ×, L={n}" for n in lengths) + " |"
    lines = [header, "|---" * (1 + 2 * len(lengths)) + "|"]
    for label, by_length in results.items():
        reference = results[baseline_of(label)]
        times = [f"{by_length[n][0] / reference[n][0]:.2f}" for n in lengths]
        memory = [f"{by_length[n][1] / reference[n][1]:.2f}" for n in lengths]
        lines.append(f"| {label} | " + " | ".join(times + memory) + " |")
    absolute = "; ".join(
        f"L={n}: {base[n][0] * 1000:.0f} ms, {base[n][1]:.0f} MiB" for n in lengths
    )
    table = "\n".join(lines)
    return f"""## Attention variants (`make bench-attention`)

Command: `python benchmarks/attention.py --lengths {" ".join(map(str, lengths))} --repeats {repeats}`
on {machine()}.

{cfg.n_layers}-layer encoder (d_model {cfg.d_model}, {cfg.n_heads} heads, FFN {cfg.d_ff}, batch {BATCH}),
forward + backward of a token-level loss, default attention settings (fused SDPA where it
applies; recomputed blocks of `model.attention_chunk` = {cfg.attention_chunk} queries for longer
sequences). Each row changes one group from the baseline; ratios to the baseline measured in the same run
({absolute}); a row marked (causal) is a pe that works in causal self-attention only, measured
in a causal stack, its ratios to the baseline in that stack. Memory: peak live tensor bytes of one step, parameters included.

{table}
"""


def term_path_ab(rows: list[str], lengths: list[int], repeats: int, cfg: ModelConfig) -> None:
    """Print each row's time and memory with the term path forced on and off, alternated in
    one process, and their ratios (on / off)."""
    decide = core._term_path
    forced = {
        "on": lambda parts, compute, q, v, n: decide(parts, compute, q, v, math.inf),
        "off": lambda parts, compute, q, v, n: False,
    }
    for label, choice in variants():
        if not any(word in label for word in rows):
            continue
        for length in lengths:
            got = {}
            for mode, rule in forced.items():
                core._term_path = rule
                got[mode] = measure(choice, in_causal_stack(label), length, repeats, cfg)
            core._term_path = decide
            (t_on, m_on), (t_off, m_off) = got["on"], got["off"]
            print(
                f"{label:24s} L={length:5d}  term path {t_on * 1000:8.1f} ms {m_on:7.1f} MiB  "
                f"plain {t_off * 1000:8.1f} ms {m_off:7.1f} MiB  time {t_on / t_off:.2f}x  "
                f"memory {m_on / m_off:.2f}x",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", nargs="+", default=[], help="only the baselines and these rows")
    parser.add_argument("--smoke", action="store_true", help="L = 16, a tiny model, no writing")
    parser.add_argument(
        "--term-path", action="store_true", help="the rows with the term path on and off"
    )
    args = parser.parse_args()
    flush_denormals()
    lengths, repeats = ([16], 1) if args.smoke else (args.lengths, args.repeats)
    cfg = SMOKE_MODEL if args.smoke else MODEL
    if args.term_path:
        term_path_ab(args.rows or ["pe="], lengths, repeats, cfg)
        print(NOT_WRITING)  # a comparison, printed only
        return
    measure(BASELINE, False, max(lengths), 1, cfg)  # warm up threads and the allocator, discarded
    results: dict[str, dict[int, tuple[float, float]]] = {}
    for label, choice in variants():
        wanted = label.startswith(BASELINE_LABEL) or any(word in label for word in args.rows)
        if args.rows and not wanted:
            continue
        results[label] = {}
        for length in lengths:
            seconds, mib = results[label][length] = measure(
                choice, in_causal_stack(label), length, repeats, cfg
            )
            print(
                f"{label:36s} L={length:5d}  {seconds * 1000:8.1f} ms  {mib:8.1f} MiB", flush=True
            )
    body = section(results, lengths, repeats, cfg)
    report("attention", body, documented(parser, args))


if __name__ == "__main__":
    main()
