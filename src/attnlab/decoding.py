"""Greedy and beam search for an encoder-decoder, batched, over the key/value cache.

Hypothesis length is capped per sentence at max_len_a·|source| + max_len_b tokens (fairseq's
rule) and at max_len tokens whatever the source, after which EOS is forced. Beam search keeps `beam` live hypotheses per sentence,
finalizes those that end in EOS among the top `beam` candidates (as fairseq does), stops a
sentence once it has `beam` finished hypotheses, and ranks them by
log p(y) / lp(y), lp(y) = ((5 + |y|)/6)^α (GNMT's length penalty, α = length_penalty;
|y| counts EOS). With beam = 1 it returns exactly the greedy hypotheses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.config import ConfigError, is_number, require_counts
from attnlab.model.transformer import EncoderDecoder


@dataclass(frozen=True)
class DecodeConfig:
    """The top-level `decode` config node (conf/train.yaml)."""

    beam: int = 4  # beam size at test time; 1 = greedy
    val_beam: int = 1  # beam size for the BLEU computed at each validation
    length_penalty: float = 0.6  # GNMT α
    max_len_a: float = 1.2
    max_len_b: int = 10
    max_len: int = 256  # an absolute cap on hypotheses, in tokens, whatever the source length
    cache: bool = True  # reuse keys and values of earlier steps (False: recompute, for tests)

    def __post_init__(self) -> None:
        require_counts("decode", beam=self.beam, val_beam=self.val_beam, max_len=self.max_len)
        require_counts("decode", least=0, max_len_b=self.max_len_b)
        for name in ("length_penalty", "max_len_a"):
            value = getattr(self, name)
            if not (is_number(value) and value >= 0):
                raise ConfigError(f"decode.{name}={value!r} must be a number of at least 0")


def max_target_lengths(
    model: EncoderDecoder, src_padding: Tensor, a: float, b: int, cap: int
) -> Tensor:
    """Longest hypothesis (in tokens, EOS excluded) each sentence may get: a·|source| + b, at
    most `cap`, and no more than the decoder's positions allow (BOS and the hypothesis take
    0..limit)."""
    limits = ((~src_padding).sum(1) * a + b).floor().long().clamp(1, cap)
    bound = model.decoder.parts.max_len
    return limits if bound is None else limits.clamp_max(bound - 1)


def until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


class Decoder:
    """Step-by-step decoding state for one batch: memory, cache and the tokens so far."""

    def __init__(
        self, model: EncoderDecoder, src: Tensor, src_padding: Tensor, copies: int, cache: bool
    ) -> None:
        self.model = model
        self.memory = model.encode(src, src_padding).repeat_interleave(copies, 0)
        self.padding = src_padding.repeat_interleave(copies, 0)
        self.cache = model.new_cache() if cache else None

    def log_probs(self, tokens: Tensor) -> Tensor:
        """log p(next token | tokens) [N, V] for prefixes tokens [N, t]."""
        new = tokens[:, -1:] if self.cache is not None else tokens
        logits = self.model.decode(new, self.memory, self.padding, self.cache)[:, -1]
        return torch.log_softmax(logits.float(), -1)

    def reorder(self, rows: Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(rows)


def force_eos(log_probs: Tensor, at_limit: Tensor, eos: int) -> Tensor:
    """Rows at their length limit may only emit EOS."""
    forced = torch.full_like(log_probs, float("-inf"))
    forced[:, eos] = 0.0
    return torch.where(at_limit[:, None], forced, log_probs)


@torch.no_grad()
def greedy(
    model: EncoderDecoder,
    src: Tensor,
    src_padding: Tensor,
    bos: int,
    eos: int,
    limits: Tensor,
    cache: bool = True,
) -> list[list[int]]:
    decoder = Decoder(model, src, src_padding, 1, cache)
    tokens = src.new_full((src.shape[0], 1), bos)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for step in range(int(limits.max()) + 1):
        log_probs = force_eos(decoder.log_probs(tokens), (step >= limits) | finished, eos)
        next_tokens = log_probs.argmax(-1)
        tokens = torch.cat((tokens, next_tokens[:, None]), 1)
        finished |= next_tokens == eos
        if finished.all():
            break
    return [until_eos(row, eos) for row in tokens[:, 1:].tolist()]


def length_penalty(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: Tensor,
    src_padding: Tensor,
    bos: int,
    eos: int,
    limits: Tensor,
    beam: int,
    alpha: float,
    cache: bool = True,
) -> list[list[int]]:
    batch, k = src.shape[0], beam
    decoder = Decoder(model, src, src_padding, k, cache)
    tokens = src.new_full((batch * k, 1), bos)
    scores = torch.zeros(batch, k, device=src.device)
    scores[:, 1:] = float("-inf")  # the k copies start identical: expand only the first
    row_limits = limits.repeat_interleave(k)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    base = torch.arange(batch, device=src.device)[:, None] * k
    for step in range(int(limits.max()) + 1):
        log_probs = force_eos(decoder.log_probs(tokens), step >= row_limits, eos)
        vocab = log_probs.shape[-1]
        candidates = (scores.reshape(-1, 1) + log_probs).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(2 * k, dim=1)
        origin, token = top_index // vocab, top_index % vocab
        is_eos = token == eos
        for b, j in (is_eos[:, :k] & torch.isfinite(top_scores[:, :k])).nonzero().tolist():
            if len(finished[b]) < k:
                prefix = tokens[base[b, 0] + origin[b, j], 1:].tolist()
                score = top_scores[b, j].item() / length_penalty(len(prefix) + 1, alpha)
                finished[b].append((score, prefix))
        if all(len(f) >= k for f in finished):
            break
        # the k best candidates that do not end in EOS carry on (at most k of the 2k do)
        order = torch.argsort(is_eos.int() * 2 * k + torch.arange(2 * k, device=src.device), 1)[
            :, :k
        ]
        rows = (base + origin.gather(1, order)).view(-1)
        tokens = torch.cat((tokens[rows], token.gather(1, order).view(-1, 1)), 1)
        scores = top_scores.gather(1, order)
        decoder.reorder(rows)
    return [max(f)[1] for f in finished]


def translate(
    model: EncoderDecoder,
    src: Tensor,
    src_padding: Tensor,
    bos: int,
    eos: int,
    config: DecodeConfig,
    beam: int,
) -> list[list[int]]:
    """Hypotheses (token ids without BOS/EOS) for a batch of sources."""
    limits = max_target_lengths(
        model, src_padding, config.max_len_a, config.max_len_b, config.max_len
    )
    if beam == 1:
        return greedy(model, src, src_padding, bos, eos, limits, config.cache)
    return beam_search(
        model, src, src_padding, bos, eos, limits, beam, config.length_penalty, config.cache
    )
