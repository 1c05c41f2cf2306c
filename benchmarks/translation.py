"""Translation benchmarks (results go to BENCHMARKS.md).

    python benchmarks/translation.py speed      # ours vs torch.nn.Transformer; cached decoding
    python benchmarks/translation.py quality    # 30 minutes of training per configuration
    python benchmarks/translation.py quality --only "pe=rope norm=l2"   # re-run one row
    python benchmarks/translation.py speed --smoke   # or quality --smoke: tiny, no writing

speed: training tokens/s of attnlab's encoder-decoder (model=small, pe=sinusoidal,
norm=softmax, synthesizer=dot) as a ratio to torch.nn.Transformer of identical dimensions,
wrapped in the same embeddings, sinusoidal positions and tied output projection; both train
(forward, backward, AdamW step) on the same Multi30k batches in one process, alternating.
Then greedy decoding of 100 tokens with the key/value cache against recomputing the prefix.

quality: `train.py model=small task=multi30k` on the shared Multi30k files for
`--minutes` of wall time (validation included) per configuration, then the test BLEU of the
best checkpoint (beam 4).

BENCHMARKS.md is written at the documented settings (the defaults; `--only` picks rows)
only. `--smoke` runs either benchmark at tiny sizes (model=tiny, 300 training pairs, a
500-piece vocabulary, caches and runs in a temporary directory) and prints its section: the
test that keeps this script working.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, benchmarks_file, documented, machine, report

from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.data.batching import collate
from attnlab.decoding.encoder_decoder import greedy
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import EncoderDecoder, TokenEmbedding
from attnlab.pe.sinusoidal import sinusoids

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
# model=small's dimensions; attention dropout as nn.Transformer, which drops attention weights
SMALL = ModelConfig(Standard(), attn_dropout=0.1)
TINY = ModelConfig(Standard(), d_model=32, n_heads=2, n_layers=2, d_ff=64, attn_dropout=0.1)
SMOKE_DATA = {"batching.train_size": 300, "tokenizer.vocab_size": 500}
SMOKE_BUDGET = ["debug=limit"]  # 2 epochs of 5 batches, 2 batches of validation and test
BASELINE = AttentionConfig(
    {"_target_": "attnlab.pe.sinusoidal.SinusoidalPE"},
    {"_target_": "attnlab.norm.softmax.Softmax"},
    {"_target_": "attnlab.synthesizer.dot.Dot"},
)
QUALITY_RUNS = {
    "pe=sinusoidal norm=softmax": ["pe=sinusoidal", "norm=softmax"],
    "pe=rope norm=l2": ["pe=rope", "norm=l2"],
    "synthesizer=random": ["synthesizer=random"],
}


@dataclass(frozen=True)
class Settings:
    """The sizes a run measures at: the documented ones, or the smoke test's."""

    preset: str  # the model config whose dimensions `model` has
    model: ModelConfig
    data: dict[
        str, int
    ]  # task.data settings (dotted: batching.train_size) besides the shared files
    cache_dir: Path  # tokenizer and token caches
    decoding: tuple[int, int]  # sources, and tokens decoded for each
    overrides: list[str]  # train.py overrides of every quality run


DOCUMENTED = Settings("small", SMALL, {}, ROOT / "data", (32, 100), [])


