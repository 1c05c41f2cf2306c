"""RoPE's context extension (pe.scaling) against its definitions: position interpolation
(Chen et al. 2023, arXiv 2306.15595), NTK-aware scaling and YaRN (Peng et al. 2023, arXiv
2309.00071, Eq. 14–22 and 25); the unscaled rotation unchanged; and eval.py's allowance to set
the scaling on a checkpoint trained without it, which a resumed training run does not have."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import ROOT, SHAPE, TEXT, compose_config, evaluated, make_parts
from hydra.core.global_hydra import GlobalHydra
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention.layer import Attention, KVCache
from attnlab.config.build import build
from attnlab.config.options import variant
from attnlab.errors import ConfigError
from attnlab.model.transformer import attention_mask
from attnlab.pe.rope import RoPE, inverse_frequencies, rotate, yarn_temperature
from attnlab.runner.resume import RECORD_KEY
from attnlab.runner.same_model import check_same_model, evaluation_options
from attnlab.runner.train import train

D = SHAPE.head_dim
LAYOUTS = ["interleaved", "half"]
SCALED = {
    "linear": {"scaling": "linear", "scaling_factor": 4},
    "ntk": {"scaling": "ntk", "scaling_factor": 4},
    "yarn": {"scaling": "yarn", "scaling_factor": 4, "original_max_len": 4},
}
OPTIONS = ["scaling", "scaling_factor", "original_max_len", "yarn_alpha", "yarn_beta"]


def rope(**options: object) -> RoPE:
    """RoPE from its YAML with `options` replaced."""
    return build({**variant("pe", "rope"), **options}, shape=SHAPE)


def vectors(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# the definitions, one pair at a time in float64


def paper_frequencies(
    d: int, b: float, scaling: str, s: float, L: int = 0, alpha: float = 1, beta: float = 32
) -> list[float]:
    """θ_k' of PI (θ/s), NTK-aware (base b·s^(d/(d−2))) and YaRN's NTK-by-parts (Eq. 17–20:
    r = L/λ, λ = 2π/θ, the ramp γ of Eq. 18 written out)."""
    out = []
    for k in range(d // 2):
        theta = b ** (-2 * k / d)
        if scaling == "linear":
            out.append(theta / s)
        elif scaling == "ntk":
            out.append((b * s ** (d / (d - 2))) ** (-2 * k / d))
        else:
            r = L / (2 * math.pi / theta)
            gamma = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
            out.append((1 - gamma) * theta / s + gamma * theta)
    return out


def rotation(position: float, frequencies: list[float]) -> torch.Tensor:
    """R_p [d, d]: 2×2 blocks [[cos, −sin], [sin, cos]] by p·θ_k on dims (2k, 2k+1)."""
    d = 2 * len(frequencies)
    r = torch.zeros(d, d, dtype=torch.float64)
    for k, theta in enumerate(frequencies):
        c, s = math.cos(position * theta), math.sin(position * theta)
        r[2 * k, 2 * k], r[2 * k, 2 * k + 1] = c, -s
        r[2 * k + 1, 2 * k], r[2 * k + 1, 2 * k + 1] = s, c
    return r


def previous_rotate(x: torch.Tensor, pos: torch.Tensor, base: float, layout: str) -> torch.Tensor:
    """RoPE's rotation before pe.scaling existed, verbatim: the oracle of bit-for-bit."""
    d = x.shape[-1]
    pos = pos.to(torch.float64)
    theta = pos[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)[None, :]
    cos, sin = theta.cos().to(x.device, x.dtype), theta.sin().to(x.device, x.dtype)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


# published values


