"""Greedy and beam search for an encoder-decoder, batched, over the key/value cache.

Strategies (`decode.strategy`): greedy, beam, top_k and nucleus sampling (with
`temperature`; seeded by `decode.seed`, so a run samples the same responses again). With
`no_repeat_ngram` = n > 0, no strategy may produce an n-gram a hypothesis already holds.

Hypothesis length is capped per sentence at max_len_a·|source| + max_len_b tokens (fairseq's
rule) and at max_len tokens whatever the source, after which EOS is forced. Beam search keeps `beam` live hypotheses per sentence,
finalizes those that end in EOS among the top `beam` candidates (as fairseq does), stops a
sentence once it has `beam` finished hypotheses, and ranks them by
log p(y) / lp(y), lp(y) = ((5 + |y|)/6)^α (GNMT's length penalty, α = length_penalty;
|y| counts EOS). With beam = 1 it returns exactly the greedy hypotheses.

The loops stay on the device: finished hypotheses are kept in tensors, n-gram bans are a
scatter, and whether every sentence is done is asked of the device only every `CHECK_EVERY`
steps (a sentence that is done keeps being extended with forced EOS, which changes
nothing). A batch syncs with the host about every CHECK_EVERY steps and once at its end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from attnlab.config.build import settings_node
from attnlab.config.values import is_number, require_counts
from attnlab.errors import ConfigError
from attnlab.model.transformer import EncoderDecoder

STRATEGIES = ("greedy", "beam", "top_k", "nucleus")
CHECK_EVERY = 8  # steps between asking the device whether every sentence is done
LEAST_TEMPERATURE = torch.finfo(torch.float32).tiny  # 0/T is still 0 in float32 above it


@dataclass(frozen=True)
class DecodeConfig:
    """The top-level `decode` config node (conf/train.yaml)."""

    strategy: str  # at test time: greedy | beam | top_k | nucleus
    beam: int  # beam size of strategy=beam; 1 = greedy
    val_beam: int  # beam size for the scores computed at each validation
    top_k: int  # strategy=top_k samples among the k likeliest tokens
    top_p: float  # strategy=nucleus samples among the likeliest tokens holding p
    temperature: float  # sampling: divides the logits
    no_repeat_ngram: int  # n > 0: never repeat an n-gram within a hypothesis
    seed: int  # sampling
    length_penalty: float  # GNMT α
    max_len_a: float
    max_len_b: int
    max_len: int  # an absolute cap on hypotheses, in tokens, whatever the source length
    cache: bool = True  # reuse keys and values of earlier steps (False: recompute, for tests)

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> DecodeConfig:
        return settings_node(cls, "decode", node)

    def as_data(self) -> dict[str, Any]:
        return asdict(self)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"decode.strategy={self.strategy!r} is not one of: {', '.join(STRATEGIES)}"
            )
        require_counts("decode", beam=self.beam, val_beam=self.val_beam, max_len=self.max_len)
        require_counts("decode", top_k=self.top_k)
        require_counts("decode", least=0, max_len_b=self.max_len_b)
        require_counts("decode", least=0, no_repeat_ngram=self.no_repeat_ngram, seed=self.seed)
        if not (is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"decode.top_p={self.top_p!r} must be a probability in (0, 1]")
        if not (is_number(self.temperature) and self.temperature > 0):
            raise ConfigError(f"decode.temperature={self.temperature!r} must be a positive number")
        if self.temperature < LEAST_TEMPERATURE:
            raise ConfigError(
                f"decode.temperature={self.temperature!r} is below float32's smallest normal "
                f"number ({LEAST_TEMPERATURE:.3g}), where the scaled logits are undefined; "
                "for the limit of a temperature near 0 use decode.strategy=greedy"
            )
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
    """Step-by-step decoding state for one batch of at most `steps` steps: memory, cache and
    the tokens so far."""

    def __init__(
        self,
        model: EncoderDecoder,
        src: Tensor,
        src_padding: Tensor,
        copies: int,
        cache: bool,
        steps: int,
    ) -> None:
        self.model = model
        self.memory = model.encode(src, src_padding).repeat_interleave(copies, 0)
        self.padding = src_padding.repeat_interleave(copies, 0)
        self.cache = model.new_cache(steps) if cache else None

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
    only_eos = torch.full_like(log_probs[0], float("-inf"))
    only_eos[eos] = 0.0
    return torch.where(at_limit[:, None], only_eos, log_probs)


def block_repeats(log_probs: Tensor, tokens: Tensor, n: int) -> Tensor:
    """-inf for every token that would end an n-gram its row already holds (n = 0: none)."""
    if n == 0 or tokens.shape[1] < n:
        return log_probs
    grams = tokens.unfold(1, n, 1)  # [N, t - n + 1, n]
    seen = (grams[..., :-1] == tokens[:, None, tokens.shape[1] - n + 1 :]).all(-1)
    banned = torch.zeros_like(log_probs).scatter_add_(1, grams[..., -1], seen.to(log_probs.dtype))
    return log_probs.masked_fill(banned > 0, float("-inf"))


def sampling_filter(log_probs: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """log_probs with -inf outside the k likeliest tokens, or outside the fewest likeliest
    whose probabilities add up to p (the likeliest always stays)."""
    if top_k is not None:
        kth = log_probs.topk(min(top_k, log_probs.shape[-1]), -1).values[:, -1:]
        return log_probs.masked_fill(log_probs < kth, float("-inf"))
    assert top_p is not None
    ordered, order = log_probs.sort(-1, descending=True)
    before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # mass of the likelier ones
    drop = (before >= top_p).scatter(-1, order, before >= top_p)
    return log_probs.masked_fill(drop, float("-inf"))


@torch.no_grad()
def greedy(
    model: EncoderDecoder,
    src: Tensor,
    src_padding: Tensor,
    bos: int,
    eos: int,
    limits: Tensor,
    cache: bool = True,
    no_repeat_ngram: int = 0,
    sampler: Sampler | None = None,
) -> list[list[int]]:
    """The likeliest token at each step, or with `sampler` a token drawn by it."""
    first, steps = int(limits.min()), int(limits.max()) + 1
    decoder = Decoder(model, src, src_padding, 1, cache, steps)
    tokens = src.new_full((src.shape[0], 1), bos)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for step in range(steps):
        log_probs = block_repeats(decoder.log_probs(tokens), tokens, no_repeat_ngram)
        if step >= first:  # no row is at its limit before (what follows an EOS is dropped)
            log_probs = force_eos(log_probs, step >= limits, eos)
        next_tokens = log_probs.argmax(-1) if sampler is None else sampler(log_probs)
        tokens = torch.cat((tokens, next_tokens[:, None]), 1)
        finished |= next_tokens == eos
        if step % CHECK_EVERY == CHECK_EVERY - 1 and finished.all():
            break
    return [until_eos(row, eos) for row in tokens[:, 1:].tolist()]


@dataclass
class Sampler:
    """Draws the next tokens from filtered, tempered distributions, with its own generator."""

    generator: torch.Generator
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __call__(self, log_probs: Tensor) -> Tensor:
        # the likeliest token at 0 before dividing: the others may reach -inf at a small
        # temperature, but never all of them (softmax is unchanged by the shift)
        shifted = log_probs - log_probs.amax(-1, keepdim=True)
        logits = sampling_filter(shifted / self.temperature, self.top_k, self.top_p)
        return torch.multinomial(logits.softmax(-1), 1, generator=self.generator)[:, 0]


def length_penalty(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


@dataclass
class Finished:
    """Each sentence's finished hypotheses, on the device: at most k per sentence, in the
    order found, with log p(y); slot k receives the candidates that are not kept."""

    log_probs: Tensor  # [batch, k + 1]
    tokens: Tensor  # [batch, k + 1, longest], EOS excluded
    lengths: Tensor  # [batch, k + 1]
    count: Tensor  # [batch]

    @classmethod
    def empty(cls, batch: int, k: int, longest: int, like: Tensor) -> Finished:
        return cls(
            torch.full((batch, k + 1), float("-inf"), device=like.device),
            like.new_zeros(batch, k + 1, longest),
            like.new_zeros(batch, k + 1),
            like.new_zeros(batch),
        )

    def add(self, ends: Tensor, log_probs: Tensor, prefixes: Tensor) -> None:
        """Keep the candidates where `ends` [batch, k], in order while a sentence has room,
        with their `log_probs` [batch, k] and tokens before EOS `prefixes` [batch, k, t]."""
        k, t = ends.shape[1], prefixes.shape[2]
        slot = self.count[:, None] + ends.cumsum(1) - 1
        slot = torch.where(ends & (slot < k), slot, k)
        self.log_probs.scatter_(1, slot, log_probs)
        self.tokens[:, :, :t].scatter_(1, slot[..., None].expand(-1, -1, t), prefixes)
        self.lengths.scatter_(1, slot, torch.full_like(slot, t))
        self.count = (self.count + ends.sum(1)).clamp_max(k)

    def best(self, alpha: float) -> list[list[int]]:
        """Each sentence's hypothesis of the highest log p(y) / lp(y), read once at the end."""
        rows = zip(
            self.count.tolist(), self.log_probs.tolist(), self.tokens.tolist(),
            self.lengths.tolist(), strict=True,
        )  # fmt: skip
        return [
            max(
                (log_p / length_penalty(n + 1, alpha), hypothesis[:n])
                for log_p, hypothesis, n in zip(
                    log_ps[:count], tokens[:count], lengths[:count], strict=True
                )
            )[1]
            for count, log_ps, tokens, lengths in rows
        ]


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
    no_repeat_ngram: int = 0,
) -> list[list[int]]:
    batch, k = src.shape[0], beam
    first, steps = int(limits.min()), int(limits.max()) + 1
    decoder = Decoder(model, src, src_padding, k, cache, steps)
    tokens = src.new_full((batch * k, 1), bos)
    scores = torch.zeros(batch, k, device=src.device)
    scores[:, 1:] = float("-inf")  # the k copies start identical: expand only the first
    row_limits = limits.repeat_interleave(k)
    finished = Finished.empty(batch, k, steps, tokens)
    base = torch.arange(batch, device=src.device)[:, None] * k
    for step in range(steps):
        log_probs = block_repeats(decoder.log_probs(tokens), tokens, no_repeat_ngram)
        if step >= first:  # no row is at its limit before
            log_probs = force_eos(log_probs, step >= row_limits, eos)
        vocab = log_probs.shape[-1]
        candidates = (scores.reshape(-1, 1) + log_probs).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(2 * k, dim=1)
        origin, token = top_index // vocab, top_index % vocab
        is_eos = token == eos
        # EOS among the k best finishes a hypothesis (as in fairseq); |y| counts the EOS
        ends = is_eos[:, :k] & torch.isfinite(top_scores[:, :k])
        prefixes = tokens[(base + origin[:, :k]).view(-1), 1:].view(batch, k, step)
        finished.add(ends, top_scores[:, :k], prefixes)
        if step % CHECK_EVERY == CHECK_EVERY - 1 and bool((finished.count >= k).all()):
            break
        # the k best candidates that do not end in EOS carry on (at most k of the 2k do)
        order = torch.argsort(is_eos.int() * 2 * k + torch.arange(2 * k, device=src.device), 1)[
            :, :k
        ]
        rows = (base + origin.gather(1, order)).view(-1)
        tokens = torch.cat((tokens[rows], token.gather(1, order).view(-1, 1)), 1)
        scores = top_scores.gather(1, order)
        decoder.reorder(rows)
    return finished.best(alpha)


def generate(
    model: EncoderDecoder,
    src: Tensor,
    src_padding: Tensor,
    bos: int,
    eos: int,
    config: DecodeConfig,
    strategy: str,
    beam: int,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Hypotheses (token ids without BOS/EOS) for a batch of sources, by `strategy` (with
    `beam` for beam search; `generator` for sampling)."""
    limits = max_target_lengths(
        model, src_padding, config.max_len_a, config.max_len_b, config.max_len
    )
    n, cache = config.no_repeat_ngram, config.cache
    if strategy in ("top_k", "nucleus"):
        assert generator is not None, "sampling needs a generator"
        top_k, top_p = (config.top_k, None) if strategy == "top_k" else (None, config.top_p)
        sampler = Sampler(generator, config.temperature, top_k, top_p)
        return greedy(model, src, src_padding, bos, eos, limits, cache, n, sampler)
    if strategy == "greedy" or beam == 1:
        return greedy(model, src, src_padding, bos, eos, limits, cache, n)
    return beam_search(
        model, src, src_padding, bos, eos, limits, beam, config.length_penalty, cache, n
    )
