"""Randomized PE against its definition: n distinct positions drawn uniformly from 0..L−1 and
sorted; the base evaluated at them, the same draw in every hook and layer of a pass and
through a cached decoding session; evaluation randomizes unless told otherwise."""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter

import pytest
import torch
from helpers import SHAPE, compose_config

from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.decoding.decoder_only import continue_text
from attnlab.decoding.encoder_decoder import beam_search, greedy, max_target_lengths
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.standard import Standard
from attnlab.model.transformer import DecoderLM, EncoderDecoder, Tagger
from attnlab.pe.alibi import alibi_slopes
from attnlab.pe.randomized import RandomizedPE, sorted_positions

VOCAB, L = 11, 64


@functools.cache
def node(group: str, option: str, *overrides: str) -> dict:
    return variant(group, option, *overrides)


def randomized(base: str, *base_overrides: str, **options) -> dict:
    """The randomized YAML around another PE option, as `pe@pe.base=<base>` composes it."""
    return {
        **node("pe", "randomized"),
        "base": node("pe", base, *base_overrides),
        "max_position": L,
        **options,
    }


def build_pe(base: str, *base_overrides: str, **options) -> RandomizedPE:
    torch.manual_seed(0)
    return build(randomized(base, *base_overrides, **options), shape=SHAPE).double()


def attention(pe: dict) -> AttentionConfig:
    return AttentionConfig(pe, node("norm", "softmax"), node("synthesizer", "dot"))


def tiny(n_layers: int = 2) -> ModelConfig:
    return ModelConfig(
        block=Standard(), d_model=16, n_heads=2, n_layers=n_layers, d_ff=32, dropout=0.0,
        init_std=0.2,
    )  # fmt: skip


def tokens(batch: int = 2, length: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# the sampler


@pytest.mark.parametrize(("n", "max_position"), [(1, 1), (1, 50), (7, 50), (50, 50), (300, 2048)])
def test_a_draw_is_strictly_increasing_within_the_range(n, max_position):
    for _ in range(20):
        p = sorted_positions(n, max_position)
        assert p.shape == (n,) and p.dtype == torch.long
        assert (p.diff() > 0).all() and p.min() >= 0 and p.max() < max_position
    assert torch.equal(sorted_positions(max_position, max_position), torch.arange(max_position))


def test_more_positions_than_max_position_is_one_sentence_naming_it():
    with pytest.raises(ConfigError, match=r"^9 positions .* the 8 of pe.max_position: raise"):
        sorted_positions(9, 8)


def test_a_seed_repeats_a_draw_and_draws_differ():
    torch.manual_seed(5)
    first, second = sorted_positions(6, 2048), sorted_positions(6, 2048)
    torch.manual_seed(5)
    assert torch.equal(sorted_positions(6, 2048), first)
    assert not torch.equal(first, second)


def test_every_subset_is_equally_likely():
    """n = 2 of L = 5: ten subsets, each with probability 1/10 (uniform without repeats)."""
    torch.manual_seed(0)
    draws = 5000
    counts = Counter(tuple(sorted_positions(2, 5).tolist()) for _ in range(draws))
    assert set(counts) == set(itertools.combinations(range(5), 2))
    sd = math.sqrt(draws * 0.1 * 0.9)
    assert all(abs(count - draws / 10) < 5 * sd for count in counts.values()), counts


def test_every_position_is_drawn_equally_often():
    """Each of L positions is among the n drawn with probability n/L."""
    torch.manual_seed(0)
    draws, n, max_position = 3000, 8, 32
    hits = torch.zeros(max_position)
    for _ in range(draws):
        hits[sorted_positions(n, max_position)] += 1
    p = n / max_position
    sd = math.sqrt(draws * p * (1 - p))
    assert (hits - draws * p).abs().max() < 5 * sd, hits


# the base at the drawn positions, entry by entry in float64


def begun(pe: RandomizedPE, n: int) -> torch.Tensor:
    """Start a pass of n positions as a stack would; the drawn positions."""
    drawn = pe.begin(n, torch.device("cpu"), None)
    assert torch.equal(drawn, pe.drawn) and not torch.equal(drawn, torch.arange(n))
    return drawn


def test_rope_rotates_each_row_to_its_drawn_position_and_scores_depend_on_p_j_minus_p_i():
    pe = build_pe("rope")
    n = 6
    p = begun(pe, n).tolist()
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for _ in range(2))
    pos = torch.arange(n)
    q_rot, k_rot = pe.rotate(q, pos), pe.rotate_key(k, pos)
    for i in range(n):
        torch.testing.assert_close(
            q_rot[..., i, :], pe.base.rotate(q[..., i : i + 1, :], torch.tensor([p[i]]))[..., 0, :]
        )
    for i, j in itertools.product(range(n), range(n)):
        relative = pe.base.rotate(k[..., j : j + 1, :], torch.tensor([p[j] - p[i]]))[..., 0, :]
        expected = (q[..., i, :] * relative).sum(-1)
        torch.testing.assert_close((q_rot[..., i, :] * k_rot[..., j, :]).sum(-1), expected)


