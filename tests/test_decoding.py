"""Greedy and beam search: beam 1 is greedy, the cache changes nothing, lengths are capped."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import decode_node, small_variant
from torch.overrides import TorchFunctionMode

from attnlab.decoding.encoder_decoder import (
    CHECK_EVERY,
    DecodeConfig,
    Sampler,
    beam_search,
    block_repeats,
    generate,
    greedy,
    length_penalty,
    max_target_lengths,
    sampling_filter,
)
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
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
    cfg = ModelConfig(
        Standard(), d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, init_std=0.3
    )
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
    config = DecodeConfig(**decode_node(max_len_a=3.0, max_len_b=50))
    bounded = model("learned")  # small_variant caps learned positions at 16
    runs = [
        ("greedy", 1, None),
        ("beam", 3, None),
        ("nucleus", 1, torch.Generator().manual_seed(0)),
    ]
    for strategy, beam, generator in runs:
        hypotheses = generate(bounded, src, padding, BOS, EOS, config, strategy, beam, generator)
        assert all(len(h) <= 15 for h in hypotheses)  # BOS and 15 tokens fill positions 0..15
    net = model()
    limits = max_target_lengths(net, padding, 0.5, 1, 256)
    assert limits.tolist() == [5, 5, 4, 5, 2]  # ⌊0.5·|source| + 1⌋
    for row, hypothesis in enumerate(greedy(net, src, padding, BOS, EOS, limits)):
        assert len(hypothesis) <= limits[row]


def test_no_repeat_ngram_bans_exactly_the_tokens_that_would_repeat_an_ngram():
    tokens = torch.tensor([[BOS, 5, 6, 7, 5, 6], [BOS, 5, 6, 7, 8, 9]])
    blocked = block_repeats(torch.zeros(2, 12), tokens, 3)
    assert blocked[0].isinf().nonzero().flatten().tolist() == [7], "5 6 7 would come again"
    assert not blocked[1].isinf().any()
    assert block_repeats(torch.zeros(2, 12), tokens, 0).eq(0).all()


@pytest.mark.parametrize("strategy", ["greedy", "beam", "top_k", "nucleus"])
def test_no_strategy_repeats_an_ngram_when_told_not_to(strategy):
    net, (src, padding) = model(), batch()
    config = DecodeConfig(**decode_node(max_len_a=0.0, max_len_b=40, no_repeat_ngram=2, top_k=3))
    generator = torch.Generator().manual_seed(0)
    for hypothesis in generate(net, src, padding, BOS, EOS, config, strategy, 2, generator):
        pairs = list(itertools.pairwise(hypothesis))
        assert len(pairs) == len(set(pairs))


def test_top_k_keeps_the_k_likeliest_and_top_p_the_fewest_holding_p():
    log_probs = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]).log()
    kept = sampling_filter(log_probs, 2, None).isfinite()[0].tolist()
    assert kept == [True, True, False, False, False]
    # 0.5 < 0.8; 0.5 + 0.2 = 0.7 < 0.8; + 0.15 = 0.85 >= 0.8: three tokens hold p = 0.8
    kept = sampling_filter(log_probs, None, 0.8).isfinite()[0].tolist()
    assert kept == [True, True, True, False, False]
    assert sampling_filter(log_probs, None, 0.3).isfinite()[0].tolist() == [True] + [False] * 4


def test_top_k_never_samples_outside_the_k_likeliest():
    log_probs = torch.randn(200, 30).log_softmax(-1)
    sampler = Sampler(torch.Generator().manual_seed(1), temperature=1.5, top_k=4)
    drawn = sampler(log_probs)
    allowed = log_probs.topk(4, -1).indices
    assert (allowed == drawn[:, None]).any(-1).all()


@pytest.mark.parametrize("temperature", [1e-30, 2e-38])
@pytest.mark.parametrize("top_k,top_p", [(5, None), (None, 0.9)])
def test_a_temperature_near_zero_draws_the_likeliest_token(temperature, top_k, top_p):
    # log p / T overflows float32 to -inf for every token once T < |log p_max| / 3.4e38,
    # here |log p_max| ≈ log 100,000
    noise = torch.randn(16, 100_000, generator=torch.Generator().manual_seed(2))
    log_probs = (noise / 10).log_softmax(-1)
    sampler = Sampler(torch.Generator().manual_seed(1), temperature, top_k, top_p)
    assert torch.equal(sampler(log_probs), log_probs.argmax(-1))


@pytest.mark.parametrize("temperature", [1e-39, 1e-300])
def test_a_temperature_below_float32s_range_is_refused_in_one_sentence(temperature):
    with pytest.raises(ConfigError, match=r"decode.temperature=.*decode.strategy=greedy"):
        DecodeConfig(**decode_node(temperature=temperature))


def test_sampling_is_reproducible_with_its_seed():
    net, (src, padding) = model(), batch()
    config = DecodeConfig(**decode_node(max_len_a=0.0, max_len_b=12, top_p=0.95, temperature=2.0))

    def sample(seed: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(seed)
        return generate(net, src, padding, BOS, EOS, config, "nucleus", 1, generator)

    assert sample(3) == sample(3)
    assert sample(3) != sample(4), "another seed draws other tokens"


HOST_SYNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "cpu", "numpy"}


class CountHostSyncs(TorchFunctionMode):
    """Counts the calls that copy a result to the host (and on a GPU wait for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in HOST_SYNCS
        return func(*args, **(kwargs or {}))


def host_syncs(search: str, steps: int) -> int:
    net = model("none")
    src, padding = batch()
    limits = torch.full((src.shape[0],), steps)
    with CountHostSyncs() as syncs:
        if search == "greedy":
            hypotheses = greedy(net, src, padding, BOS, EOS, limits, no_repeat_ngram=2)
        else:
            hypotheses = beam_search(net, src, padding, BOS, EOS, limits, 4, 0.6, True, 2)
    assert max(map(len, hypotheses)) > steps * 3 // 4  # the untrained model rarely ends
    return syncs.count


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_decoding_syncs_with_the_host_every_few_steps_not_at_every_step(search):
    extra_steps = 40
    extra_syncs = host_syncs(search, 40 + extra_steps) - host_syncs(search, 40)
    assert extra_syncs <= extra_steps // CHECK_EVERY <= extra_steps // 4
