"""Dialogue's test phase: pairs decoded per second (results go to BENCHMARKS.md).

    python benchmarks/dialogue.py [--batches N] [--threads 1] [--smoke]

What `python train.py task=chitchat model=tiny trainer.max_steps=20` does after training:
Lightning's test loop over the whole Chit-Chat test split (6,145 pairs, the corpus ships with
chitchat-dataset), loss and perplexity by teacher forcing, then beam search (beam 4, the
default decode settings) for every pair, scored by BLEU, ROUGE-L and distinct-n. The model
is model=tiny with random weights (seed 0): like a 20-step model (length ratio 5.1 measured),
it almost never ends a hypothesis before its length cap, the worst case the issue measured.
The tokenizer and token caches are built first (or read from `data/`), outside the timing.
Reported: test pairs per second over the whole phase, one thread. `--batches N` times the
first N test batches only; `--smoke` runs a tiny vocabulary in a temporary cache for two
batches, printing the section (the test that keeps this script working). Writes
BENCHMARKS.md at the documented settings (the defaults) only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, documented, machine, report

from attnlab.config.build import to_dict
from attnlab.config.options import CONF_DIR
from attnlab.config.resolvers import register_resolvers
from attnlab.runner.plan import Plan, build_datamodule, build_system
from attnlab.runner.trainer import build_trainer

SETTINGS = [
    "task=chitchat", "model=tiny", "~logger", "extras.print_config=false",
    "callbacks.progress_bar.refresh_rate=0", "callbacks.model_summary.max_depth=0",
]  # fmt: skip
SMOKE = ["task.data.tokenizer.vocab_size=120", "task.data.tokenizer.pairs=2000"]


def test_phase(overrides: list[str], output: Path) -> tuple[int, float]:
    """(pairs scored, seconds) of the test phase of a random model=tiny chitchat system."""
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", [*SETTINGS, *overrides, f"hydra.run.dir={output}"])
    cfg.paths.output_dir = str(output)
    torch.manual_seed(0)
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")  # the tokenizer, trained or read from the cache: not timed
    system = build_system(Plan.from_config(cfg), datamodule)
    trainer = build_trainer(to_dict(cfg))
    datamodule.setup("test")
    start = time.perf_counter()
    (metrics,) = trainer.test(system, datamodule, verbose=False)
    return int(metrics["test/examples"]), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=None, help="default: the whole split")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny vocabulary, two batches")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = [] if args.batches is None else [f"++trainer.limit_test_batches={args.batches}"]
    with tempfile.TemporaryDirectory() as scratch:
        if args.smoke:
            overrides = [*SMOKE, "++trainer.limit_test_batches=2", f"paths.data_dir={scratch}"]
        else:
            overrides.append(f"paths.data_dir={ROOT / 'data'}")
        pairs, seconds = test_phase(overrides, Path(scratch) / "run")
    body = (
        "## Dialogue's test phase\n\n"
        "`python benchmarks/dialogue.py`: Lightning's test loop for `task=chitchat model=tiny` "
        "(random weights: every hypothesis runs to its length cap, as after a 20-step run), "
        f"beam 4, {machine()}.\n\n"
        f"| pairs | seconds | pairs/s |\n|---|---|---|\n"
        f"| {pairs:,} | {seconds:.1f} | **{pairs / seconds:.1f}** |\n"
    )
    report("dialogue", body, documented(parser, args))


if __name__ == "__main__":
    main()
