"""The system of the synthetic length-generalization tasks (attnlab.tasks.synthetic.data): train on
short inputs, score greedy answers on longer ones.

`arch=decoder`: one causal stack reads `input SEP output EOS`, with the next-token loss on
`output EOS` only. `arch=encoder_decoder`: the encoder reads the input, the decoder `SEP
output` and predicts `output EOS`. Evaluation decodes greedily over the key/value cache, as
many steps as the answer has tokens (an answer that has not ended by then is wrong anyway),
feeding an output's given tokens as they are (attnlab.tasks.synthetic.data), and scores each
example's `output EOS` position by position against the decoded tokens, given ones excluded:
`acc` is exact match (every position right: the output, then the end exactly there),
`token_acc` the share of right positions; `loss` is the teacher-forced loss per answer token.
Validation scores the training lengths (`val/acc`, what checkpoints are chosen by); the test
scores each bucket of lengths, named by its longest (`test/acc@<len>`, `test/token_acc@<len>`),
and all of them together (`test/acc`, `test/token_acc`, `test/loss`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data.task import IGNORE, SyntheticBatch, TaskData
from attnlab.decoding.decoder_only import Pick, continue_text
from attnlab.decoding.encoder_decoder import Decoder
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture
from attnlab.model.maps import attention_maps
from attnlab.model.transformer import DecoderLM, EncoderDecoder
from attnlab.systems.base import System
from attnlab.systems.optim import Optim
from attnlab.tasks.synthetic.data import ARCHS, Specials

SPLITS = {"val": "valid", "test": "test"}
TALLIES = ("examples", "exact", "right_tokens", "tokens", "nll")  # a row per bucket


def greedy_but_given(forced: Tensor) -> Pick:
    """Greedy picks, one step after another, except where forced [B, A] holds a given token
    (IGNORE elsewhere): that token is taken as it is."""
    steps = iter(forced.unbind(1))

    def pick(log_probs: Tensor) -> Tensor:
        given = next(steps)
        return torch.where(given == IGNORE, log_probs.argmax(-1), given)

    return pick


@torch.no_grad()
def decoded_answers(
    net: DecoderLM | EncoderDecoder, batch: SyntheticBatch, specials: Specials
) -> Tensor:
    """Greedy tokens [B, A] after each example's input, A the batch's longest answer, with
    the given tokens fed as they are."""
    forced = batch["forced"]
    steps, pick = forced.shape[1], greedy_but_given(forced)
    if isinstance(net, DecoderLM):
        prompt = batch["prompt"]
        if not bool((prompt == prompt[0]).all()):
            raise ValueError("a decoder's evaluation batch needs inputs of one length")
        return continue_text(net, batch["tokens"][:, : int(prompt[0])], steps, pick)
    src = batch["src"]
    decoder = Decoder(net, src, src == specials.pad, 1, True, steps)
    tokens = src.new_full((src.shape[0], 1), specials.sep)
    for _ in range(steps):
        tokens = torch.cat((tokens, pick(decoder.log_probs(tokens))[:, None]), 1)
    return tokens[:, 1:]


def answer_scores(decoded: Tensor, answers: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per example: exact match, right positions and scored positions of answers [B, A]
    (IGNORE-padded) against decoded tokens [B, A]."""
    scored = answers != IGNORE
    right = (decoded == answers) & scored
    return (right == scored).all(-1), right.sum(-1), scored.sum(-1)


def bucket_metrics(tallies: Tensor, ends: list[int] | None) -> dict[str, float]:
    """loss, acc and token_acc over every bucket of tallies [buckets, TALLIES]; with `ends`
    (each bucket's longest length), acc@<end> and token_acc@<end> for each bucket that holds
    an example (one a limited test never reached is not scored, not zero)."""
    examples, exact, right, tokens, nll = tallies.sum(0).tolist()
    if not examples:
        return {}
    metrics = {"loss": nll / tokens, "acc": exact / examples, "token_acc": right / tokens}
    for end, (examples, exact, right, tokens, _) in zip(
        ends or [], tallies.tolist(), strict=ends is not None
    ):
        if examples:
            metrics |= {f"acc@{end}": exact / examples, f"token_acc@{end}": right / tokens}
    return metrics


