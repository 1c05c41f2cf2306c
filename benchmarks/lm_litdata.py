"""A tokenized corpus on disk: attnlab's memory-mapped token stream against LitData's
optimized chunks (Lightning's streaming format), on the same corpus with the same encoder.

    python benchmarks/lm_litdata.py            # 256 MB -> BENCHMARKS.md (section lm-litdata)
    python benchmarks/lm_litdata.py --smoke    # 4 MB, no writing

LitData is not one of attnlab's dependencies (its torchvision requirement serves images, and
pulls a CUDA build here); to run this, install it beside attnlab:
    pip install --no-deps litdata==0.2.76 obstore tifffile boto3 botocore s3transfer jmespath

1. A generated corpus (lm_data.generate_corpus) and `attnlab tokenize` on it, which trains
   the SentencePiece model both sides then encode with.
2. Writing, each in a process of its own, with the same number of worker processes (the
   cores): `attnlab tokenize` with its stream removed (one uint16 ids.bin, memory-mapped
   later), and `litdata.optimize` over the same files, each document's ids and EOS, into
   TokensLoader chunks of 64 MB: seconds, peak resident memory of the process tree, bytes.
3. Reading, each in a process of its own: the time to the first batch (opening what was
   written, one batch of 16 windows of 257 tokens) and windows/s over --windows windows,
   num_workers=0: attnlab's TrainWindows at random offsets (its WindowSampler) through a
   DataLoader; LitData's StreamingDataset(TokensLoader(block_size=257), shuffle=True) through
   its StreamingDataLoader, which shuffles chunks and the non-overlapping blocks in them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks_common import documented, machine, report
from lm_data import MB, cores, corpus_settings, generate_corpus, measured

from attnlab.data.documents import corpus_files, read_documents
from attnlab.data.tokenizer import EOS_ID

BLOCK, BATCH = 256, 16


def encoded_documents(path: str, model: str):
    """LitData's `fn`: one corpus file's documents, each as ids then EOS."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=model)
    for text in read_documents(Path(path), "text"):
        yield torch.tensor([*processor.encode(text), EOS_ID], dtype=torch.uint16)


def litdata_optimize(corpus: Path, model: Path, out: Path) -> None:
    from litdata import TokensLoader, optimize

    files = [str(path) for path in corpus_files(corpus)]
    optimize(
        fn=partial(encoded_documents, model=str(model)), inputs=files, output_dir=str(out),
        chunk_bytes="64MB", item_loader=TokensLoader(), num_workers=cores(),
        reorder_files=False,
    )  # fmt: skip


def read_attnlab(directory: Path, windows: int) -> tuple[float, float]:
    from torch.utils.data import DataLoader

    from attnlab.tasks.lm.stream import Stream, TrainWindows, WindowSampler

    started = time.perf_counter()
    data = TrainWindows(Stream(directory), BLOCK, windows)
    loader = iter(
        DataLoader(data, BATCH, sampler=WindowSampler(data, num_replicas=1, rank=0, seed=0))
    )
    next(loader)
    first = time.perf_counter() - started
    started = time.perf_counter()
    read = sum(len(batch) for batch in loader)
    return first, read / (time.perf_counter() - started)


def read_litdata(directory: Path, windows: int) -> tuple[float, float]:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    started = time.perf_counter()
    data = StreamingDataset(
        str(directory), item_loader=TokensLoader(block_size=BLOCK + 1), shuffle=True, seed=0
    )
    loader = iter(StreamingDataLoader(data, batch_size=BATCH, num_workers=0))
    next(loader)
    first = time.perf_counter() - started
    started, read = time.perf_counter(), 0
    while read < windows - BATCH:
        read += len(next(loader))
    return first, read / (time.perf_counter() - started)


def size_of(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--windows", type=int, default=20_000)
    parser.add_argument("--smoke", action="store_true", help="4 MB, no writing")
    args = parser.parse_args()
    at_documented = documented(parser, args)
    args.val_tokens = 65536
    if args.smoke:
        args.megabytes, args.vocab, args.lines, args.windows = 4, 512, 5000, 200
    try:
        import litdata
    except ImportError:
        raise SystemExit(
            f"LitData is not installed: {__doc__.split('install it beside attnlab:')[1]}"
        ) from None
    python = sys.executable
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        generate_corpus(work / "corpus", args.megabytes)
        size = sum(p.stat().st_size for p in (work / "corpus").iterdir()) / MB
        tokenize = [
            python, "-m", "attnlab.commands.cli", "tokenize",
            *corpus_settings(work / "corpus", work / "cache", args),
        ]  # fmt: skip
        measured(tokenize)  # the tokenizer, both sides' encoder
        shutil.rmtree(work / "cache" / "streams")
        ours = measured(tokenize)
        (stream,) = (work / "cache" / "streams").glob("*/ids.bin")
        (model,) = (work / "cache" / "tokenizers").glob("*/*.model")
        theirs = measured([python, __file__, "--optimize", str(work / "corpus"), str(model),
                           str(work / "litdata")])  # fmt: skip
        reads = {}
        for name, directory in (("attnlab", stream.parent), ("litdata", work / "litdata")):
            done = measured([python, __file__, "--read", name, str(directory), str(args.windows)])
            reads[name] = (*json.loads(done[2].strip().splitlines()[-1]), done[1])
        disk = {"attnlab": stream.stat().st_size, "litdata": size_of(work / "litdata")}
    rows = [
        f"| {name} | {build[0]:.0f} | {size / build[0]:.1f} | {build[1] / MB:,.0f} | "
        f"{disk[name] / MB:,.0f} | {reads[name][0]:.2f} | {reads[name][1]:,.0f} | "
        f"{reads[name][2] / MB:,.0f} |"
        for name, build in (("attnlab", ours), ("litdata", theirs))
    ]
    body = f"""## Token stream or LitData chunks (`benchmarks/lm_litdata.py`)

`python benchmarks/lm_litdata.py` ({machine()}, {cores()} cores, LitData
{litdata.__version__}): {size:,.0f} MB of generated documents, the same SentencePiece BPE
of {args.vocab:,} pieces on both sides; windows of {BLOCK + 1} tokens in batches of {BATCH},
{args.windows:,} of them read, num_workers=0. Writing: `attnlab tokenize` (one uint16
ids.bin) against `litdata.optimize` (TokensLoader chunks of 64 MB, uint16 ids), {cores()} worker
processes each. Reading: the first batch's time includes opening what was written.

| format | write s | write MB/s | write peak MB | disk MB | first batch s | windows/s | read peak MB |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""
    report("lm-litdata", body, at_documented and not args.smoke)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--optimize":  # step 2, in a process of its own
        litdata_optimize(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    elif len(sys.argv) == 5 and sys.argv[1] == "--read":  # step 3, likewise
        reader = {"attnlab": read_attnlab, "litdata": read_litdata}[sys.argv[2]]
        print(json.dumps(reader(Path(sys.argv[3]), int(sys.argv[4]))))
    else:
        main()