# design example: d = 8, b = 10^4, s = 4, printed to 7 decimals
@pytest.mark.parametrize(
    "scaling,L,expected",
    [
        (None, None, [1, 0.1, 0.01, 0.001]),
        ("linear", None, [0.25, 0.025, 0.0025, 0.00025]),
        ("ntk", None, [1, 0.0629961, 0.0039685, 0.00025]),
        ("yarn", 512, [1, 0.0422953, 0.0025, 0.00025]),  # γ(r) = [1, 0.2306, 0, 0]
        ("yarn", 2048, [1, 0.1, 0.0030467, 0.00025]),  # γ(r) = [1, 1, 0.0729, 0]
    ],
)
def test_the_inverse_frequencies_of_a_worked_example(scaling, L, expected):
    out = inverse_frequencies(8, 10000.0, scaling, 4.0, L, 1.0, 32.0)
    assert out.dtype == torch.float64
    assert out.tolist() == pytest.approx(expected, abs=5e-8)
    if scaling is not None:
        assert out.tolist() == pytest.approx(paper_frequencies(8, 1e4, scaling, 4, L), rel=1e-12)


def test_ntk_is_the_base_change_b_prime():
    """b' = b·s^(d/(d−2)) (YaRN Eq. 16); original_max_len is taken and not read."""
    b_prime = 10000 * 4 ** (8 / 6)
    assert b_prime == pytest.approx(63496.04, abs=0.005)
    ntk = inverse_frequencies(8, 10000.0, "ntk", 4.0, None, 1.0, 32.0)
    assert ntk.tolist() == pytest.approx([b_prime ** (-k / 4) for k in range(4)], rel=1e-12)
    assert rope(**SCALED["ntk"], original_max_len=64).frequencies.tolist() == ntk.tolist()
    x, pos = vectors(2, SHAPE.n_heads, 6, D), torch.tensor([0, 1, 7, 100, 4096, 70_000])
    torch.testing.assert_close(
        rope(**SCALED["ntk"]).rotate(x, pos), rope(base=b_prime).rotate(x, pos)
    )


def test_the_yarn_temperature_of_eq_22_and_eq_25():
    """Eq. 25's 1.208 for s = 8 is √(1/t), the factor on q and on k; the logits are
    multiplied by its square."""
    assert yarn_temperature(4) == pytest.approx(1.138629, abs=5e-7)
    assert yarn_temperature(4) == 0.1 * math.log(4) + 1
    assert yarn_temperature(4) ** 2 == pytest.approx(1.296477, abs=5e-7)
    assert yarn_temperature(8) == pytest.approx(1.208, abs=5e-4)
    assert yarn_temperature(8) ** 2 == pytest.approx(1.459, abs=5e-4)
    assert yarn_temperature(1) == 1


# the definitions


@settings(max_examples=60, deadline=None)
@given(
    d=st.sampled_from([4, 8, 16, 64, 128]),
    base=st.sampled_from([100.0, 10000.0, 500000.0]),
    scaling=st.sampled_from(["linear", "ntk", "yarn"]),
    s=st.floats(1, 64),
    L=st.integers(1, 100_000),
    alpha=st.floats(0, 4),
    width=st.floats(0.5, 64),
)
def test_inverse_frequencies_follow_the_papers_formulas(d, base, scaling, s, L, alpha, width):
    beta = alpha + width
    out = inverse_frequencies(d, base, scaling, s, L, alpha, beta).tolist()
    assert out == pytest.approx(paper_frequencies(d, base, scaling, s, L, alpha, beta), rel=1e-12)
    theta = [base ** (-2 * k / d) for k in range(d // 2)]
    if scaling == "ntk":  # the highest frequency kept, the lowest divided by exactly s
        assert (out[0], out[-1]) == pytest.approx((theta[0], theta[-1] / s), rel=1e-12)
    for new, old in zip(out, theta, strict=True):  # each between PI and the original
        assert old / s * (1 - 1e-12) <= new <= old * (1 + 1e-12)


def test_linear_scaling_is_position_interpolation():
    """Chen et al. §2.3: position m is read as m·L/L' = m/s."""
    x, pos = vectors(2, SHAPE.n_heads, 7, D), torch.tensor([0, 1, 2, 5, 50, 500, 5000])
    for layout in LAYOUTS:
        scaled = rope(**SCALED["linear"], layout=layout).rotate(x, pos)
        torch.testing.assert_close(scaled, rope(layout=layout).rotate(x, pos / 4))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("scaling", list(SCALED))
def test_scaled_scores_are_q_R_prime_n_minus_m_k_and_depend_on_n_minus_m_only(scaling, layout):
    """Entry by entry: q̃_m·k̃_n = τ²·q_mᵀ R'_{n−m} k_n with θ' from the papers' formulas and
    τ = √(1/t) for yarn, 1 otherwise; so shifting both positions changes nothing."""
    pe = rope(**SCALED[scaling], layout=layout)
    frequencies = paper_frequencies(D, 10000.0, scaling, 4, 4)
    tau2 = yarn_temperature(4) ** 2 if scaling == "yarn" else 1.0
    half_to_pairs = torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2))).argsort()
    order = torch.arange(D) if layout == "interleaved" else half_to_pairs
    length = 10
    q, k = vectors(2, length, D)
    pos = torch.arange(length)
    scores = pe.rotate(q, pos) @ pe.rotate(k, pos).T
    shifted = pe.rotate(q, pos + 1000) @ pe.rotate(k, pos + 1000).T
    for m in range(length):
        for n in range(length):
            turned = rotation(n - m, frequencies) @ k[n, order]
            assert scores[m, n] == pytest.approx(tau2 * float(q[m, order] @ turned), rel=1e-9)
    torch.testing.assert_close(shifted, scores)


