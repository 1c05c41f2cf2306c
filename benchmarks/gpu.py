"""GPU checks and benchmarks (results go to BENCHMARKS.md). Each needs CUDA, except with --smoke.

    python benchmarks/gpu.py check      # FlexAttention = the plain path, forward and backward
    python benchmarks/gpu.py speed      # training tokens/s and MFU, model=base, bf16
    python benchmarks/gpu.py variants   # every pe, norm and synthesizer at L = 512, 2048, 8192
    python benchmarks/gpu.py decode     # cached greedy and beam-5 decoding tokens/s

check: for t5, alibi and key-only shaw with softmax, FlexAttention (compiled) against the
plain path in float32, outputs and gradients of q, k, v and the PE's parameters. Until it
has passed on a GPU, model.flex_attention is off by default.

speed: attnlab's encoder-decoder at Transformer-base dimensions (model=base; pe=sinusoidal,
softmax, dot), torch.nn.Transformer with the same embeddings, positions and output
(benchmarks/translation.py) and x-transformers' XTransformer of the same dimensions (SDPA
attention), each training (forward, backward, AdamW) under bf16 autocast on the same
batches in one process, alternating. Two batch shapes: Multi30k-like (128 pairs of 12-32
tokens) and WMT-like (48 pairs of 40-96 tokens). MFU: the FLOPs that torch's FlopCounterMode
counts in one step, per second, over the device's dense bf16 peak.

variants: a 2-layer encoder at base width, bf16 autocast, B·L = 16,384 tokens, time and
peak memory (torch.cuda.max_memory_allocated) as ratios to pe=none/softmax/dot, at the
model's defaults; the PEs that FlexAttention serves also with model.flex_attention=true.

BENCHMARKS.md is written at the documented settings (the defaults) only. `--smoke` runs
each at tiny sizes on the CPU and writes nothing: the test that keeps this script working.
On the CPU, FlexAttention has no backward pass, so `check --smoke` compares outputs only.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from attention import BASELINE as BASE_CHOICE
from attention import BASELINE_LABEL, attention_at, baseline_of, in_causal_stack, variants
from benchmarks_common import documented, report
from translation import BASELINE, TorchTransformer

from attnlab import flops
from attnlab.attention.core import AttentionParts, Compute, attend, flex_path
from attnlab.config.options import variant
from attnlab.decoding.encoder_decoder import beam_search, greedy
from attnlab.model.architecture import ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import EncoderDecoder, Tagger, attention_mask
from attnlab.shape import StackShape


@dataclass(frozen=True)
class Scale:
    model: ModelConfig
    vocab: int
    tokens: int  # per batch of `variants`
    shapes: dict[str, tuple[int, int, int]]  # `speed`'s batches: pairs, shortest, longest


FULL = Scale(
    ModelConfig(Standard(), d_model=512, n_heads=8, n_layers=6, d_ff=2048),
    10_000,
    16_384,
    {"Multi30k-like": (128, 12, 32), "WMT-like": (48, 40, 96)},
)
SMOKE = Scale(ModelConfig(Standard(), d_model=32, n_heads=2, n_layers=1, d_ff=64), 64, 64,
              {"tiny": (4, 3, 8)})  # fmt: skip
FLEX_PES = {"t5": (), "alibi": (), "shaw": ("value_term=false",)}


def device_line(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"{name}, torch {torch.__version__}"


def peak_flops(device: torch.device) -> float | None:
    return flops.peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def timed(step: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Median seconds of `step` after one warm-up call."""
    step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pairs(shape: tuple[int, int, int], vocab: int, device: torch.device, seed: int = 0):
    """Source and target token batches with lengths drawn in [shortest, longest], padded."""
    n, shortest, longest = shape
    g = torch.Generator().manual_seed(seed)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.randint(shortest, longest + 1, (n,), generator=g)
        tokens = torch.randint(4, vocab, (n, longest), generator=g)
        padding = torch.arange(longest)[None] >= lengths[:, None]
        return tokens.masked_fill(padding, 0).to(device), padding.to(device)

    (src, src_padding), (tgt, tgt_padding) = batch(), batch()
    return src, src_padding, tgt, int((~src_padding).sum() + (~tgt_padding).sum())


def training_step(model: torch.nn.Module, loss_of: Callable[[], torch.Tensor], device):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def seq2seq_loss(model, src, src_padding, tgt) -> Callable[[], torch.Tensor]:
    def loss() -> torch.Tensor:
        logits = model(src, src_padding, tgt[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), ignore_index=0)

    return loss


