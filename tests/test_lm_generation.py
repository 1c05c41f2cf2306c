"""`attnlab generate` and the generation under it: the key/value cache changes no token for
any positional encoding, a seed gives the same text again, the command end to end on a
checkpoint that train.py wrote, and every mistake ends in one sentence."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CAUSAL_PES, ROOT, SHARED_DATA, TEXT, decode_node, first_then_slow, repeatable

from attnlab.commands.cli import main
from attnlab.commands.generate import SAMPLE_RULE, load_language_model, parse_request
from attnlab.config.build import to_dict
from attnlab.config.groups import ARCHITECTURE
from attnlab.config.options import variant
from attnlab.decoding.decoder_only import Pick, continue_text, picker
from attnlab.decoding.encoder_decoder import DecodeConfig
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture
from attnlab.model.transformer import DecoderLM
from attnlab.stored import RECORD_KEY
from attnlab.tasks.lm.stream import SPECIALS, CharTokenizer
from attnlab.tasks.lm.system import LMSystem

VOCAB = 13
MAX_LEN = 32  # the positions of the checkpoints' pe=learned
LEARNED = ("pe=learned", f"pe.max_len={MAX_LEN}")
ATTNLAB = str(Path(sys.executable).parent / "attnlab")
SHAKESPEARE = SHARED_DATA / "tinyshakespeare" / "input.txt"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run faster on one thread, and far faster beside other jobs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_network(pe: str) -> DecoderLM:
    """A random decoder-only network of model=tiny with `pe` (the real YAMLs), in float64,
    with weights large enough (init_std 0.2) and an output projection of its own, so that
    the next token depends on the context and the text varies."""
    model = {**variant("model", "tiny"), "dropout": 0.0, "init_std": 0.2, "tie_embeddings": False}
    nodes = {"model": model, "block": variant("block", "standard"), "pe": repeatable("pe", pe),
             "norm": variant("norm", "softmax"), "synthesizer": variant("synthesizer", "dot")}  # fmt: skip
    architecture = Architecture.from_config(nodes)
    return DecoderLM(architecture.model, architecture.attention, VOCAB).double().eval()


def recorded(pick: Pick) -> tuple[Pick, list[torch.Tensor]]:
    """`pick`, keeping the log-probabilities it is given at each step."""
    seen: list[torch.Tensor] = []

    def record(log_probs: torch.Tensor) -> torch.Tensor:
        seen.append(log_probs)
        return pick(log_probs)

    return record, seen


@pytest.mark.parametrize("strategy", ["greedy", "nucleus"])
@pytest.mark.parametrize("pe", CAUSAL_PES)
def test_the_cache_changes_no_generated_token(pe, strategy):
    torch.manual_seed(0)
    net = tiny_network(pe)
    prompts = torch.randint(SPECIALS, VOCAB, (3, 5), generator=torch.Generator().manual_seed(1))
    tokens, log_probs = {}, {}
    for cache in (True, False):
        pick = picker(
            DecodeConfig(**decode_node(top_p=0.9)), strategy, torch.Generator().manual_seed(7)
        )
        pick, log_probs[cache] = recorded(pick)
        tokens[cache] = continue_text(net, prompts, 24, pick, cache=cache)
    assert tokens[True].shape == (3, 24)
    assert torch.equal(tokens[True], tokens[False])
    # each step's distribution too: a wrong cache shows even where the tokens agree
    torch.testing.assert_close(torch.stack(log_probs[True]), torch.stack(log_probs[False]))
    if strategy == "nucleus":
        assert len(tokens[True].unique()) >= 4, "the samples vary"


def save_lm_checkpoint(
    make_config, path: Path, *overrides: str, pe: tuple[str, ...] = LEARNED
) -> Path:
    """A checkpoint of a random tiny language model (by default pe=learned with MAX_LEN
    positions; a char tokenizer of TEXT) holding what train.py stores: weights,
    hyperparameters (plain data), the run record and the tokenizer."""
    cfg = make_config(["task=lm", *pe, "model=tiny", "model.dropout=0.0", "model.init_std=0.2",
                       *overrides])  # fmt: skip
    tokenizer = CharTokenizer(TEXT)
    system_settings = {k: v for k, v in to_dict(cfg.task.system).items() if k != "_target_"}
    hyperparameters = {
        **system_settings,  # the YAML's, decode included
        "architecture": {group: to_dict(cfg[group]) for group in ARCHITECTURE},
        "optim": to_dict(cfg.task.optim),
        "vocab_size": tokenizer.vocab_size,
        "sample_prompt": "\n",
    }
    torch.manual_seed(0)
    system = LMSystem(**LMSystem.arguments(hyperparameters), tokenizer=tokenizer)
    checkpoint = {
        "state_dict": system.state_dict(),
        "hyper_parameters": hyperparameters,
        RECORD_KEY: {"overrides": list(overrides), "config": to_dict(cfg)},
    }
    system.on_save_checkpoint(checkpoint)  # the tokenizer, as bytes
    torch.save(checkpoint, path)
    return path


@pytest.fixture
def checkpoint(make_config, tmp_path) -> Path:
    return save_lm_checkpoint(make_config, tmp_path / "lm.ckpt")


def generated(capsys, *settings: str) -> str:
    main(["generate", *settings])
    return capsys.readouterr().out


def test_a_seed_gives_the_same_text_again_and_another_seed_another(checkpoint, capsys):
    settings = [f"ckpt_path={checkpoint}", "prompt=First", "max_new_tokens=20",
                "decode.strategy=nucleus"]  # fmt: skip
    first = generated(capsys, *settings, "decode.seed=1")
    assert first.startswith("First") and len(first) > len("First\n") + 10
    assert generated(capsys, *settings, "decode.seed=1") == first
    assert generated(capsys, *settings, "decode.seed=1", "cache=false") == first
    assert generated(capsys, *settings, "decode.seed=2") != first
    two = generated(capsys, *settings, "decode.seed=1", "samples=2").rstrip("\n").split(SAMPLE_RULE)
    assert len(two) == 2 and all(text.startswith("First") for text in two) and two[0] != two[1]


def test_greedy_text_is_the_same_whatever_the_seed(checkpoint, capsys):
    settings = [f"ckpt_path={checkpoint}", "prompt=Speak", "decode.strategy=greedy"]
    assert generated(capsys, *settings, "decode.seed=1") == generated(
        capsys, *settings, "decode.seed=2"
    )


@pytest.mark.parametrize(
    "setting,prompt",
    [
        ('prompt="ROMEO:"', "ROMEO:"),
        ("prompt=ROMEO:", "ROMEO:"),
        ("prompt='First Citizen:\\n'", "First Citizen:\n"),
        ("prompt=First Citizen:\\n", "First Citizen:\n"),
        ("prompt='O Romeo, Romeo!'", "O Romeo, Romeo!"),
        ("prompt=true", "true"),
        ("prompt=007", "007"),
        ("prompt='tab\\there, a backslash \\\\n'", "tab\there, a backslash \\n"),
        ("prompt=${oc.env:HOME}", "${oc.env:HOME}"),  # text, never an interpolation
    ],
)
def test_prompts_are_read_in_hydras_grammar_as_written(setting, prompt):
    assert parse_request(["ckpt_path=x.ckpt", setting]).prompt == prompt


def test_the_default_prompt_is_the_runs_and_the_default_length_fits_the_positions(
    checkpoint, capsys
):
    text = generated(capsys, f"ckpt_path={checkpoint}", "decode.strategy=greedy")
    assert text.startswith("\n")
    assert 1 + 10 < len(text.rstrip("\n")) <= 1 + MAX_LEN  # the prompt, then at most 32 tokens


@pytest.mark.slow
@pytest.mark.skipif(
    not SHAKESPEARE.is_file(), reason=f"the shared Tiny Shakespeare is not at {SHAKESPEARE}"
)
def test_generate_continues_a_prompt_with_a_checkpoint_train_py_wrote(tmp_path):
    run = tmp_path / "run"
    training = subprocess.run(
        [sys.executable, "train.py", "experiment=lm_shakespeare_char", "model=tiny",
         "model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64",
         "trainer.max_steps=3", "trainer.val_check_interval=3", "pe.max_len=64",
         "task.system.samples=0", f"paths.data_dir={tmp_path / 'data'}", f"hydra.run.dir={run}",
         "callbacks.progress_bar.refresh_rate=0", "extras.print_config=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert training.returncode == 0, training.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = [ATTNLAB, "generate", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
               'prompt="ROMEO:"', "max_new_tokens=20", "decode.strategy=nucleus",
               "decode.seed=1"]  # fmt: skip
    outputs = []
    for _ in range(2):
        result = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0].startswith("ROMEO:") and len(outputs[0]) > len("ROMEO:") + 10
    assert not any(elsewhere.iterdir()), "generate writes no file or directory"


def other_task_checkpoint(path: Path) -> Path:
    config = {"task": {"name": "probe"}, "paths": {"root_dir": str(path.parent)}}
    record = {"overrides": ["task=probe"], "config": config}
    torch.save({RECORD_KEY: record, "state_dict": {}, "hyper_parameters": {}}, path)
    return path


ERRORS = [
    ([], "generate needs the language model to continue the prompt with: pass ckpt_path="),
    (["ckpt_path={tmp}/missing.ckpt"], "missing.ckpt is not a file"),
    (["ckpt_path={other}"], "generate needs a language model checkpoint (a run of task=lm)"),
    (
        ["ckpt_path={ckpt}", "decode.strategy=beam"],
        "decode.strategy=beam does not apply to a "
        "language model's text: use one of greedy, top_k, nucleus",
    ),
    (["ckpt_path={ckpt}", "decode.strategy=sample"], "decode.strategy=sample does not apply"),
    (
        ["ckpt_path={ckpt}", "prompt=ROMEO:", "max_new_tokens=40"],
        "a prompt of 6 tokens and 40 "
        "new ones need 45 positions, but the model's positional encoding has 32: ask for at most "
        "27 new tokens",
    ),
    (["ckpt_path={ckpt}", f"prompt={'a' * 40}"], "a prompt of 40 tokens is longer than the 32"),
    (["ckpt_path={ckpt}", "prompt="], "the prompt is empty"),
    (["ckpt_path={ckpt}", "prompt=''"], "the prompt is empty"),
    (["ckpt_path={ckpt}", "max_new_tokens=0"], "max_new_tokens=0 must be a positive integer"),
    (["ckpt_path={ckpt}", "decode.top_p=2"], "decode.top_p=2 must be a probability"),
    (["ckpt_path={ckpt}", "cache=maybe"], "cache='maybe' must be true or false"),
    (
        ["ckpt_path={ckpt}", "temperature=2"],
        "generate has no setting temperature: its settings are ckpt_path, prompt",
    ),
    (["ckpt_path={ckpt}", "decode.beam=2"], "generate has no setting decode.beam"),
    (["ckpt_path={ckpt}", "pe.max_len=64"], "generate has no setting pe.max_len"),
    (
        ["ckpt_path={ckpt}", "pe.scaling=linear", "pe.scaling_factor=2"],
        "pe.scaling, pe.scaling_factor cannot be set on {ckpt}: its model has pe=learned, "
        "whose settings generate may change are none",
    ),
    (
        ["ckpt_path={ckpt}", "prompt=O Romeo, Romeo!"],
        "cannot read 'prompt=O Romeo, Romeo!' as key=value: quote",
    ),
    (["ckpt_path={ckpt}", "prompt=a,b"], "is not a plain key=value"),
]


@pytest.mark.parametrize("settings,expected", ERRORS)
def test_every_mistake_is_one_sentence(checkpoint, tmp_path, settings, expected):
    other = other_task_checkpoint(tmp_path / "probe.ckpt")
    filled = [s.format(tmp=tmp_path, ckpt=checkpoint, other=other) for s in settings]
    with pytest.raises(SystemExit) as stop:
        main(["generate", *filled])
    message = str(stop.value.code)
    assert message.startswith("attnlab: ") and "\n" not in message
    assert expected.format(ckpt=checkpoint) in message


def test_ropes_context_extension_reaches_the_model_and_its_mistakes_are_one_sentence(
    make_config, tmp_path, capsys
):
    path = str(save_lm_checkpoint(make_config, tmp_path / "rope.ckpt", pe=("pe=rope",)))
    plain = load_language_model(path).net.stack.parts.pe
    linear = {"pe.scaling": "linear", "pe.scaling_factor": 4.0}
    scaled = load_language_model(path, linear).net.stack.parts.pe
    assert plain.scaling is None and scaled.scaling == "linear"
    torch.testing.assert_close(scaled.frequencies, plain.frequencies / 4)  # θ' = θ / s
    main(["generate", f"ckpt_path={path}", "pe.scaling=yarn", "pe.scaling_factor=2",
          "pe.original_max_len=16", "max_new_tokens=20", "decode.strategy=greedy"])  # fmt: skip
    assert len(capsys.readouterr().out) > 20
    with pytest.raises(SystemExit, match=r"pe\.scaling=yarn needs pe\.original_max_len"):
        main(["generate", f"ckpt_path={path}", "pe.scaling=yarn", "pe.scaling_factor=2"])


@pytest.mark.parametrize(
    "settings", first_then_slow([["prompt=x"], ["ckpt_path={ckpt}", "decode.strategy=beam"]])
)
def test_the_command_ends_a_mistake_with_one_line_and_a_failing_status(checkpoint, settings):
    filled = [s.format(ckpt=checkpoint) for s in settings]
    result = subprocess.run(
        [ATTNLAB, "generate", *filled], capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.startswith("attnlab: ") and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_the_generation_benchmark_runs_in_smoke_mode_and_leaves_benchmarks_md_alone(tmp_path):
    tracked = ROOT / "BENCHMARKS.md"
    copy = tmp_path / "BENCHMARKS.md"
    copy.write_bytes(tracked.read_bytes())
    before = tracked.read_bytes()
    result = subprocess.run(
        [sys.executable, "benchmarks/generate.py", "--smoke"], cwd=ROOT, capture_output=True,
        text=True, timeout=300, env={**os.environ, "ATTNLAB_BENCHMARKS_MD": str(copy)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 1 | ")]
    assert len(rows) == 1 and "×" in rows[0]
    assert "not writing BENCHMARKS.md" in result.stdout
    assert copy.read_bytes() == before and tracked.read_bytes() == before


class Writes(io.StringIO):
    """Standard output that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.mark.parametrize("strategy", ["greedy", "nucleus"])
