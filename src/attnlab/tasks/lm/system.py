"""Language modeling with a decoder-only stack: the system of task=lm.

Trains on windows of block_size tokens with the next-token cross-entropy (`train/loss`, in
nats per token). Validation while training scores the whole validation split in
non-overlapping windows of block_size: `val/loss`, `val/ppl` and, with the char tokenizer,
`val/bpc` (bits per character = loss / ln 2). An evaluation (the test, or eval.py) scores
its split at every evaluation length L, in non-overlapping windows (`<split>/loss@L`,
`ppl@L`, `bpc@L`) and in sliding windows (`ppl_sliding@L`, `bpc_sliding@L`), and the
loss at each position of the non-overlapping windows: the curve that shows where a
positional encoding breaks past its training length. A length beyond the model's positions
(pe=learned's max_len) is not applicable: logged as NaN, marked so in the files, never
evaluated. Files in the run directory: lengths/<split>.json (every length's numbers),
lengths/<split>_loss_by_position.csv and .png, lengths/<split>_ppl_by_length.png; and at
each validation, samples continuing `sample_prompt` (samples/step<N>.txt; a W&B text table).
Validation samples are nucleus samples with decode.top_p, decode.temperature and decode.seed.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.utils.data import DataLoader

from attnlab.config.values import require_counts
from attnlab.data.task import NON_OVERLAPPING, WINDOWS, TaskData, WindowBatch, Windows
from attnlab.data.tokenizer import SPECIAL_IDS, TOKENIZER_KEY, StreamTokenizer
from attnlab.decoding.decoder_only import continuations
from attnlab.decoding.encoder_decoder import DecodeConfig
from attnlab.errors import ConfigError
from attnlab.files import write_text
from attnlab.memory import check_forward
from attnlab.model.architecture import Architecture
from attnlab.model.maps import attention_maps
from attnlab.model.transformer import DecoderLM
from attnlab.systems.base import System, Vocabulary
from attnlab.systems.optim import Optim
from attnlab.tasks.lm.stream import restore_tokenizer

log = logging.getLogger(__name__)
LN2 = math.log(2)


class LMSystem(System):
    recorded_before = MappingProxyType({"sink_windows": 0})
    settings = MappingProxyType({**System.settings, "decode": DecodeConfig})

    def __init__(
        self,
        architecture: Architecture,
        optim: Optim,
        vocab_size: int,
        samples: int,
        sample_prompt: str,
        sample_tokens: int,
        decode: DecodeConfig,
        sink_windows: int,
        tokenizer: StreamTokenizer | None = None,
    ) -> None:
        super().__init__(architecture, optim)
        require_counts("task.system", least=0, samples=samples, sink_windows=sink_windows)
        require_counts("task.system", sample_tokens=sample_tokens)
        if samples and not (isinstance(sample_prompt, str) and sample_prompt):
            raise ConfigError(
                f"task.system.sample_prompt={sample_prompt!r} gives validation samples nothing "
                "to continue: give some text (e.g. a line break), or task.system.samples=0"
            )
        self.tokenizer = tokenizer  # from the data; from the checkpoint when loaded
        self.net = self.network(self.architecture, vocab_size=vocab_size)
        self.decode_config = decode
        self.samples, self.sample_prompt, self.sample_tokens = samples, sample_prompt, sample_tokens
        self.not_applicable: list[int] = []
        self.sums: dict[tuple[Windows, int], Tensor] = {}  # (windows, L) -> [nll, tokens], f64
        self.by_position: dict[int, Tensor] = {}  # L -> [2, L]: nll and tokens per position
        self.sink_windows = sink_windows
        self.sinks: dict[int, Tensor] = {}  # L -> [layers + 1]: shares per layer, windows

    # the contract (attnlab.systems.base)

    def attention_maps(self, batch: Tensor | WindowBatch) -> dict[str, Tensor]:
        tokens = self.inputs(batch)[:1].to(self.device)
        maps = attention_maps(self.net, lambda: self.net(tokens))
        return {name: weights[0] for name, weights in maps.items()}

    def check_lengths(self, data: TaskData) -> None:
        self.net.stack.check_length(data.max_seq_len)
        skipped = data.limit_lengths(self.net.stack.parts.max_len)  # type: ignore[attr-defined]
        self.not_applicable = skipped
        if skipped:
            log.warning(
                "evaluation lengths %s are not applicable: the model has %d positions "
                "(pe.max_len); they are reported as n/a", skipped, self.net.stack.parts.max_len,
            )  # fmt: skip

    @staticmethod
    def inputs(batch: Tensor | WindowBatch) -> Tensor:
        tokens = batch["tokens"] if isinstance(batch, dict) else batch
        return tokens[:, :-1]

    def batch_tokens(self, batch: Tensor | WindowBatch) -> int:
        return self.inputs(batch).numel()

    def batch_examples(self, batch: Tensor | WindowBatch) -> int:
        return self.inputs(batch).shape[0]

    # training and evaluation

    def token_nll(self, tokens: Tensor) -> Tensor:
        """The loss [B, T] of each next token of windows tokens [B, T + 1]."""
        logits = self.net(tokens[:, :-1])
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32
        flat = F.cross_entropy(wide.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
        return flat.view(tokens.shape[0], -1)

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        loss = self.token_nll(batch).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _accumulate(self, batch: WindowBatch) -> None:
        nll = self.token_nll(batch["tokens"]).double()
        position = torch.arange(nll.shape[1], device=nll.device)
        scored = position[None, :] >= batch["first"][:, None]
        windows, length = batch["windows"], batch["length"]
        sums = self.sums.setdefault((windows, length), nll.new_zeros(2))
        sums += torch.stack((nll[scored].sum(), scored.sum().double()))
        if windows == NON_OVERLAPPING:
            per = self.by_position.setdefault(length, nll.new_zeros(2, length))
            per[0, : nll.shape[1]] += (nll * scored).sum(0)
            per[1, : nll.shape[1]] += scored.sum(0)

    def validation_step(self, batch: WindowBatch, batch_idx: int) -> None:
        self._accumulate(batch)
        self._measure_sinks(batch)

    def test_step(self, batch: WindowBatch, batch_idx: int) -> None:
        self._accumulate(batch)
        self._measure_sinks(batch)

    def _measure_sinks(self, batch: WindowBatch) -> None:
        """The attention sink of the first `sink_windows` whole windows of each length that
        this process scores (none where the split is shorter than the length): per layer, the weight that queries
        1..L−1 give the window's first token, averaged over heads and queries (the share at
        query 0 is 1 in causal attention, and left out)."""
        fitting = self.trainer.state.fn == TrainerFn.FITTING
        if not self.sink_windows or fitting or batch["windows"] != NON_OVERLAPPING:
            return
        length = batch["length"]
        sums = self.sinks.get(length)
        done = 0 if sums is None else int(sums[-1])
        inputs = self.inputs(batch["tokens"])
        take = min(self.sink_windows - done, inputs.shape[0])
        if take <= 0 or inputs.shape[1] != length:  # a split's last window may be shorter
            return
        maps = attention_maps(self.net, lambda: self.net(inputs[:take]))
        shares = [weights[:, :, 1:, 0].double().mean((1, 2)).sum() for weights in maps.values()]
        measured = torch.stack([*shares, torch.tensor(float(take), device=shares[0].device)])
        self.sinks[length] = measured if sums is None else sums + measured

    def _reduced(
        self,
    ) -> tuple[dict[tuple[Windows, int], Tensor], dict[int, Tensor], dict[int, Tensor]]:
        """Every rank's sums, added (keys in a fixed order, so every rank reduces alike; the
        sinks of every scored length, zeros where a rank measured no whole window)."""
        reduce = self.trainer.strategy.reduce
        sums = {k: reduce(v, reduce_op="sum") for k, v in sorted(self.sums.items())}
        per = {k: reduce(v, reduce_op="sum") for k, v in sorted(self.by_position.items())}
        sinks = {}
        if self.sink_windows and self.trainer.state.fn != TrainerFn.FITTING:
            none = torch.zeros(self.net.stack.n_layers + 1, dtype=torch.float64, device=self.device)
            lengths = sorted(length for way, length in sums if way == NON_OVERLAPPING)
            sinks = {n: reduce(self.sinks.get(n, none), reduce_op="sum") for n in lengths}
        self.sums, self.by_position, self.sinks = {}, {}, {}
        return sums, per, {n: s for n, s in sinks.items() if s[-1] > 0}

    def _finish(self, stage: str) -> None:
        sums, per, sinks = self._reduced()
        char = self.tokenizer is not None and self.tokenizer.kind == "char"
        fitting = self.trainer.state.fn == TrainerFn.FITTING
        results: dict[str, dict[str, float | None]] = {}
        for (windows, length), (nll, count) in sums.items():
            loss = float(nll / count)
            suffix = "" if fitting else f"@{length}"
            entry = results.setdefault(str(length), {"tokens": float(count)})
            if windows == NON_OVERLAPPING:
                entry["loss"] = loss
                self.log(f"{stage}/loss{suffix}", loss, prog_bar=stage == "val")
            entry[windows.perplexity] = math.exp(loss)
            self.log(f"{stage}/{windows.perplexity}{suffix}", math.exp(loss))
            if char:
                entry[windows.bits] = loss / LN2
                self.log(f"{stage}/{windows.bits}{suffix}", loss / LN2)
        if fitting:
            if not (self.trainer.sanity_checking or self.trainer.fast_dev_run) and self.samples:
                self._log_samples()
            return
        for length, measured in sinks.items():
            by_layer = (measured[:-1] / measured[-1]).tolist()
            results[str(length)].update(sink=sum(by_layer) / len(by_layer), sink_by_layer=by_layer)
            self.log(f"{stage}/sink@{length}", sum(by_layer) / len(by_layer))
        names = ["loss", *(w.perplexity for w in WINDOWS), *(w.bits for w in WINDOWS if char)]
        for length in self.not_applicable:
            results[str(length)] = {"applicable": False}  # type: ignore[dict-item]
            for name in names:
                self.log(f"{stage}/{name}@{length}", float("nan"))
        if self.trainer.is_global_zero:
            self._write_lengths(stage, results, per)

    def _write_lengths(
        self, stage: str, results: dict[str, dict[str, Any]], per: dict[int, Tensor]
    ) -> None:
        directory = Path(self.trainer.default_root_dir) / "lengths"
        directory.mkdir(parents=True, exist_ok=True)
        bound = self.net.stack.parts.max_len
        record = {"max_positions": bound, "lengths": results}
        write_text(directory / f"{stage}.json", json.dumps(record, indent=2) + "\n")
        lines = ["length,position,loss,tokens"]
        curves = {}
        for length, (nll, count) in per.items():
            loss = (nll / count.clamp_min(1)).tolist()
            lines += [
                f"{length},{p},{value:.6f},{int(n)}"
                for p, (value, n) in enumerate(zip(loss, count.tolist(), strict=True), 1)
                if n
            ]
            curves[length] = [
                v if n else float("nan") for v, n in zip(loss, count.tolist(), strict=True)
            ]
        write_text(directory / f"{stage}_loss_by_position.csv", "\n".join(lines) + "\n")
        ppl = {
            w.perplexity: {int(n): r.get(w.perplexity, float("nan")) for n, r in results.items()}
            for w in WINDOWS
        }
        from attnlab.plots import save  # matplotlib and the reports: only when it draws
        from attnlab.tasks.lm.report import lm_length_figures

        by_position, by_length = lm_length_figures(curves, ppl, bound)
        save(by_position, directory / f"{stage}_loss_by_position.png")
        save(by_length, directory / f"{stage}_ppl_by_length.png")

    # memory: each pass checked before its first batch (attnlab.memory)

    def on_fit_start(self) -> None:
        data = self.trainer.datamodule
        check_forward(
            self.net, data.batch_size, data.block_size, True,
            "lower task.data.block_size or task.data.batch_size",
        )  # fmt: skip

    def on_validation_start(self) -> None:
        self._check_passes(self.trainer.val_dataloaders)

    def on_test_start(self) -> None:
        self._check_passes(self.trainer.test_dataloaders)

    def _check_passes(self, loader: DataLoader) -> None:
        """Refuse an evaluation whose largest batch of windows cannot fit in memory."""
        for batch, length in loader.dataset.shapes():
            check_forward(
                self.net, batch, length, False,
                "lower task.data.eval_lengths, or task.data.eval_batch_tokens",
            )  # fmt: skip

    def on_validation_epoch_end(self) -> None:
        self._finish("val")

    def on_test_epoch_end(self) -> None:
        self._finish("test")

    # samples

    def _log_samples(self) -> None:
        bound = self.net.stack.parts.max_len
        room = len(self.tokenizer.encode(self.sample_prompt)) if self.tokenizer else 0
        tokens = self.sample_tokens if bound is None else min(self.sample_tokens, bound + 1 - room)
        if tokens < 1 or not self.trainer.is_global_zero:
            return
        config = replace(self.decode_config, strategy="nucleus")
        was_training = self.net.training
        self.net.eval()
        try:
            texts = continuations(
                self.net, self.tokenizer, self.sample_prompt, tokens, self.samples, config
            )
        finally:
            self.net.train(was_training)
        path = Path(self.trainer.default_root_dir) / "samples" / f"step{self.global_step:06d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        rule = "\n" + "-" * 40 + "\n"
        write_text(path, rule.join(texts) + "\n")
        log.info("sample at step %d:\n%s", self.global_step, texts[0])
        for logger in self.loggers:
            if isinstance(logger, WandbLogger):
                data = [[self.global_step, self.sample_prompt, text] for text in texts]
                logger.log_text("val/samples", columns=["step", "prompt", "text"], data=data)

    # checkpoints

    @classmethod
    def network(cls, architecture: Architecture, vocab_size: int, **unused: Any) -> DecoderLM:
        return DecoderLM(architecture.model, architecture.attention, vocab_size)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.tokenizer is None:
            raise ConfigError("the language model has no tokenizer to store with its weights")
        checkpoint[TOKENIZER_KEY] = {
            "kind": self.tokenizer.kind,
            "model": self.tokenizer.serialized(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizer = restore_tokenizer(checkpoint.get(TOKENIZER_KEY))

    def vocabularies(self) -> dict[str, Vocabulary]:
        return {"tokenizer": Vocabulary(self.tokenizer, self.hparams.vocab_size, SPECIAL_IDS)}