def x_transformer(scale: Scale, longest: int):
    from x_transformers import XTransformer  # the dev extra (pip install .[dev])

    cfg = scale.model
    side = {"num_tokens": scale.vocab, "depth": cfg.n_layers, "heads": cfg.n_heads,
            "max_seq_len": longest, "attn_flash": True, "ff_mult": cfg.d_ff // cfg.d_model,
            "attn_dim_head": cfg.d_model // cfg.n_heads}  # fmt: skip
    kwargs = {f"{prefix}_{k}": v for prefix in ("enc", "dec") for k, v in side.items()}
    return XTransformer(dim=cfg.d_model, tie_token_emb=True, pad_value=0, ignore_index=0, **kwargs)


def speed(scale: Scale, device: torch.device, repeats: int) -> str:
    lines = ["| batches | model | tokens/s | × nn.Transformer | × x-transformers | MFU |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name, shape in scale.shapes.items():
        lines += speed_rows(scale, f"{name} {shape}", shape, device, repeats)
    return "\n".join(lines)


def competitors(scale: Scale, longest: int, device: torch.device) -> dict:
    cfg, vocab = scale.model, scale.vocab
    torch.manual_seed(0)
    compiled = EncoderDecoder(cfg, BASELINE, vocab, vocab).to(device)
    compiled.compile()
    return {
        "attnlab": EncoderDecoder(cfg, BASELINE, vocab, vocab).to(device),
        "attnlab, model.compile=true": compiled,
        "torch.nn.Transformer": TorchTransformer(cfg, vocab).to(device),
        "x-transformers": x_transformer(scale, longest).to(device),
    }


def speed_rows(scale: Scale, label: str, shape, device: torch.device, repeats: int):
    src, src_padding, tgt, tokens = pairs(shape, scale.vocab, device)
    steps = {}
    for name, model in competitors(scale, shape[2], device).items():
        if name == "x-transformers":  # its wrapper shifts the target and returns the loss
            loss = functools.partial(model, src, tgt, mask=~src_padding)
        else:
            loss = seq2seq_loss(model, src, src_padding, tgt)
        steps[name] = training_step(model, loss, device)
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):  # alternate, so that drifts in clock speed hit all alike
        for name, step in steps.items():
            seconds[name].append(timed(step, device, 1))
    rate = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    peak, rows = peak_flops(device), []
    for name, step in steps.items():
        with FlopCounterMode(display=False) as counter:
            step()
        achieved = counter.get_total_flops() * rate[name] / tokens
        mfu = "n/a" if peak is None else f"{achieved / peak:.1%}"
        vs_torch = rate[name] / rate["torch.nn.Transformer"]
        vs_xt = rate[name] / rate["x-transformers"]
        rows.append(
            f"| {label} | {name} | {rate[name]:,.0f} | {vs_torch:.2f} | {vs_xt:.2f} | {mfu} |"
        )
    return rows


def variant_rows(
    lengths: list[int], scale: Scale, device: torch.device, repeats: int, only: list[str]
):
    """Every variant's (seconds, MiB) per length; with `only`, the baselines and the rows
    whose label contains one of its words."""
    rows = [(label, choice, scale.model.flex_attention) for label, choice in variants()]
    rows += [(f"pe={pe}{' ' + ' '.join(o) if o else ''}, flex on", {**BASE_CHOICE, "pe": pe}, True)
             for pe, o in FLEX_PES.items()]  # fmt: skip
    if only:
        rows = [r for r in rows if r[0].startswith(BASELINE_LABEL) or any(w in r[0] for w in only)]
    results: dict[str, dict[int, str | tuple[float, float]]] = {}
    for label, choice, flex in rows:
        results[label] = {}
        for length in lengths:
            results[label][length] = measure_variant(
                choice, in_causal_stack(label), flex, length, scale, device, repeats
            )
            print(label, length, results[label][length], flush=True)
    return results


def measure_variant(
    choice, causal: bool, flex: bool, length: int, scale: Scale, device, repeats: int
):
    overrides = FLEX_PES.get(choice["pe"], ()) if flex else ()
    attention = attention_at(choice, length, overrides)
    torch.manual_seed(0)
    cfg = replace(scale.model, n_layers=2, dropout=0.0, flex_attention=flex, attention_chunk=None)
    try:
        model = Tagger(cfg, attention, scale.vocab, scale.vocab, causal=causal)
        model = model.to(device)
        batch = max(1, scale.tokens // length)
        tokens = torch.randint(1, scale.vocab, (batch, length), device=device)

        def step() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(tokens, None)
            F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
            model.zero_grad(set_to_none=True)

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = timed(step, device, repeats)
        memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        return seconds, memory / 2**20
    except torch.OutOfMemoryError:
        return "out of memory"


def variants_table(results, lengths: list[int]) -> str:
    head = " | ".join(f"time ×, L={n}" for n in lengths) + " | "
    head += " | ".join(f"memory ×, L={n}" for n in lengths)
    lines = [f"| variant | {head} |", "|---" * (1 + 2 * len(lengths)) + "|"]
    for label, by_length in results.items():
        cells = []
        for index in (0, 1):
            for n in lengths:
                value, reference = by_length[n], results[baseline_of(label)][n]
                ok = isinstance(value, tuple) and isinstance(reference, tuple)
                cells.append(f"{value[index] / max(reference[index], 1e-9):.2f}" if ok else "OOM")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decode(scale: Scale, device: torch.device, batch: int, steps: int, repeats: int) -> str:
    """Hypothesis tokens (EOS included) per second of cached greedy and beam-5 search with
    an untrained model, which seldom ends before `steps` tokens."""
    torch.manual_seed(0)
    model = EncoderDecoder(scale.model, BASELINE, scale.vocab, scale.vocab).to(device).eval()
    src, src_padding, _, _ = pairs((batch, 20, 30), scale.vocab, device)
    limits = torch.full((batch,), steps, device=device)
    lines = ["| search | hypothesis tokens/s |", "|---|---|"]
    for name, beam in (("greedy, cached", 1), ("beam 5, cached", 5)):
        produced = []

        def search(beam: int = beam, produced: list = produced) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                if beam == 1:
                    found = greedy(model, src, src_padding, 1, 2, limits)
                else:
                    found = beam_search(model, src, src_padding, 1, 2, limits, beam, 0.6)
            produced.append(sum(len(h) + 1 for h in found))

        seconds = timed(search, device, repeats)
        lines.append(f"| {name} | {statistics.median(produced) / seconds:,.0f} |")
    return "\n".join(lines)


def check(device: torch.device, sizes: tuple[int, int, int, int]) -> str:
    """FlexAttention against the plain path in float32: outputs, and on CUDA the gradients
    (FlexAttention has no backward pass on the CPU, where it also runs uncompiled)."""
    batch, heads, length, d_h = sizes
    on_gpu = device.type == "cuda"
    pos = torch.arange(length, device=device)
    padding = torch.zeros(batch, length, dtype=torch.bool, device=device)
    padding[1, length - length // 10 :] = True
    x = torch.zeros(batch, length, heads * d_h, device=device)  # the dot synthesizer reads no x
    lines = ["| pe | mask | max abs. Δ output | max abs. Δ gradient / max abs. gradient |",
             "|---|---|---|---|"]  # fmt: skip
    for pe, overrides in FLEX_PES.items():
        for causal in (False, True):
            torch.manual_seed(0)
            shape = StackShape(heads * d_h, heads, d_h, d_h, 2, causal)
            nodes = (variant("pe", pe, *overrides), variant("norm", "softmax"),
                     variant("synthesizer", "dot"))  # fmt: skip
            parts = AttentionParts.from_config(*nodes, shape).to(device)
            q, k, v = (torch.randn(batch, heads, length, d_h, device=device) for _ in range(3))
            mask = attention_mask(pos, pos, padding, causal)
            results = []
            for flex in (True, False):
                wrt = [t.detach().requires_grad_(on_gpu) for t in (q, k, v)]
                with torch.set_grad_enabled(on_gpu):
                    if flex:
                        out = flex_path(parts, 1, *wrt, pos, pos, mask, compiled=on_gpu)
                    else:
                        plain = Compute(fast=False, flex=False)
                        out = attend(parts, 1, x, *wrt, pos, pos, mask, plain)
                params = [p for p in parts.parameters() if p.requires_grad]
                grads = (  # a PE may keep tables for layers other than this one: unused
                    torch.autograd.grad(out.square().sum(), [*wrt, *params], allow_unused=True)
                    if on_gpu
                    else ()
                )
                results.append((out, grads))
            (flex_out, flex_grads), (plain_out, plain_grads) = results
            d_out = (flex_out - plain_out).abs().max().item()
            d_grad = "skipped on the CPU"
            if on_gpu:
                both = zip(flex_grads, plain_grads, strict=True)
                d_grad = f"{max(gradient_gap(a, b) for a, b in both):.1e}"
            mask_name = "causal + padding" if causal else "padding"
            lines.append(f"| {pe} {' '.join(overrides)} | {mask_name} | {d_out:.1e} | {d_grad} |")
    return "\n".join(lines)


def gradient_gap(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """Largest absolute difference over the largest absolute gradient of the plain path `b`
    (the PE tables' gradients sum over every (i, j)); a gradient that one path gives and the
    other does not is an infinite one."""
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def section(title: str, command: str, device: torch.device, body: str) -> str:
    return f"### {title}\n\nCommand: `{command}` on {device_line(device)}.\n\n{body}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["check", "speed", "variants", "decode"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", nargs="+", default=[], help="variants: only these rows")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, no writing")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        sys.exit(
            "benchmarks/gpu.py needs a CUDA GPU (or --smoke, which checks the script on the CPU)"
        )
    device = torch.device("cpu" if args.smoke else "cuda")
    scale = SMOKE if args.smoke else FULL
    command = "python benchmarks/gpu.py " + " ".join(sys.argv[1:])
    if args.what == "check":
        body = check(device, (2, 2, 16, 8) if args.smoke else (4, 8, 1024, 64))
    elif args.what == "speed":
        body = speed(scale, device, args.repeats)
    elif args.what == "variants":
        lengths = [16] if args.smoke else args.lengths
        rows = variant_rows(lengths, scale, device, args.repeats, args.rows)
        body = variants_table(rows, lengths)
    else:
        batch, steps = (2, 4) if args.smoke else (64, 100)
        body = decode(scale, device, batch, steps, args.repeats)
    text = section(args.what, command, device, body)
    report(f"gpu-{args.what}", text, documented(parser, args, free=("what",)))


if __name__ == "__main__":
    main()
