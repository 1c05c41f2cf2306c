"""task=lm: the causal stack, windows and offsets, the char tokenizer, perplexity at every
evaluation length against a naive per-token loop, the bounded-PE path, memorizing a text,
and the hub offline."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
import time

import datasets
import huggingface_hub
import numpy as np
import pytest
import torch
from helpers import CAUSAL_PES, REPEATABLE, ROOT, SHARED_DATA, TEXT, task_data

from attnlab.config.build import build
from attnlab.config.groups import ARCHITECTURE
from attnlab.data.task import NON_OVERLAPPING, SLIDING
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture
from attnlab.model.transformer import DecoderLM
from attnlab.runner.plan import Plan, build_system
from attnlab.runner.train import train
from attnlab.tasks.lm.stream import (
    EOS_ID,
    UNK_ID,
    CharTokenizer,
    TrainWindows,
    WindowSampler,
    restore_tokenizer,
    windows,
)


def write_splits(directory, train=TEXT, valid=TEXT, test=TEXT):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        if text is not None:
            (directory / f"{name}.txt").write_text(text, encoding="utf-8")
    return directory


def lm_overrides(tmp_path, *extra: str, train: str = TEXT, test: str = TEXT) -> list[str]:
    data = write_splits(tmp_path / "text", train=train, test=test)
    return [
        "task=lm", "task.data.source=local", f"task.data.dir={data}", "task.data.tokenizer=char",
        f"paths.data_dir={tmp_path / 'cache'}", "model=tiny", "model.dropout=0.0",
        "trainer.max_epochs=-1", "trainer.check_val_every_n_epoch=null", *extra,
    ]  # fmt: skip


def tiny_network(make_config, pe: str, vocab: int = 13) -> DecoderLM:
    repeatable = [f"pe.{o}" for o in REPEATABLE.get(("pe", pe), ())]
    cfg = make_config(["task=lm", f"pe={pe}", *repeatable, "model=tiny", "model.dropout=0.0"])
    architecture = Architecture.from_config({g: cfg[g] for g in ARCHITECTURE})
    return DecoderLM(architecture.model, architecture.attention, vocab).eval()


@pytest.mark.parametrize("pe", CAUSAL_PES)
def test_no_position_sees_a_later_token(make_config, pe):
    torch.manual_seed(0)
    net = tiny_network(make_config, pe)
    tokens = torch.randint(4, 13, (2, 20))
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] - 3) % 9 + 4  # another ordinary token
    with torch.no_grad():
        before, after = net(tokens), net(changed)
    torch.testing.assert_close(after[:, :12], before[:, :12], rtol=0, atol=1e-6)
    assert (after[:, 12:] - before[:, 12:]).abs().amax() > 1e-4, "position 12 reads its token"


@pytest.mark.parametrize(
    "n,length,stride", [(1, 4, 4), (17, 4, 4), (17, 4, 1), (50, 8, 3), (7, 16, 4)]
)
def test_windows_score_every_prediction_once_with_the_context_the_stride_allows(n, length, stride):
    found = windows(n, length, stride)
    scored = [t for _, end, first in found for t in range(first, end)]
    assert scored == list(range(n)), "each prediction once, in order"
    for start, end, first in found:
        assert 0 <= start <= first < end <= n and end - start <= length
        for t in range(first, end):  # inputs start..t precede prediction t
            assert t - start + 1 >= min(t + 1, length - stride + 1)
    if stride == length:
        assert [(s, f) for s, _, f in found] == [
            (k * length, k * length) for k in range(len(found))
        ]


def test_the_char_tokenizer_maps_unseen_characters_to_one_unknown_symbol(tmp_path, caplog):
    tokenizer = CharTokenizer("abca")
    assert tokenizer.vocab_size == 4 + 3
    assert tokenizer.encode("abz").tolist() == [4, 5, UNK_ID]
    assert tokenizer.decode(tokenizer.encode("cab")) == "cab"
    directory = write_splits(tmp_path / "text", train="abc\n" * 10, valid="abz\nzz\n", test=None)
    data = task_data("lm", source="local", dir=str(directory), tokenizer="char", block_size=4,
                        cache=tmp_path / "cache")  # fmt: skip
    valid = data.stream("valid")
    assert valid.meta["unknown"] == 3 and int((np.asarray(valid.ids) == UNK_ID).sum()) == 3
    assert "valid: 3 of 7 characters are not in the training split's vocabulary" in caplog.text
    assert not data.has_split("test")


def test_training_windows_are_seeded_slices_of_the_stream_and_resume_in_place(tmp_path):
    directory = write_splits(tmp_path / "text", train=TEXT * 20)
    data = task_data("lm", source="local", dir=str(directory), tokenizer="char", block_size=8,
                        batch_size=4, seed=3, cache=tmp_path / "cache")  # fmt: skip
    loader = data.train_dataloader()
    ids = torch.as_tensor(np.asarray(data.stream("train").ids, np.int64))
    first = list(loader)
    assert len(first) == math.ceil(len(ids) // 8 / 4)
    for batch in first:
        assert batch.shape[1] == 9
        for row in batch:  # a contiguous slice somewhere in the stream
            starts = [s for s in range(len(ids) - 8) if torch.equal(ids[s : s + 9], row)]
            assert starts
    assert all(torch.equal(a, b) for a, b in zip(first, list(loader), strict=True)), "seeded"
    loader.sampler.set_epoch(1)
    assert not torch.equal(next(iter(loader)), first[0]), "a new epoch draws new offsets"
    loader.sampler.set_epoch(0)
    loader.resume_after(3)
    assert all(torch.equal(a, b) for a, b in zip(list(loader), first[3:], strict=True))
    sampler = WindowSampler(
        TrainWindows(data.stream("train"), 8, 10), seed=3, num_replicas=2, rank=1
    )
    other = WindowSampler(TrainWindows(data.stream("train"), 8, 10), seed=3, num_replicas=2, rank=0)
    assert set(sampler.order()).isdisjoint(range(len(ids) - 8, len(ids)))
    assert len(sampler.order()) == len(other.order()) == 5


def naive_losses(
    net: DecoderLM, ids: torch.Tensor, length: int, stride: int
) -> list[tuple[float, int]]:
    """(loss, position in its window) of each prediction t, one forward pass per prediction:
    the context of t starts where the window that scores it starts."""
    out = []
    for t in range(len(ids) - 1):
        end = length + max(0, math.ceil((t + 1 - length) / stride)) * stride
        start = (
            t // length * length if stride == length else max(0, min(end, len(ids) - 1) - length)
        )
        logits = net(ids[None, start : t + 1])[0, -1]
        out.append((float(-torch.log_softmax(logits, -1)[ids[t + 1]]), t - start + 1))
    return out


def test_every_length_and_both_windowings_match_a_naive_loop_in_float64(make_config, tmp_path):
    cfg = make_config(lm_overrides(tmp_path, "pe=rope", "task.data.block_size=8",
                                   "task.data.eval_lengths=[8,16,32]", "task.data.eval_stride=3"))  # fmt: skip
    data = build(cfg.task.data)
    data.restore({"lm_tokenizer": {"kind": "char", "model": data.tokenizer.serialized()}}, "test")
    torch.manual_seed(0)
    system = build_system(Plan.from_config(cfg), data).double().eval()
    with torch.no_grad():
        for batch in data.test_dataloader():
            system._accumulate(batch)
        ids = torch.as_tensor(np.asarray(data.stream("test").ids, np.int64))
        for length in (8, 16, 32):
            for windows, stride in ((NON_OVERLAPPING, length), (SLIDING, 3)):
                naive = naive_losses(system.net, ids, length, stride)
                nll, count = system.sums[(windows, length)].tolist()
                assert count == len(ids) - 1
                assert nll / count == pytest.approx(np.mean([loss for loss, _ in naive]), abs=1e-10)
            per = system.by_position[length]
            windows = naive_losses(system.net, ids, length, length)
            for position in range(1, length + 1):
                at = [loss for loss, p in windows if p == position]
                assert per[1, position - 1] == len(at)
                if at:
                    assert float(per[0, position - 1] / len(at)) == pytest.approx(
                        np.mean(at), abs=1e-10
                    )


def test_lengths_past_a_bounded_pe_are_not_applicable_and_nothing_fails(make_config, tmp_path):
    cfg = make_config(lm_overrides(
        tmp_path, "pe=learned", "pe.max_len=16", "task.data.block_size=8",
        "task.data.eval_lengths=[8,16,32]", "trainer.max_steps=2",
        "trainer.val_check_interval=2", "task.system.sample_tokens=40",
    ))  # fmt: skip
    metrics = train(cfg)
    assert math.isfinite(metrics["test/ppl@16"]) and math.isfinite(metrics["test/ppl_sliding@16"])
    assert math.isnan(metrics["test/ppl@32"]) and math.isnan(metrics["test/ppl_sliding@32"])
    record = json.loads((tmp_path / "lengths" / "test.json").read_text())
    assert record["max_positions"] == 16 and record["lengths"]["32"] == {"applicable": False}
    assert record["lengths"]["16"]["tokens"] == len(TEXT) - 1
    lines = (tmp_path / "lengths" / "test_loss_by_position.csv").read_text().splitlines()
    assert {line.split(",")[0] for line in lines[1:]} == {"8", "16"}
    assert (tmp_path / "lengths" / "test_ppl_by_length.png").stat().st_size > 0


@pytest.mark.slow
def test_a_tiny_model_memorizes_a_short_text(make_config, tmp_path):
    """Past the first few characters of a window (which no context determines), the text is
    known; it is trained as a repeated stream, so that windows start at every character."""
    cfg = make_config(lm_overrides(
        tmp_path, "pe=rope", "model.d_model=64", "model.d_ff=128", "task.data.block_size=32",
        "task.data.batch_size=16", "task.optim.lr=3e-3", "task.optim.warmup_steps=20",
        "trainer.max_steps=300", "trainer.val_check_interval=300", "task.system.samples=0",
        "task.data.eval_lengths=[32]", train=TEXT * 10, test=TEXT * 2,
    ))  # fmt: skip
    train(cfg)
    rows = (tmp_path / "lengths" / "test_loss_by_position.csv").read_text().splitlines()[1:]
    late = [float(loss) for _, position, loss, _ in map(lambda r: r.split(","), rows)
            if int(position) > 8]  # fmt: skip
    assert len(late) == 24 and max(late) < 0.02, late


def test_an_offline_hub_stops_in_seconds_with_the_local_options(make_config, tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", no_network)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("no download"))
    data = build(make_config(["task=lm", f"paths.data_dir={tmp_path}"]).task.data)
    started = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        data.prepare_data()
    assert time.perf_counter() - started < 5
    message = str(error.value)
    assert "could not reach 'Salesforce/wikitext'" in message
    assert "task.data.source=local with task.data.dir=" in message and "\n" not in message


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["task.data.fractions=[0.9,0.2]"], "must be 2 or 3 positive numbers adding up to 1"),
        (["task.data.tokenizer=bytes"], "task.data.tokenizer='bytes' is not one of: char"),
        (["task.data.block_size=1"], "task.data.block_size=1 must be an integer of at least 2"),
        (["task.data.dir=null"], "needs one of task.data.dir="),
        (
            ["task.data.dir=null", "task.data.file=missing/input.txt"],
            "task.data.file=missing/input.txt is not a file: give one UTF-8 text file (such as "
            "Tiny Shakespeare's input.txt), which task.data.fractions cuts into its train, valid "
            "(and test) parts",
        ),
    ],
)
def test_bad_settings_are_one_sentence(make_config, tmp_path, overrides, expected):
    cfg = make_config([*lm_overrides(tmp_path), *overrides])
    if "fractions" in overrides[0]:
        cfg = make_config([*lm_overrides(tmp_path), "task.data.dir=null",
                           f"task.data.file={tmp_path / 'text' / 'train.txt'}", *overrides])  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape(expected)):
        build(cfg.task.data)


@pytest.mark.skipif(
    not (SHARED_DATA / "tinyshakespeare" / "input.txt").is_file(),
    reason=f"the shared Tiny Shakespeare is not at {SHARED_DATA / 'tinyshakespeare'}",
)
def test_one_file_splits_as_nanogpt_does(tmp_path):
    path = SHARED_DATA / "tinyshakespeare" / "input.txt"
    text = path.read_text(encoding="utf-8")
    data = task_data("lm", source="local", file=str(path), tokenizer="char", block_size=64,
                        cache=tmp_path)  # fmt: skip
    n = len(text)
    assert len(data.stream("train")) == int(n * 0.9) and data.tokenizer.vocab_size == 4 + 65
    assert data.tokenizer.decode(data.stream("valid").ids[:50]) == text[int(n * 0.9) :][:50]
    assert not data.has_split("test")


def test_sentencepiece_streams_make_each_line_break_eos_and_decode_back(tmp_path):
    directory = write_splits(tmp_path / "text", train=TEXT * 30)
    data = task_data("lm", source="local", dir=str(directory), tokenizer="sentencepiece",
                        vocab_size=40, block_size=8, cache=tmp_path / "cache")  # fmt: skip
    tokenizer = data.tokenizer
    ids = tokenizer.encode(TEXT)
    assert int((ids == EOS_ID).sum()) == TEXT.count("\n")
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.encode("All:")[-1] != EOS_ID, "a line the text leaves open stays open"
    assert np.array_equal(np.asarray(data.stream("valid").ids, np.int64), ids)


def csv_metrics(run_dir) -> dict[str, float]:
    """The last value of every metric in a run's csv/metrics.csv."""
    with (run_dir / "csv" / "metrics.csv").open() as file:
        return {k: float(v) for row in csv.DictReader(file) for k, v in row.items() if v}