def test_yarn_multiplies_each_of_q_and_k_by_the_temperature_over_the_whole_head():
    """With rotary_dim = 4 of 8, the pass-through dims are scaled too, so every logit is
    multiplied by (0.1·ln s + 1)² (Eq. 21), not only its rotated part."""
    pe = rope(**SCALED["yarn"], rotary_dim=4)
    tau = yarn_temperature(4)
    frequencies = paper_frequencies(4, 10000.0, "yarn", 4, 4)
    q, k = vectors(2, 6, D)
    pos = torch.arange(100, 106)
    q_rot, k_rot = pe.rotate(q, pos), pe.rotate(k, pos)
    torch.testing.assert_close(q_rot.norm(dim=-1), tau * q.norm(dim=-1))
    torch.testing.assert_close(k_rot[..., 4:], tau * k[..., 4:])
    scores = q_rot @ k_rot.T
    for m in range(6):
        for n in range(6):
            turned = rotation(n - m, frequencies) @ k[n, :4]
            unscaled = float(q[m, :4] @ turned + q[m, 4:] @ k[n, 4:])
            assert scores[m, n] == pytest.approx(tau**2 * unscaled, rel=1e-9)


# the unscaled rotation unchanged


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [2, 4, D])
def test_no_scaling_is_bit_for_bit_the_previous_rope(dtype, layout, rotary_dim):
    x = vectors(2, SHAPE.n_heads, 8, D).to(dtype)
    pos = torch.tensor([0, 1, 2, 3, 31, 1000, 65_535, 1_000_000])
    expected = torch.cat(
        (previous_rotate(x[..., :rotary_dim], pos, 10000.0, layout), x[..., rotary_dim:]), -1
    )
    pe = rope(layout=layout, rotary_dim=rotary_dim)
    assert pe.scaling is None and pe.temperature == 1.0
    assert torch.equal(pe.rotate(x, pos), expected)
    assert torch.equal(rotate(x, pos, 500.0, layout), previous_rotate(x, pos, 500.0, layout))


@pytest.mark.parametrize("scaling", list(SCALED))
def test_a_factor_of_one_is_the_unscaled_rope(scaling):
    x, pos = vectors(2, SHAPE.n_heads, 6, D), torch.tensor([0, 1, 7, 100, 4096, 70_000])
    one = rope(**{**SCALED[scaling], "scaling_factor": 1})
    torch.testing.assert_close(one.rotate(x, pos), rope().rotate(x, pos))
    assert not torch.allclose(rope(**SCALED[scaling]).rotate(x, pos), rope().rotate(x, pos))