def test_one_sample_streams_its_text_as_drawn_and_the_same_text(strategy, checkpoint):
    from attnlab.commands.generate import generate, print_generated

    settings = [f"ckpt_path={checkpoint}", "prompt=First", "max_new_tokens=20",
                f"decode.strategy={strategy}", "decode.seed=4"]  # fmt: skip
    out = Writes()
    print_generated(settings, out)
    assert out.getvalue() == generate(settings)[0] + "\n"
    assert out.writes == 1 + 20 + 1, "the prompt, a piece per token, the line's end"


def test_a_continuation_whose_cache_cannot_fit_is_one_sentence_before_decoding(
    make_config, tmp_path
):
    path = save_lm_checkpoint(make_config, tmp_path / "rope.ckpt", pe=("pe=rope",))
    with pytest.raises(SystemExit, match=r"to 1,000,000,004 positions keeps a key/value cache"):
        main(["generate", f"ckpt_path={path}", "prompt=First", "max_new_tokens=1000000000"])


def test_a_refused_request_prints_no_text_before_its_sentence(checkpoint):
    from attnlab.commands.generate import print_generated

    out = Writes()
    settings = [f"ckpt_path={checkpoint}", "prompt=First", "max_new_tokens=100000"]
    with pytest.raises(ConfigError, match="positions"):
        print_generated(settings, out)
    assert out.getvalue() == ""


def test_a_continuation_without_the_cache_whose_last_pass_cannot_fit_is_refused_before_decoding(
    make_config, tmp_path
):
    """Recomputing the prefix at each step, the last step passes over every position: its
    causal mask alone (10^18 bytes here) is refused, rather than streaming until killed."""
    from attnlab.commands.generate import print_generated

    path = save_lm_checkpoint(make_config, tmp_path / "rope.ckpt", pe=("pe=rope",))
    out = Writes()
    settings = [f"ckpt_path={path}", "prompt=First", "max_new_tokens=1000000000", "cache=false"]
    with pytest.raises(ConfigError, match=(
        r"a pass over 1 sequence of 1,000,000,004 tokens \(a 1,000,000,004² causal mask, the "
        r"logits and hidden states\) needs [\d,.]+ GiB .* ask for fewer new tokens "
        r"\(max_new_tokens\) or samples, or keep the cache"
    )):  # fmt: skip
        print_generated(settings, out)
    assert out.getvalue() == ""
