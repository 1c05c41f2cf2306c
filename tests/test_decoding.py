"""Greedy and beam search: beam 1 is greedy, the cache changes nothing, lengths are capped."""

from __future__ import annotations

import pytest
import torch
from helpers import small_variant

from attnlab.decoding import (
    DecodeConfig,
    beam_search,
    greedy,
    length_penalty,
    max_target_lengths,
    translate,
)
from attnlab.model.config import AttentionConfig, ModelConfig
from attnlab.model.transformer import EncoderDecoder

VOCAB, BOS, EOS = 23, 2, 3


def model(pe: str = "rope", norm: str = "softmax", synthesizer: str = "dot") -> EncoderDecoder:
    torch.manual_seed(0)
    spec = AttentionConfig(
        *(
            small_variant(g, o)
            for g, o in (("pe", pe), ("norm", norm), ("synthesizer", synthesizer))
        )
    )
    cfg = ModelConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, init_std=0.3)
    return EncoderDecoder(cfg, spec, VOCAB, VOCAB).eval()


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (5, 9), generator=g)
    padding = torch.zeros_like(src, dtype=torch.bool)
    padding[2, 6:] = padding[4, 3:] = True
    return src.masked_fill(padding, 0), padding


@pytest.mark.parametrize(
    "pe,norm,synthesizer",
    [
        ("rope", "softmax", "dot"),
        ("t5", "l2", "dot"),
        ("shaw", "relu2", "random_vanilla"),
        ("learned", "softmax", "dense"),
    ],
)
def test_beam_of_one_is_greedy_and_the_cache_changes_nothing(pe, norm, synthesizer):
    net = model(pe, norm, synthesizer)
    src, padding = batch()
    limits = max_target_lengths(net, padding, 1.2, 10, 256)
    reference = greedy(net, src, padding, BOS, EOS, limits, cache=False)
    assert greedy(net, src, padding, BOS, EOS, limits) == reference
    assert beam_search(net, src, padding, BOS, EOS, limits, 1, 0.6) == reference
    wide = beam_search(net, src, padding, BOS, EOS, limits, 4, 0.6)
    assert wide == beam_search(net, src, padding, BOS, EOS, limits, 4, 0.6, cache=False)


def test_greedy_picks_the_most_likely_next_token_at_every_step():
    net = model()
    src, padding = batch(1)
    limits = max_target_lengths(net, padding, 1.0, 3, 256)
    hypotheses = greedy(net, src, padding, BOS, EOS, limits)
    memory = net.encode(src, padding)
    for row, hypothesis in enumerate(hypotheses):
        prefix = torch.tensor([[BOS, *hypothesis]])
        logits = net.decode(prefix, memory[row : row + 1], padding[row : row + 1])[0]
        chosen = [*hypothesis, EOS] if len(hypothesis) < limits[row] else hypothesis
        assert logits[: len(chosen)].argmax(-1).tolist() == chosen


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@torch.no_grad()
def test_a_beam_as_wide_as_every_hypothesis_is_exhaustive_search(alpha):
    """With room for all 1 + 22 + 22² hypotheses of up to 2 tokens, beam search must return
    the best of them by log p(y, EOS) / lp(y), EOS being free at the length limit."""
    net = model("t5")
    src, padding = batch(2)
    words = [t for t in range(VOCAB) if t != EOS]
    prefixes = torch.tensor([[BOS, w] for w in words for _ in words])
    seconds = torch.tensor(words).repeat(len(words))
    limits = torch.full((src.shape[0],), 2)
    found = beam_search(net, src, padding, BOS, EOS, limits, 1 + len(words) + len(prefixes), alpha)
    greedy_found = greedy(net, src, padding, BOS, EOS, limits)
    for row in range(src.shape[0]):
        memory = net.encode(src[row : row + 1], padding[row : row + 1])
        logits = net.decode(prefixes, memory.expand(len(prefixes), -1, -1), padding[row : row + 1])
        after_bos, after_word = torch.log_softmax(logits, -1).unbind(1)
        first = after_bos.gather(1, prefixes[:, 1:])[:, 0]
        score = {(): after_bos[0, EOS].item() / length_penalty(1, alpha)}
        for n, (w, u) in enumerate(zip(prefixes[:, 1].tolist(), seconds.tolist(), strict=True)):
            score[(w,)] = (first[n] + after_word[n, EOS]).item() / length_penalty(2, alpha)
            score[(w, u)] = (first[n] + after_word[n, u]).item() / length_penalty(3, alpha)
        assert tuple(found[row]) == max(score, key=score.get)
        assert score[tuple(found[row])] >= score[tuple(greedy_found[row])]


def test_hypotheses_respect_the_length_limit_and_a_length_bound_pe():
    src, padding = batch()
    config = DecodeConfig(max_len_a=3.0, max_len_b=50)
    bounded = model("learned")  # small_variant caps learned positions at 16
    for beam in (1, 3):
        for hypothesis in translate(bounded, src, padding, BOS, EOS, config, beam):
            assert len(hypothesis) <= 15  # BOS and 15 tokens fill positions 0..15
    net = model()
    limits = max_target_lengths(net, padding, 0.5, 1, 256)
    assert limits.tolist() == [5, 5, 4, 5, 2]  # ⌊0.5·|source| + 1⌋
    for row, hypothesis in enumerate(greedy(net, src, padding, BOS, EOS, limits)):
        assert len(hypothesis) <= limits[row]