@pytest.mark.parametrize("scaling", list(SCALED))
def test_cached_decoding_equals_the_full_pass_past_the_training_length(scaling):
    torch.manual_seed(0)
    node = {**variant("pe", "rope"), **SCALED[scaling]}
    parts = make_parts(node, shape=replace(SHAPE, causal=True)).double()
    attn = Attention(SHAPE, 0, True, True, init_std=0.5, out_std=0.5).double()
    length, n_cached = 12, 9  # past original_max_len = 4
    x = vectors(2, length, SHAPE.d_model)
    pos = torch.arange(length)
    full = attn(x, parts, pos, pos, attention_mask(pos, pos, None, causal=True))
    cache, prefix = KVCache(), pos[:n_cached]
    attn(x[:, :n_cached], parts, prefix, prefix, attention_mask(prefix, prefix, None, True),
         cache=cache)  # fmt: skip
    rest = pos[n_cached:]
    cached = attn(x[:, n_cached:], parts, rest, pos, attention_mask(rest, pos, None, True),
                  cache=cache)  # fmt: skip
    torch.testing.assert_close(cached, full[:, n_cached:])


def test_the_yaml_defaults_scale_nothing():
    pe = rope()
    assert (pe.scaling, pe.temperature, pe.max_len) == (None, 1.0, None)
    assert pe.frequencies.tolist() == [10000 ** (-2 * k / D) for k in range(D // 2)]
    assert rope(**SCALED["yarn"]).max_len is None  # every length stays applicable


@pytest.mark.parametrize(
    "options,message",
    [
        ({"scaling": "dynamic"}, r"pe.scaling='dynamic' is not one of: null, linear, ntk, yarn$"),
        ({"scaling": "yarn", "original_max_len": 8}, r"pe.scaling=yarn needs pe.scaling_factor, "),
        ({"scaling": "linear", "scaling_factor": 0.5}, r"pe.scaling_factor=0.5 must be at least 1 "),
        ({"scaling": "yarn", "scaling_factor": 4}, r"pe.scaling=yarn needs pe.original_max_len, "),
        ({**SCALED["yarn"], "original_max_len": 0},
         r"pe.original_max_len=0 must be a positive number of positions$"),
        ({**SCALED["yarn"], "yarn_beta": 0.5},
         r"pe.yarn_alpha=1.0 and pe.yarn_beta=0.5 must satisfy 0 ≤ yarn_alpha < yarn_beta"),
        ({"scaling_factor": 4}, r"pe.scaling_factor=4 has no effect with pe.scaling=null: drop it, "
                                r"or choose pe.scaling=linear or ntk or yarn$"),
        ({**SCALED["ntk"], "yarn_alpha": 2},
         r"pe.yarn_alpha=2 has no effect with pe.scaling=ntk: drop it, or choose pe.scaling=yarn$"),
        ({**SCALED["ntk"], "rotary_dim": 2},
         r"pe.scaling=ntk needs at least 4 rotated dimensions, not 2 "),
    ],
)  # fmt: skip
def test_bad_scaling_options_are_one_sentence(options, message):
    with pytest.raises(ConfigError, match=message):
        rope(**options)


# eval.py may set the scaling on a checkpoint; a resumed training run may not


def config(pe: dict, **options: object) -> dict:
    """The parts of a run's config that check_same_model reads, with `pe` and its `options`."""
    return {"pe": {**pe, **options}, "task": {"name": "lm"}}


def test_evaluation_options_are_the_scaling_options_of_each_rope():
    plain = variant("pe", "rope")
    assert evaluation_options(config(plain)) == {f"pe.{o}": plain[o] for o in OPTIONS}
    urpe = evaluation_options(config(variant("pe", "urpe"), base=plain))
    assert list(urpe) == [f"pe.base.{o}" for o in OPTIONS]
    assert evaluation_options(config(variant("pe", "alibi"))) == {}


def test_only_evaluation_may_change_the_scaling_of_a_checkpoint():
    stored = config(variant("pe", "rope"))
    scaled = config(variant("pe", "rope"), scaling="yarn", scaling_factor=4, original_max_len=64)
    check_same_model(scaled, stored, "eval.py", evaluation_options(scaled))
    with pytest.raises(ConfigError, match=r"pe\.scaling=None \(not yarn\), pe\.scaling_factor="):
        check_same_model(scaled, stored, "train.py ckpt_path=...")
    other = config(scaled["pe"], base=500)
    with pytest.raises(ConfigError, match=r"which has pe\.base=10000\.0 \(not 500\): "):
        check_same_model(other, stored, "eval.py", evaluation_options(other))


def test_a_checkpoint_from_before_the_scaling_options_is_the_same_model():
    today = config(variant("pe", "rope"))
    stored = config({k: v for k, v in today["pe"].items() if k not in OPTIONS})
    check_same_model(today, stored, "train.py ckpt_path=...")
    check_same_model(today, stored, "eval.py", evaluation_options(today))


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory) -> Path:
    """A tiny LM trained with plain rope on 8-token windows, in this process."""
    root = tmp_path_factory.mktemp("lm")
    data = root / "text"
    data.mkdir()
    for split in ("train", "valid", "test"):
        (data / f"{split}.txt").write_text(TEXT, encoding="utf-8")
    overrides = [
        "~logger", "callbacks.progress_bar.refresh_rate=0", "callbacks.model_summary.max_depth=0",
        "extras.print_config=false", "task=lm", "task.data.source=local", f"task.data.dir={data}",
        "task.data.tokenizer=char", f"paths.data_dir={root / 'cache'}", "model=tiny", "pe=rope",
        "task.data.block_size=8", "task.data.eval_lengths=[8,32]", "trainer.max_steps=3",
        "trainer.max_epochs=-1", "trainer.check_val_every_n_epoch=null",
        "trainer.val_check_interval=3", "task.system.samples=0", "test=false",
    ]  # fmt: skip
    train(compose_config(overrides, root / "run"))
    GlobalHydra.instance().clear()
    return root / "run" / "checkpoints" / "last.ckpt"


YARN = ["pe.scaling=yarn", "pe.scaling_factor=4", "pe.original_max_len=8"]


@pytest.mark.slow
def test_eval_sets_the_scaling_in_the_checkpoints_model_also_one_from_before_it(
    lm_checkpoint, tmp_path
):
    plain = evaluated(lm_checkpoint, tmp_path / "plain")
    scaled = evaluated(lm_checkpoint, tmp_path / "scaled", *YARN)
    for length in (8, 32):  # every length applicable (rope has no max_len), each changed
        assert math.isfinite(scaled[f"test/ppl@{length}"])
        assert scaled[f"test/ppl@{length}"] != plain[f"test/ppl@{length}"]
    data = torch.load(lm_checkpoint, weights_only=True)
    for pe in (data[RECORD_KEY]["config"]["pe"], data["hyper_parameters"]["architecture"]["pe"]):
        for option in OPTIONS:
            del pe[option]
    legacy = tmp_path / "legacy.ckpt"
    torch.save(data, legacy)
    assert evaluated(legacy, tmp_path / "legacy", *YARN) == scaled
    assert evaluated(legacy, tmp_path / "legacy_plain") == plain


@pytest.mark.slow
def test_eval_refuses_any_other_change_of_the_pe(lm_checkpoint, tmp_path):
    with pytest.raises(ConfigError, match=r"which has pe\.layout=interleaved \(not half\): "):
        evaluated(lm_checkpoint, tmp_path, *YARN, "pe.layout=half")


@pytest.mark.slow
def test_the_command_lines_take_the_scaling_in_eval_py_only(lm_checkpoint, tmp_path):
    def run(program: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, program, f"ckpt_path={lm_checkpoint}", *args,
             f"hydra.run.dir={tmp_path / program}", "extras.print_config=false"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    assert run("eval.py", *YARN).returncode == 0
    resumed = run("train.py", *YARN)
    assert resumed.returncode == 1
    assert "pe.scaling=None (not yarn)" in resumed.stderr.strip().splitlines()[-1]
