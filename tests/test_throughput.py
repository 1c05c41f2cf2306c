"""train/tokens_per_s: the tokens a system reads per batch, over the time of the steps."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import OPTIM, decode_node

from attnlab.config.options import variant
from attnlab.data.batching import collate
from attnlab.data.cache import EncodedPair
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.decoding.encoder_decoder import DecodeConfig
from attnlab.model.architecture import Architecture
from attnlab.runner import callbacks
from attnlab.runner.callbacks import TokenThroughput
from attnlab.tasks.probe.data import ProbeDataModule, probe_example
from attnlab.tasks.probe.data import collate as probe_collate
from attnlab.tasks.probe.system import TaggerSystem
from attnlab.tasks.seq2seq.system import Seq2SeqSystem

ARCHITECTURE = Architecture.from_config(
    {
        "model": variant("model", "tiny"),
        "block": variant("block", "standard"),
        "pe": variant("pe", "sinusoidal"),
        "norm": variant("norm", "softmax"),
        "synthesizer": variant("synthesizer", "dot"),
    }
)


def test_a_translation_batch_counts_the_sources_and_the_decoders_input_but_not_padding():
    system = Seq2SeqSystem(
        ARCHITECTURE,
        OPTIM,
        20,
        20,
        PAD_ID,
        BOS_ID,
        EOS_ID,
        0.1,
        "translation",
        None,
        DecodeConfig.from_config(decode_node()),
    )
    pairs = [([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11]), ([5, 6], [])]
    batch = collate(
        [EncodedPair(np.array(s), np.array(t), "", i) for i, (s, t) in enumerate(pairs)]
    )
    sources = sum(len(s) + 1 for s, _ in pairs)  # each source and its EOS
    # the decoder reads BOS, the target, and EOS where the row is not the longest
    longest = max(len(t) for _, t in pairs)
    decoder = sum(1 + len(t) + (len(t) < longest) for _, t in pairs)
    assert system.batch_tokens(batch) == sources + decoder == 9 + 11


def test_a_probe_batch_counts_its_tokens_and_markers_but_not_the_padding():
    system = TaggerSystem(
        ARCHITECTURE, OPTIM, ProbeDataModule.vocab_size, num_classes=8, causal=False
    )
    batch = probe_collate([probe_example(3, markers=True), probe_example(7, markers=True)])
    assert batch["tokens"].shape == (2, 9)
    assert system.batch_tokens(batch) == (3 + 2) + (7 + 2)


def test_throughput_is_the_tokens_over_the_time_of_the_steps_since_training_began(monkeypatch):
    clock = iter([0.0, 2.0, 10.0, 11.0, 20.0, 20.5])  # step starts and ends; gaps are loading
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    logged = []
    module = SimpleNamespace(
        device=torch.device("cpu"),
        batch_tokens=len,
        log=lambda name, value, **_: logged.append((name, value)),
    )
    throughput = TokenThroughput()
    throughput.on_train_start(None, module)
    for batch in ([1] * 400, [1] * 100, [1] * 250):
        throughput.on_train_batch_start(None, module, batch, 0)
        throughput.on_train_batch_end(None, module, None, batch, 0)
    assert [name for name, _ in logged] == ["train/tokens_per_s"] * 3
    assert [value for _, value in logged] == pytest.approx([400 / 2, 500 / 3, 750 / 3.5])