class SyntheticSystem(System):
    def __init__(
        self,
        architecture: Architecture,
        optim: Optim,
        vocab_size: int,
        specials: dict[str, int],
        arch: str = "decoder",
    ) -> None:
        super().__init__(architecture, optim)
        self.specials = Specials(**specials)
        self.net = self.network(self.architecture, vocab_size=vocab_size, arch=arch)

        self.bucket_ends: dict[str, list[int]] = {}
        self.tallies: Tensor | None = None  # [buckets, TALLIES], float64

    @classmethod
    def network(
        cls, architecture: Architecture, vocab_size: int, arch: str, **unused: Any
    ) -> DecoderLM | EncoderDecoder:
        if arch not in ARCHS:
            raise ConfigError(f"task.arch={arch!r} is not one of: {', '.join(ARCHS)}")
        model, attention = architecture.model, architecture.attention
        if arch == "decoder":
            return DecoderLM(model, attention, vocab_size)
        return EncoderDecoder(model, attention, vocab_size, vocab_size)

    # the contract (attnlab.systems.base)

    def attention_maps(self, batch: SyntheticBatch) -> dict[str, Tensor]:
        row = int(batch["lengths"].argmax())
        one = {key: value[row : row + 1].to(self.device) for key, value in batch.items()}
        maps = attention_maps(self.net, lambda: self.logits(self.trimmed(one)))
        return {name: weights[0] for name, weights in maps.items()}

    def check_lengths(self, data: TaskData) -> None:
        if isinstance(self.net, DecoderLM):
            self.net.stack.check_length(data.max_seq_len)
        else:
            self.net.encoder.check_length(data.max_seq_len)
            self.net.decoder.check_length(data.max_seq_len, data.max_seq_len)
        ends = data.bucket_ends  # type: ignore[attr-defined]
        self.bucket_ends = {stage: ends(split) for stage, split in SPLITS.items()}

    def batch_tokens(self, batch: SyntheticBatch) -> int:
        if "tokens" in batch:
            return int((batch["tokens"][:, :-1] != self.specials.pad).sum())
        pad = self.specials.pad
        return int((batch["src"] != pad).sum() + (batch["tgt"] != pad).sum())

    def batch_examples(self, batch: SyntheticBatch) -> int:
        return batch["answers"].shape[0]

    # training and evaluation

    def trimmed(self, batch: SyntheticBatch) -> dict[str, Tensor]:
        """One example's batch without its padding."""
        pad = self.specials.pad
        if "tokens" in batch:
            keep = int((batch["tokens"] != pad).sum())
            return {"tokens": batch["tokens"][:, :keep]}
        keep = int((batch["src"] != pad).sum())
        answer = int((batch["tgt"] != pad).sum())
        return {"src": batch["src"][:, :keep], "tgt": batch["tgt"][:, :answer]}

    def logits(self, batch: SyntheticBatch) -> Tensor:
        """Next-token logits: at each position of `input SEP output` (decoder), or of `SEP
        output` (encoder_decoder)."""
        if "tokens" in batch:
            return self.net(batch["tokens"][:, :-1])
        src = batch["src"]
        return self.net(src, src == self.specials.pad, batch["tgt"])

    def token_nll(self, batch: SyntheticBatch) -> Tensor:
        """The loss [B, T] of each answer token (0 elsewhere)."""
        targets = batch["targets"] if "tokens" in batch else batch["answers"]
        logits = self.logits(batch)
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
        flat = F.cross_entropy(
            wide.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none"
        )
        return flat.view(targets.shape)

    def training_step(self, batch: SyntheticBatch, batch_idx: int) -> Tensor:
        nll = self.token_nll(batch)
        answer_tokens = (batch["answers"] != IGNORE).sum()
        loss = nll.sum() / answer_tokens
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["answers"].shape[0])
        return loss

    def _evaluate(self, batch: SyntheticBatch, stage: str) -> None:
        nll = self.token_nll(batch).double().sum(-1)
        decoded = decoded_answers(self.net, batch, self.specials)
        exact, right, scored = answer_scores(decoded, batch["answers"])
        counts = (torch.ones_like(nll), exact.double(), right.double(), scored.double(), nll)
        rows = torch.stack(counts, -1)
        if self.tallies is None:
            self.tallies = nll.new_zeros(len(self.bucket_ends[stage]), len(TALLIES))
        self.tallies.index_add_(0, batch["buckets"], rows)

    def validation_step(self, batch: SyntheticBatch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: SyntheticBatch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _finish(self, stage: str) -> None:
        ends = self.bucket_ends[stage]
        tallies = self.tallies
        if tallies is None:  # this rank scored nothing: it still takes part in the reduction
            tallies = torch.zeros(len(ends), len(TALLIES), dtype=torch.float64, device=self.device)
        self.tallies = None
        tallies = self.trainer.strategy.reduce(tallies, reduce_op="sum")
        for name, value in bucket_metrics(tallies, ends if stage == "test" else None).items():
            self.log(f"{stage}/{name}", value, prog_bar=stage == "val" and name != "token_acc")

    def on_validation_epoch_end(self) -> None:
        self._finish("val")

    def on_test_epoch_end(self) -> None:
        self._finish("test")