def test_alibi_penalizes_the_drawn_distance():
    pe = build_pe("alibi")
    n = 7
    p = begun(pe, n).tolist()
    pos = torch.arange(n)
    bias = pe.score_bias(None, None, pos, pos, 0)
    slopes = alibi_slopes(SHAPE.n_heads)
    for h, i, j in itertools.product(range(SHAPE.n_heads), range(n), range(n)):
        assert bias[0, h, i, j].item() == pytest.approx(-slopes[h] * abs(p[i] - p[j]))
    # cached decoding: queries at the last positions see the rows of the whole pass
    torch.testing.assert_close(pe.score_bias(None, None, pos[4:], pos, 0), bias[..., 4:, :])


def test_t5_reads_the_bucket_of_the_drawn_offset():
    pe = build_pe("t5")
    with torch.no_grad():
        pe.base.table.normal_()  # no two buckets alike
    n = 7
    p = begun(pe, n).tolist()
    pos = torch.arange(n)
    bias = pe.score_bias(None, None, pos, pos, 1)
    for i, j in itertools.product(range(n), range(n)):
        one = pe.base.score_bias(None, None, torch.tensor([p[i]]), torch.tensor([p[j]]), 1)
        torch.testing.assert_close(bias[..., i, j], one[..., 0, 0])
    assert len(set(bias[0, 0].flatten().tolist())) > 3, "offsets fall in different buckets"


def test_learned_and_sinusoidal_add_the_rows_of_the_drawn_positions():
    n = 5
    x = torch.randn(2, n, SHAPE.d_model, dtype=torch.float64)
    pos = torch.arange(n)
    learned = build_pe("learned", f"max_len={L}")
    p = begun(learned, n).tolist()
    out = learned.embed(x, pos)
    for i in range(n):
        torch.testing.assert_close(out[:, i], x[:, i] + learned.base.table.weight[p[i]])
    sinusoidal = build_pe("sinusoidal")
    p = begun(sinusoidal, n).tolist()
    out = sinusoidal.embed(x, pos)
    for i, c in itertools.product(range(n), range(SHAPE.d_model)):
        angle = p[i] * 10000.0 ** (-(c - c % 2) / SHAPE.d_model)
        expected = x[:, i, c] + (math.sin(angle) if c % 2 == 0 else math.cos(angle))
        torch.testing.assert_close(out[:, i, c], expected)


@pytest.mark.parametrize("base", ["alibi", "t5"])
def test_the_score_mod_is_the_score_term_at_the_drawn_positions(base):
    pe = build_pe(base)
    assert pe.flex
    n = 6
    begun(pe, n)
    pos = torch.arange(n)
    term = pe.score_bias(None, None, pos, pos, 1)
    score_mod = pe.score_mod(None, pos, pos, 1)
    zero = torch.zeros((), dtype=torch.float64)
    for h, i, j in itertools.product(range(SHAPE.n_heads), range(n), range(n)):
        index = [torch.tensor(v) for v in (0, h, i, j)]
        torch.testing.assert_close(score_mod(zero, *index), term[0, h, i, j])


