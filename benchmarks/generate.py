"""Language model generation with and without the key/value cache (results go to BENCHMARKS.md).

    python benchmarks/generate.py [--tokens 256] [--repeats 5] [--threads 1 2] [--smoke]

The network is experiment=lm_shakespeare_char's (4 layers, width 128, 4 heads, FFN 512, no
dropout; its 69-symbol character vocabulary) with pe=sinusoidal instead of its learned
positions: an absolute encoding added to the embeddings as well, so each step costs the
same, but without the 64 positions that would end the text at 64 tokens. Random weights,
float32, eval mode. It continues a one-token prompt by `--tokens` greedy tokens, batch 1
(attnlab.decoding.decoder_only.continue_text, as `attnlab generate` does), once feeding only the newest
token over the cache and once recomputing the whole prefix at each step (`cache=false`);
the two alternate in one process, `--repeats` rounds after a warm-up, at each of `--threads`
torch threads. Reported: the median time of each, and the median of the rounds' ratios.
Target: the cache ≥ 5× faster. Writes BENCHMARKS.md at the documented settings (the
defaults) only; `--smoke` runs a tiny model for 8 tokens, printing the section: the test
that keeps this script working.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import documented, report

from attnlab.config.build import to_dict
from attnlab.config.groups import ARCHITECTURE
from attnlab.config.options import CONF_DIR
from attnlab.decoding.decoder_only import continue_text
from attnlab.model.architecture import Architecture, ModelConfig
from attnlab.model.transformer import DecoderLM

# the experiment's pe.max_len belongs to pe=learned; sinusoidal positions have no bound
EXPERIMENT = ["experiment=lm_shakespeare_char", "pe=sinusoidal", "~pe.max_len"]
SMOKE = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"]
VOCAB = 69  # Tiny Shakespeare's 65 characters and the 4 special ids


def network(overrides: list[str]) -> tuple[DecoderLM, ModelConfig]:
    """The experiment's network (its YAMLs composed with `overrides`), random, in eval mode,
    and its model settings."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    GlobalHydra.instance().clear()
    architecture = Architecture.from_config({group: to_dict(cfg[group]) for group in ARCHITECTURE})
    torch.manual_seed(0)
    net = DecoderLM(architecture.model, architecture.attention, VOCAB).eval()
    return net, architecture.model


def seconds(net: DecoderLM, tokens: int, cache: bool) -> float:
    """Wall time of continuing a one-token prompt by `tokens` greedy tokens."""
    prompt = torch.ones(1, 1, dtype=torch.long)
    start = time.perf_counter()
    new = continue_text(net, prompt, tokens, lambda log_probs: log_probs.argmax(-1), cache)
    elapsed = time.perf_counter() - start
    assert new.shape == (1, tokens)
    return elapsed


def measure(net: DecoderLM, tokens: int, repeats: int) -> dict[bool, list[float]]:
    """Seconds of each round, with the cache (True) and without, alternating."""
    seconds(net, min(tokens, 16), True), seconds(net, min(tokens, 16), False)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeats):
        for cache in (True, False):
            times[cache].append(seconds(net, tokens, cache))
    return times


def row(threads: int, tokens: int, times: dict[bool, list[float]]) -> str:
    cached, full = statistics.median(times[True]), statistics.median(times[False])
    ratios = sorted(f / c for c, f in zip(times[True], times[False], strict=True))
    spread = ", ".join(f"{r:.1f}" for r in ratios)
    return (
        f"| {threads} | {cached:.3f} ({tokens / cached:.0f}/s) | {full:.3f} ({tokens / full:.0f}/s) "
        f"| **{statistics.median(ratios):.1f}×** | {spread} |"
    )


def section(args: argparse.Namespace, model: ModelConfig, rows: list[str], load: float) -> str:
    threads = " ".join(str(n) for n in args.threads)
    table = "\n".join(rows)
    return f"""## Language model generation (`python benchmarks/generate.py`)

Command: `python benchmarks/generate.py --tokens {args.tokens} --repeats {args.repeats} --threads {threads}`
on a 2-core CPU (x86_64, torch {torch.__version__}; 1-minute load average {load:.1f} at the start).

experiment=lm_shakespeare_char's network ({model.n_layers} layers, width {model.d_model}, {model.n_heads} heads, FFN {model.d_ff},
vocabulary {VOCAB}) with pe=sinusoidal (absolute like the experiment's pe=learned, without its
64-position bound), random weights, float32: {args.tokens} greedy tokens after a one-token prompt,
batch 1, with the key/value cache and recomputing every prefix (`cache=false`), alternating,
{args.repeats} rounds (medians).

| torch threads | with the cache, s | recomputing, s | ratio (target ≥ 5×) | ratio in each round |
|---|---|---|---|---|
{table}

A cached step feeds one token: too little work for a second thread to speed up, while
recomputing the prefix gains from it, which narrows the ratio at 2 threads.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="new tokens per generation")
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no writing")
    args = parser.parse_args()
    shown = argparse.Namespace(
        tokens=8 if args.smoke else args.tokens,
        repeats=1 if args.smoke else args.repeats,
        threads=args.threads,
    )
    load = os.getloadavg()[0]
    net, model = network(EXPERIMENT + (SMOKE if args.smoke else []))
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows.append(row(threads, shown.tokens, measure(net, shown.tokens, shown.repeats)))
    report("lm-generation", section(shown, model, rows, load), documented(parser, args))


if __name__ == "__main__":
    main()
