"""A gigabyte corpus tokenized and trained on: speed and memory of attnlab's data path.

    python benchmarks/lm_data.py              # a 1,024 MB generated corpus -> BENCHMARKS.md
    python benchmarks/lm_data.py --smoke      # 8 MB, no writing

1. A corpus of --megabytes MB: generated documents of English-like text (words of a
   generated vocabulary drawn from a Zipf law, in sentences and paragraphs), seeded, as
   .jsonl files of 64 MB.
2. attnlab: `attnlab tokenize` (SentencePiece BPE of --vocab pieces trained on --lines
   sampled lines, task.data.num_threads = the cores), a process of its own: wall time, MB of
   corpus per second and per core, and the peak resident memory of the process and its
   workers together (summed over the process tree, sampled from /proc every 0.1 s); once
   training the tokenizer first, once again with it cached (the streams removed).
3. nanoGPT's data/openwebtext/prepare.py approach on the same files, measured alike:
   datasets.load_dataset("json"), .map(encode, num_proc=cores), one uint16 memmap written in
   1,024 shards. Its encoder is the SentencePiece model of 2 (tiktoken's GPT-2 files cannot
   be downloaded here), so the two differ in their pipelines only.
4. Encoders: SentencePiece against Hugging Face tokenizers' byte-level BPE, each trained on
   the same sampled lines to --vocab pieces, encoding the same 16 MB on one core: MB/s.
5. Training on the tokenized corpus: train.py task=lm source=corpus with model=small (width
   256, 3 layers), block 256, batch 16: the wall time of a run of one step (start-up: imports,
   the model, the cache checked and mapped, one step), and a run of --steps steps, its
   tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import ROOT, documented, machine, report

from attnlab.data.tokenizer import cut

FILE_MB = 64
MB = 1 << 20
QUIET = ["callbacks.progress_bar.refresh_rate=0", "extras.print_config=false"]


def generate_corpus(directory: Path, megabytes: int, seed: int = 0) -> None:
    """Documents of sentences of Zipf-drawn words, as .jsonl files of FILE_MB MB."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1 / np.arange(1, 27)
    vocabulary = np.array([
        "".join(rng.choice(letters, int(rng.integers(1, 10)), p=weights / weights.sum()))
        for _ in range(30_000)
    ])  # fmt: skip
    directory.mkdir(parents=True)
    written, index = 0, 0
    while written < megabytes * MB:
        size = min(FILE_MB, megabytes - written // MB) * MB
        lines, held = [], 0
        while held < size:
            words = vocabulary[np.minimum(rng.zipf(1.2, 4000), len(vocabulary)) - 1]
            cuts = np.cumsum(rng.integers(5, 25, 300))
            sentences = [" ".join(s).capitalize() + "." for s in np.split(words, cuts) if len(s)]
            paragraphs = np.split(np.array(sentences, dtype=object), [len(sentences) // 2])
            text = "\n\n".join(" ".join(p) for p in paragraphs)
            lines.append(json.dumps({"text": text}))
            held += len(text)
        (directory / f"part{index:03d}.jsonl").write_text("\n".join(lines) + "\n")
        written, index = written + held, index + 1


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def tree_rss(pid: int) -> int:
    total = 0
    for each in descendants(pid):
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        if found := re.search(r"VmRSS:\s+(\d+) kB", status):
            total += int(found.group(1)) * 1024
    return total


def measured(command: list[str], cwd: Path = ROOT) -> tuple[float, int, str]:
    """Wall seconds, peak RSS of the process tree, and its output; stops on a failure."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    peak, output = [0], []
    reader = threading.Thread(target=lambda: output.append(process.stdout.read()))
    reader.start()
    while process.poll() is None:
        peak[0] = max(peak[0], tree_rss(process.pid))
        time.sleep(0.1)
    reader.join()
    seconds = time.perf_counter() - started
    if process.returncode:
        raise SystemExit(f"{' '.join(command[:4])} ... failed:\n{output[0][-3000:]}")
    return seconds, peak[0], output[0]


def cores() -> int:
    return len(os.sched_getaffinity(0))


def corpus_settings(corpus: Path, cache: Path, args: argparse.Namespace) -> list[str]:
    return [
        "task=lm", "task.data.source=corpus", f"task.data.dir={corpus}",
        f"task.data.vocab_size={args.vocab}", f"task.data.tokenizer_lines={args.lines}",
        f"task.data.val_tokens={args.val_tokens}", f"paths.data_dir={cache}",
        f"task.data.num_threads={cores()}",
    ]  # fmt: skip


def nanogpt_prepare(corpus: Path, model: Path, out: Path, workers: int) -> None:
    """nanoGPT's data/openwebtext/prepare.py, its encoder replaced by `model`."""
    import datasets
    import sentencepiece as spm

    files = sorted(str(p) for p in corpus.glob("*.jsonl"))
    cache = out.parent / "hf"
    dataset = datasets.load_dataset("json", data_files=files, split="train", cache_dir=str(cache))
    processor = spm.SentencePieceProcessor(model_file=str(model))
    eot = 3

    def process(example: dict) -> dict:
        ids = [*processor.encode(example["text"]), eot]
        return {"ids": ids, "len": len(ids)}

    tokenized = dataset.map(process, remove_columns=["text"], num_proc=workers)
    length = int(np.sum(tokenized["len"], dtype=np.uint64))
    array = np.memmap(out, dtype=np.uint16, mode="w+", shape=(length,))
    shards, index = min(1024, len(tokenized)), 0
    for shard in range(shards):
        batch = tokenized.shard(num_shards=shards, index=shard, contiguous=True)
        ids = np.concatenate(batch.with_format("numpy")["ids"])
        array[index : index + len(ids)] = ids
        index += len(ids)
    array.flush()


def encoder_speeds(sample: list[str], text: list[str], vocab: int) -> dict[str, float]:
    """MB/s on one core of SentencePiece and HF tokenizers' byte-level BPE, same vocabulary."""
    import io

    import sentencepiece as spm
    from tokenizers import ByteLevelBPETokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab, model_type="bpe",
        character_coverage=1.0, num_threads=1, minloglevel=2,
    )  # fmt: skip
    piece = spm.SentencePieceProcessor(model_proto=model.getvalue())
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(sample, vocab_size=vocab, show_progress=False)
    size = sum(len(t.encode()) for t in text) / MB
    speeds = {}
    for name, encode in (
        ("SentencePiece BPE", lambda: piece.encode(text)),
        ("HF tokenizers byte-level BPE", lambda: bpe.encode_batch(text)),
    ):
        os.environ["RAYON_NUM_THREADS"] = "1"
        started = time.perf_counter()
        encode()
        speeds[name] = size / (time.perf_counter() - started)
    return speeds


def summary_value(output: str, key: str) -> float:
    found = re.search(rf"^{re.escape(key)} +([\d.]+)", output, re.M)
    if not found:
        raise SystemExit(f"no {key} in the run's summary:\n{output[-2000:]}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--val-tokens", type=int, default=1_048_576)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="8 MB, 20 steps, no writing")
    args = parser.parse_args()
    at_documented = documented(parser, args)
    if args.smoke:
        args.megabytes, args.vocab, args.lines, args.val_tokens, args.steps = 8, 512, 5000, 20000, 5
    python = sys.executable
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        started = time.perf_counter()
        generate_corpus(work / "corpus", args.megabytes)
        size = sum(p.stat().st_size for p in (work / "corpus").iterdir()) / MB
        print(f"generated {size:,.0f} MB in {time.perf_counter() - started:.0f} s", flush=True)
        settings = corpus_settings(work / "corpus", work / "cache", args)
        tokenize = [python, "-m", "attnlab.commands.cli", "tokenize", *settings]
        first_build = measured(tokenize)  # the tokenizer trained, then the stream
        shutil.rmtree(work / "cache" / "streams")
        ours = measured(tokenize)  # the stream alone, the tokenizer read from the cache
        (model,) = (work / "cache" / "tokenizers").glob("*/*.model")
        theirs = measured([
            python, __file__, "--nanogpt", str(work / "corpus"), str(model),
            str(work / "nanogpt" / "train.bin"),
        ])  # fmt: skip
        train = [
            python, "train.py", *settings, "model=small", "model.dropout=0.0", "pe=rope",
            "task.data.block_size=256", "task.data.batch_size=16", "test=false",
            "task.data.eval_lengths=[256]", "trainer.max_epochs=-1", "task.system.samples=0",
            "trainer.check_val_every_n_epoch=null", "trainer.limit_val_batches=0",
            f"paths.log_dir={work / 'logs'}", *QUIET,
        ]  # fmt: skip
        first = measured([*train, "trainer.max_steps=1"])
        steps = measured([*train, f"trainer.max_steps={args.steps}"])
        lines = [
            line
            for p in sorted((work / "corpus").iterdir())[:1]
            for line in (json.loads(row)["text"] for row in p.read_text().splitlines())
        ]
        text = lines[: max(1, len(lines) // 4)]
        sample = [p for doc in lines for line in doc.split("\n") for p in cut(line)]
        speeds = encoder_speeds(sample[: args.lines], text, args.vocab)
    n = cores()
    rows = [
        f"| attnlab tokenize, tokenizer trained first | {first_build[0]:.0f} | "
        f"{size / first_build[0]:.1f} | {size / first_build[0] / n:.1f} | "
        f"{first_build[1] / MB:,.0f} |",
        f"| attnlab tokenize | {ours[0]:.0f} | {size / ours[0]:.1f} | {size / ours[0] / n:.1f} | "
        f"{ours[1] / MB:,.0f} |",
        f"| nanoGPT's prepare.py approach | {theirs[0]:.0f} | {size / theirs[0]:.1f} | "
        f"{size / theirs[0] / n:.1f} | {theirs[1] / MB:,.0f} |",
    ]
    encoders = "\n".join(f"| {name} | {speed:.1f} |" for name, speed in speeds.items())
    tokens_per_s = summary_value(steps[2], "train/tokens_per_s")
    body = f"""## A gigabyte corpus tokenized and trained on (`benchmarks/lm_data.py`)

`make bench-lm-data` ({machine()}, {n} cores): {size:,.0f} MB of generated documents in
.jsonl files, SentencePiece BPE of {args.vocab:,} pieces trained on {args.lines:,} sampled lines;
peak memory is the resident memory of the process and its workers together.

| tokenization | seconds | MB/s | MB/s per core | peak MB |
|---|---|---|---|---|
{chr(10).join(rows)}

The first row trains the tokenizer too: a pass over the corpus to draw the sample, and
SentencePiece on it, whose memory grows with task.data.tokenizer_lines (not the corpus); the
second encodes the corpus with the tokenizer already in the cache, as nanoGPT's row does.
nanoGPT's approach is measured with the same SentencePiece encoder (its tiktoken GPT-2 files
cannot be downloaded here): those two rows differ in their pipelines only.

| encoder, one core, the same {args.vocab:,}-piece vocabulary | MB/s |
|---|---|
{encoders}

Training on the tokenized corpus (model=small: width 256, 3 layers; block 256, batch 16):
a run of one step takes {first[0]:.1f} s from the process start to its end (imports, the
model, the cache checked and mapped, the step); a run of {args.steps} steps trains at
{tokens_per_s:,.0f} tokens/s, with a peak of {steps[1] / MB:,.0f} MB.
"""
    report("lm-data", body, at_documented and not args.smoke)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--nanogpt":  # step 3, in a process of its own
        out = Path(sys.argv[4])
        out.parent.mkdir(parents=True, exist_ok=True)
        nanogpt_prepare(Path(sys.argv[2]), Path(sys.argv[3]), out, cores())
    else:
        main()