def test_with_as_many_positions_as_max_position_the_model_is_its_base():
    """n = L leaves one draw, 0..L−1: the base's own positions."""
    torch.manual_seed(0)
    wrapped = Tagger(tiny(), attention(randomized("t5", max_position=9)), VOCAB, 5, causal=True)
    plain = Tagger(tiny(), attention(node("pe", "t5")), VOCAB, 5, causal=True)
    state = {key.replace(".base.", "."): value for key, value in wrapped.state_dict().items()}
    plain.load_state_dict(state)
    torch.testing.assert_close(wrapped(tokens(), None), plain(tokens(), None))
    shorter = tokens(length=5)
    assert not torch.allclose(wrapped(shorter, None), plain(shorter, None))


# one draw per pass, for every hook and layer


def recording(pe: RandomizedPE, hook: str, seen: list) -> None:
    """Record the positions every call of the base's `hook` receives."""
    original = getattr(pe.base, hook)

    def record(*args):
        seen.append([a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.long])
        return original(*args)

    setattr(pe.base, hook, record)


@pytest.mark.parametrize(
    ("base", "hook", "calls"),
    [("rope", "rotate", 6), ("alibi", "score_bias", 3), ("learned", "embed", 1)],
)  # rope: q and k in each of 3 layers; alibi: each layer; learned: the stack's input
def test_every_hook_of_every_layer_sees_the_one_draw_of_its_pass(base, hook, calls):
    torch.manual_seed(0)
    overrides = [f"max_len={L}"] if base == "learned" else []
    tagger = Tagger(tiny(n_layers=3), attention(randomized(base, *overrides)), VOCAB, 5, False)
    pe = tagger.stack.parts.pe
    draws = []
    for _ in range(2):
        seen: list = []
        recording(pe, hook, seen)
        tagger(tokens(), None)
        delattr(pe.base, hook)
        assert len(seen) == calls
        assert all(torch.equal(p, pe.drawn) for positions in seen for p in positions)
        draws.append(pe.drawn)
    assert not torch.equal(*draws), "each pass draws anew"


def test_the_sequences_of_a_batch_share_one_draw():
    torch.manual_seed(0)
    tagger = Tagger(tiny(), attention(randomized("rope")), VOCAB, 5, causal=False).eval()
    out = tagger(tokens(batch=1).repeat(3, 1), None)
    torch.testing.assert_close(out[0], out[1])
    torch.testing.assert_close(out[0], out[2])


# cached decoding


def language_model(base: str, *overrides: str) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(tiny(), attention(randomized(base, *overrides)), VOCAB).double().eval()


@pytest.mark.parametrize(
    ("base", "overrides"),
    [("rope", ()), ("alibi", ()), ("t5", ()), ("learned", (f"max_len={L}",)), ("shaw", ())],
)
def test_cached_decoding_equals_the_full_pass_with_the_same_draw(base, overrides):
    net = language_model(base, *overrides)
    x = tokens(length=10)
    torch.manual_seed(3)
    full = net(x)
    drawn = net.stack.parts.pe.drawn
    torch.manual_seed(3)
    cache = net.new_cache(10)
    steps = [net(x[:, :4], cache)] + [net(x[:, t : t + 1], cache) for t in range(4, 10)]
    assert torch.equal(cache.drawn[""], drawn)
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_a_session_that_outgrows_its_draw_or_the_range_is_refused():
    net = language_model("rope")
    cache = net.new_cache()  # no capacity: the first step draws for itself only
    net(tokens(length=3), cache)
    with pytest.raises(ValueError, match="drew 3 positions and needs 4: make its cache with"):
        net(tokens(length=1), cache)
    with pytest.raises(ConfigError, match=f"{L + 1} positions .* of pe.max_position"):
        net(tokens(length=1), net.new_cache(L + 1))
    with pytest.raises(ConfigError, match=rf"{L + 1} positions .* at most {L} \(pe.max_position\)"):
        net(tokens(length=L + 1))