@pytest.mark.slow
def test_ddp_ranks_share_the_windows_and_score_the_split_as_one_process_does(tmp_path):
    """Two CPU ranks each score their share of the test windows; the sums they reduce give
    one process's perplexity at every length, both windowings."""
    data = write_splits(tmp_path / "text", train=TEXT * 20, test=TEXT * 3)
    common = [
        "task=lm", "task.data.source=local", f"task.data.dir={data}", "task.data.tokenizer=char",
        "task.data.block_size=8", "task.data.eval_lengths=[8,16,64]", "task.data.eval_stride=3",
        "task.data.eval_batch_tokens=64", f"paths.data_dir={tmp_path / 'cache'}",
        "callbacks.progress_bar.refresh_rate=0", "extras.print_config=false",
    ]  # fmt: skip
    trained = tmp_path / "ddp"
    run = subprocess.run(
        [sys.executable, "train.py", "trainer=ddp_cpu", *common, "model=tiny",
         "trainer.max_steps=4", "trainer.max_epochs=-1", "trainer.check_val_every_n_epoch=null",
         "trainer.val_check_interval=4", f"hydra.run.dir={trained}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    best = trained / "checkpoints" / "step_000004.ckpt"  # validated by steps: named by step
    single = tmp_path / "single"
    evaluated = subprocess.run(
        [sys.executable, "eval.py", f"ckpt_path={best}", "trainer=cpu", *common,
         f"hydra.run.dir={single}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    ddp, one = csv_metrics(trained), csv_metrics(single)
    names = [f"test/{m}@{n}" for m in ("ppl", "ppl_sliding") for n in (8, 16, 64)]
    for name in names:
        assert ddp[name] == pytest.approx(one[name], rel=1e-5), name
    assert ddp["test/examples"] == ddp["test/examples_total"] == one["test/examples_total"]


def test_bf16_autocast_trains_and_evaluates_every_length(make_config, tmp_path):
    cfg = make_config(lm_overrides(
        tmp_path, "trainer.precision=bf16-mixed", "trainer.max_steps=2",
        "trainer.val_check_interval=2", "task.data.block_size=8", "task.data.eval_lengths=[8,16]",
        "task.system.sample_tokens=10",
    ))  # fmt: skip
    metrics = train(cfg)
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["test/ppl@16"])


@pytest.mark.parametrize(
    "stored",
    [None, {"kind": "bpe", "model": b"x"}, {"kind": "char", "model": b"\xff\xfe"},
     {"kind": "sentencepiece", "model": b"not a model"}, {"kind": "char", "model": "ab"}],
)  # fmt: skip
def test_a_missing_or_damaged_stored_tokenizer_is_one_sentence(stored):
    with pytest.raises(ConfigError, match="the checkpoint's tokenizer is missing or damaged"):
        restore_tokenizer(stored)
    restored = restore_tokenizer({"kind": "char", "model": CharTokenizer("ba").serialized()})
    assert restored.characters == "ab"


def test_validation_samples_need_a_prompt(make_config, tmp_path):
    cfg = make_config(lm_overrides(tmp_path, "task.system.sample_prompt=''"))
    with pytest.raises(ConfigError, match="sample_prompt='' gives validation samples nothing"):
        build_system(Plan.from_config(cfg), build(cfg.task.data))
    cfg = make_config(
        lm_overrides(tmp_path, "task.system.sample_prompt=''", "task.system.samples=0")
    )
    assert build_system(Plan.from_config(cfg), build(cfg.task.data)).samples == 0


def test_a_text_shorter_than_one_training_window_says_what_it_needs(make_config, tmp_path):
    from attnlab.errors import ConfigError
    from attnlab.runner.train import train

    text = tmp_path / "short.txt"
    text.write_text("short text\n")
    cfg = make_config(["task=lm", "task.data.source=local", f"task.data.file={text}",
                       "task.data.tokenizer=char", "model=tiny", "test=false",
                       f"paths.data_dir={tmp_path / 'cache'}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"needs at least 257 tokens: one window of "
                       r"task.data.block_size=256 tokens and the token after it; give"):  # fmt: skip
        train(cfg)


def test_tokens_per_step_accumulates_batches_into_the_step_of_one_larger_batch(tmp_path):
    """Windows are drawn in the same order whatever the batch size, and Lightning averages the
    losses of the accumulated batches: two batches of 4 windows make one step of 8 (over
    epochs of whole steps: 64 windows)."""
    from helpers import compose_config

    weights = {}
    for name, extra in {
        "accumulated": ["task.data.batch_size=4", "task.data.tokens_per_step=128"],
        "one_batch": ["task.data.batch_size=8"],
    }.items():
        cfg = compose_config(
            lm_overrides(tmp_path, *extra, "task.data.block_size=16", "trainer.max_steps=3",
                         "task.data.eval_lengths=[16]", "task.system.samples=0", "~logger", "task.data.train_windows=64",
                         "test=false", "trainer.val_check_interval=3", "task.optim.lr=1e-2",
                         "task.optim.warmup_steps=0"),
            tmp_path / name,
        )  # fmt: skip
        train(cfg)
        checkpoint = tmp_path / name / "checkpoints" / "last.ckpt"
        weights[name] = torch.load(checkpoint, weights_only=True)["state_dict"]
    for key, value in weights["one_batch"].items():
        torch.testing.assert_close(weights["accumulated"][key], value, atol=1e-4, rtol=1e-4)


def test_tokens_per_step_that_batches_do_not_divide_is_one_sentence(make_config, tmp_path):
    cfg = make_config(lm_overrides(tmp_path, "task.data.batch_size=4", "task.data.block_size=16",
                                   "task.data.tokens_per_step=100"))  # fmt: skip
    data = build(cfg.task.data)
    with pytest.raises(ConfigError, match=r"tokens_per_step=100 is not a multiple of the 128"):
        data.batches_per_step(2)
    cfg = make_config(lm_overrides(tmp_path, "task.data.batch_size=4", "task.data.block_size=16",
                                   "task.data.tokens_per_step=256"))  # fmt: skip
    data = build(cfg.task.data)
    assert data.batches_per_step(2) == 2
    data.prepare_data()
    windows = len(data.train_dataloader().dataset)
    assert windows % 16 == 0 and windows >= len(data.stream("train")) // 16, "whole steps"


@pytest.mark.slow
def test_two_ddp_ranks_accumulating_take_the_steps_of_one_process(tmp_path):
    """tokens_per_step over 2 ranks of batch 4: each accumulates 2 batches a step, of windows
    that the ranks deal alternately from one draw, so a step averages the gradients of the 16
    windows that one process takes in one batch of 16 (dropout off)."""
    data = write_splits(tmp_path / "text", train=TEXT * 20)
    common = [
        "task=lm", "task.data.source=local", f"task.data.dir={data}", "task.data.tokenizer=char",
        "task.data.block_size=8", "task.data.eval_lengths=[8]", "task.data.train_windows=64",
        f"paths.data_dir={tmp_path / 'cache'}", "model=tiny", "model.dropout=0.0",
        "trainer.max_steps=3", "trainer.max_epochs=-1", "trainer.check_val_every_n_epoch=null",
        "trainer.val_check_interval=3", "task.optim.lr=1e-2", "task.optim.warmup_steps=0",
        "test=false", "task.system.samples=0", "callbacks.progress_bar.refresh_rate=0",
        "extras.print_config=false",
    ]  # fmt: skip
    runs = {
        "ddp": ["trainer=ddp_cpu", "task.data.batch_size=4", "task.data.tokens_per_step=128"],
        "one": ["trainer=cpu", "task.data.batch_size=16"],
    }
    weights = {}
    for name, extra in runs.items():
        run = subprocess.run(
            [sys.executable, "train.py", *common, *extra, f"hydra.run.dir={tmp_path / name}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        last = tmp_path / name / "checkpoints" / "last.ckpt"
        weights[name] = torch.load(last, weights_only=True)["state_dict"]
    for key, value in weights["one"].items():
        torch.testing.assert_close(weights["ddp"][key], value, atol=1e-4, rtol=1e-4)