def smoke_settings(directory: Path) -> Settings:
    """Tiny sizes, with caches and runs under `directory`."""
    data = [f"task.data.{option}={value}" for option, value in SMOKE_DATA.items()]
    paths = [f"paths.data_dir={directory / 'data'}", f"paths.log_dir={directory / 'logs'}"]
    return Settings("tiny", TINY, SMOKE_DATA, directory / "data", (4, 5), data + paths)


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with the embeddings, positions and output of EncoderDecoder."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(
            cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.decoder_layers, cfg.d_ff, cfg.dropout,
            activation=cfg.activation, batch_first=True, norm_first=cfg.norm_first,
        )  # fmt: skip

    def embed_with_positions(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return self.drop(
            x + sinusoids(torch.arange(tokens.shape[1], device=tokens.device), x.shape[-1], x.dtype)
        )

    def forward(
        self, src: torch.Tensor, src_padding: torch.Tensor, tgt: torch.Tensor
    ) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        hidden = self.transformer(
            self.embed_with_positions(src), self.embed_with_positions(tgt), tgt_mask=causal,
            src_key_padding_mask=src_padding, memory_key_padding_mask=src_padding, tgt_is_causal=True,
        )  # fmt: skip
        return hidden @ self.embed.weight.t()


def multi30k_batches(count: int, settings: Settings) -> tuple[list[dict], int]:
    """The first `count` training batches of the shared Multi30k files, and the vocabulary size."""
    chosen = [f"data.{option}={value}" for option, value in settings.data.items()]
    data = build(variant(
        "task", "translation", "data.source=local", f"data.dir={MULTI30K}",
        f"data.cache_dir={settings.cache_dir}", "data.batching.max_len=128", *chosen,
    )["data"])  # fmt: skip
    data.setup("fit")
    dataset, batches = data.batched("train")
    return [collate(dataset[list(b)]) for b in batches[:count]], data.tokenizers.tgt.vocab_size


def train_steps(model: nn.Module, batches: list[dict]) -> tuple[float, int]:
    """Seconds and target tokens of one training step per batch (forward, backward, AdamW)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    seconds, tokens = 0.0, 0
    for batch in batches:
        src, tgt = batch["src"], batch["tgt"]
        start = time.perf_counter()
        logits = model(src, src == 0, tgt[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - start
        tokens += int((tgt[:, 1:] != 0).sum())
    return seconds, tokens


def speed(args: argparse.Namespace, settings: Settings) -> str:
    torch.manual_seed(0)
    cfg = settings.model
    count, rounds = (2, 1) if args.smoke else (args.batches, args.rounds)
    batches, vocab = multi30k_batches(count, settings)
    ours = EncoderDecoder(cfg, BASELINE, vocab, vocab)
    reference = TorchTransformer(cfg, vocab)
    train_steps(ours, batches[:2]), train_steps(reference, batches[:2])  # warm-up
    totals = {"attnlab": [0.0, 0], "torch.nn.Transformer": [0.0, 0]}
    round_ratios = []
    for _ in range(rounds):  # alternate, so drifts in machine speed hit both alike
        seconds = {}
        for name, model in (("attnlab", ours), ("torch.nn.Transformer", reference)):
            seconds[name], tokens = train_steps(model, batches)
            totals[name][0] += seconds[name]
            totals[name][1] += tokens
        round_ratios.append(seconds["torch.nn.Transformer"] / seconds["attnlab"])
    rate = {name: tokens / seconds for name, (seconds, tokens) in totals.items()}
    ratio = rate["attnlab"] / rate["torch.nn.Transformer"]
    spread = ", ".join(f"{r:.2f}" for r in sorted(round_ratios))

    ours.eval()
    sources, length = settings.decoding
    src = batches[0]["src"][:sources]
    padding = src == 0
    limits = torch.full((src.shape[0],), length - 1)
    timings = {}
    for cache in (True, False):
        start = time.perf_counter()
        # eos=-1 is no token id, so no hypothesis ends early: length - 1 free steps, then
        # the step that forces "eos" (the last id), `length` tokens each
        hypotheses = greedy(ours, src, padding, 2, -1, limits, cache=cache)
        timings[cache] = time.perf_counter() - start
        assert all(len(h) == length for h in hypotheses)
    return f"""## Translation speed (`make bench-translation`)

Command: `python benchmarks/translation.py speed --batches {count} --rounds {rounds}` on {machine()}.

Training: model={settings.preset} dimensions (d_model {cfg.d_model}, {cfg.n_heads} heads, {cfg.n_layers} + {cfg.decoder_layers} layers, FFN {cfg.d_ff}, dropout
{cfg.dropout}, pre-LN, GELU), vocabulary {vocab}, {count} Multi30k batches of at most 4096
tokens, {rounds} alternating rounds; forward + backward + AdamW step.

| model | target tokens/s |
|---|---|
| attnlab EncoderDecoder (pe=sinusoidal, norm=softmax, synthesizer=dot) | {rate["attnlab"]:.0f} |
| torch.nn.Transformer, same dimensions, embeddings and output | {rate["torch.nn.Transformer"]:.0f} |
| **ratio** (target ≥ 1.0) | **{ratio:.2f}** |

Ratio in each round, sorted: {spread}.

Greedy decoding of {length} tokens for {src.shape[0]} sources: with the key/value cache
{timings[True]:.2f} s, recomputing every prefix {timings[False]:.2f} s: **{timings[False] / timings[True]:.1f}×**
faster with the cache (target ≥ 5×).
"""


def measured_rows() -> dict[str, str]:
    """Quality rows already in BENCHMARKS.md, by configuration label."""
    path = benchmarks_file()
    text = path.read_text() if path.exists() else ""
    section = text.partition("<!-- translation-quality:start -->")[2]
    section = section.partition("<!-- translation-quality:end -->")[0]
    rows = (line for line in section.splitlines() if line.startswith("| "))
    return {row.split(" | ")[0][2:]: row for row in rows if row.split(" | ")[0][2:] in QUALITY_RUNS}


def budget(args: argparse.Namespace) -> list[str]:
    """train.py overrides that end a quality run."""
    if args.smoke:
        return SMOKE_BUDGET
    return [f"+trainer.max_time=00:00:{args.minutes:02d}:00", "trainer.max_epochs=1000"]


def quality(args: argparse.Namespace, settings: Settings) -> str:
    unknown = set(args.only) - set(QUALITY_RUNS)
    if unknown:
        raise SystemExit(
            f"unknown configuration {sorted(unknown)}; choose from {list(QUALITY_RUNS)}"
        )
    rows = measured_rows() if args.only else {}
    for label, overrides in QUALITY_RUNS.items():
        if args.only and label not in args.only:
            continue
        command = [
            sys.executable, "train.py", f"model={settings.preset}", "task=multi30k",
            "task.data.source=local", f"task.data.dir={MULTI30K}", *budget(args),
            "callbacks.progress_bar.refresh_rate=0", *settings.overrides, *overrides,
        ]  # fmt: skip
        print(" ".join(command[1:]), flush=True)
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"{' '.join(command[1:])} failed:\n{run.stderr[-3000:]}")
        output = run.stdout
        metrics = dict(re.findall(r"^(test/\w+|val/\w+)\s+([\d.]+)$", output, re.M))
        run_dir = re.search(r"^run dir\s+(\S+)$", output, re.M).group(1)
        epochs = len(list(Path(run_dir, "hypotheses").glob("val_epoch*.txt")))
        rows[label] = (
            f"| {label} | {float(metrics['test/bleu']):.1f} | {float(metrics['test/chrf']):.1f} "
            f"| {float(metrics['val/bleu']):.1f} | {epochs} |"
        )
        print(rows[label], flush=True)
    table = "\n".join(rows[label] for label in QUALITY_RUNS if label in rows)
    return f"""## Translation quality (`make bench-translation`)

Command: `python benchmarks/translation.py quality --minutes {args.minutes}` on {machine()}:
`train.py model={settings.preset} task=multi30k` (en→de, the shared Multi30k files, joint 8000-piece
SentencePiece vocabulary) for {args.minutes} minutes of wall time per configuration
(validation included), then the test BLEU (sacreBLEU, 2016 Flickr test set, beam 4) of the
checkpoint with the best validation BLEU (greedy). Target: BLEU ≥ 30 for the first row.

| configuration | test BLEU | test chrF | last val BLEU | epochs |
|---|---|---|---|---|
{table}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="which", required=True)
    speed_parser = sub.add_parser("speed")
    speed_parser.add_argument("--batches", type=int, default=20)
    speed_parser.add_argument("--rounds", type=int, default=5)
    speed_parser.add_argument("--smoke", action="store_true", help="tiny sizes, no writing")
    quality_parser = sub.add_parser("quality")
    quality_parser.add_argument("--minutes", type=int, default=30)
    quality_parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="LABEL",
        help="run these configurations (quoted labels) and keep the other rows of BENCHMARKS.md",
    )
    quality_parser.add_argument("--smoke", action="store_true", help="tiny sizes, no writing")
    args = parser.parse_args()
    if not MULTI30K.is_dir():
        raise SystemExit(f"the benchmarks read Multi30k from {MULTI30K}, which is absent")
    subparser = speed_parser if args.which == "speed" else quality_parser
    with tempfile.TemporaryDirectory() as directory:
        settings = smoke_settings(Path(directory)) if args.smoke else DOCUMENTED
        body = speed(args, settings) if args.which == "speed" else quality(args, settings)
    at_documented_settings = documented(subparser, args, free=("which", "only"))
    report(f"translation-{args.which}", body, at_documented_settings)


if __name__ == "__main__":
    main()