def test_generation_and_translation_decoding_give_their_sessions_room():
    net = language_model("alibi")
    new = continue_text(net, tokens(length=5), 12, lambda log_probs: log_probs.argmax(-1))
    assert new.shape == (2, 12)
    torch.manual_seed(0)
    model = EncoderDecoder(tiny(), attention(randomized("rope")), VOCAB, VOCAB).eval()
    src = tokens(length=6)
    padding = torch.zeros_like(src, dtype=torch.bool)
    limits = max_target_lengths(model, padding, 1.2, 10, 256)
    assert len(greedy(model, src, padding, 1, 2, limits)) == 2
    assert len(beam_search(model, src, padding, 1, 2, limits, 3, 0.6)) == 2


# evaluation


def test_evaluation_draws_anew_by_default_as_the_paper():
    net = language_model("rope")
    assert net.stack.parts.pe.eval_positions == "random" and not net.training
    x = tokens()
    first = net(x)
    drawn = net.stack.parts.pe.drawn
    assert not torch.equal(drawn, torch.arange(x.shape[1]))
    assert not torch.allclose(net(x), first)
    assert not torch.equal(net.stack.parts.pe.drawn, drawn)


def test_plain_evaluation_is_the_base_at_0_to_n_minus_1_and_training_still_draws():
    torch.manual_seed(0)
    pe = randomized("t5", eval_positions="plain")
    wrapped = DecoderLM(tiny(), attention(pe), VOCAB).double()
    plain = DecoderLM(tiny(), attention(node("pe", "t5")), VOCAB).double()
    plain.load_state_dict({k.replace(".base.", "."): v for k, v in wrapped.state_dict().items()})
    x = tokens()
    assert not torch.allclose(wrapped(x), plain(x)), "training draws"
    wrapped.eval()
    torch.testing.assert_close(wrapped(x), plain.eval()(x), rtol=0, atol=0)
    assert wrapped.stack.parts.pe.drawn is None
    cache = wrapped.new_cache()  # nothing drawn: any session length
    steps = [wrapped(x[:, t : t + 1], cache) for t in range(x.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), plain(x))


# configuration


def test_the_default_base_is_rope_and_the_documented_override_picks_another(tmp_path):
    assert node("pe", "randomized")["base"]["name"] == "rope"
    cfg = compose_config(["pe=randomized", "pe@pe.base=alibi", "pe.max_position=512"], tmp_path)
    pe = build(cfg.pe, shape=SHAPE)
    assert type(pe.base).__name__ == "ALiBi" and pe.max_len == 512


@pytest.mark.parametrize(
    "base", ["none", "sinusoidal", "learned", "rope", "alibi", "t5", "shaw", "deberta", "urpe"]
)
def test_the_wrapper_declares_what_its_base_does(base):
    overrides = [f"max_len={L}"] if "max_len" in node("pe", base) else []
    pe = build_pe(base, *overrides)
    names = (
        "embeds",
        "rotates",
        "adds_score_terms",
        "post_normalization",
        "reweights",
        "needs_query",
    )
    for name in (*names, "needs_key", "flex"):
        assert getattr(pe, name) == getattr(pe.base, name), name
    assert pe.max_len == L


@pytest.mark.parametrize(("pe", "message"), [
    (randomized("learned", max_position=1024), r"pe.base.max_len=512 cannot hold .* to 1024"),
    (randomized("urpe", max_position=1024), "pe.base.max_len=512 cannot hold"),
    (randomized("xl"), "pe.base=xl cannot take drawn positions"),
    ({**randomized("rope"), "base": randomized("rope")}, "among drawn positions"),
    (randomized("rope", max_position=0), "must be a positive integer"),
    (randomized("rope", eval_positions="fixed"), "not one of: random, plain"),
])  # fmt: skip
def test_impossible_settings_are_one_sentence(pe, message):
    with pytest.raises(ConfigError, match=message):
        build(pe, shape=SHAPE)


def test_cross_attention_is_refused():
    cfg = ModelConfig(block=Standard(), d_model=16, n_heads=2, n_layers=1, d_ff=32, cross_pe=True)
    with pytest.raises(ConfigError, match=r"set model\.cross_pe=false"):
        EncoderDecoder(cfg, attention(randomized("rope")), VOCAB, VOCAB)
