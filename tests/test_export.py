"""attnlab export: a checkpoint's model as safetensors, JSON and tokenizer files, loaded back
by generate (and, in test_translate and test_chat, by translate, eval.py and chat) to the
same outputs; loading runs no code; every mistake is one sentence."""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
import subprocess

import pytest
import torch
from helpers import TEXT, fill
from test_lm_generation import ATTNLAB, generated, save_lm_checkpoint

from attnlab.commands.cli import main
from attnlab.errors import ConfigError
from attnlab.export import export
from attnlab.stored import CONFIG, WEIGHTS, digest, read_checkpoint


@pytest.fixture
def exported(make_config, tmp_path):
    checkpoint = save_lm_checkpoint(make_config, tmp_path / "lm.ckpt")
    out = tmp_path / "export"
    export(str(checkpoint), str(out))
    return checkpoint, out


def test_an_exported_language_model_generates_as_its_checkpoint(exported, capsys):
    checkpoint, out = exported
    assert sorted(p.name for p in out.iterdir()) == [CONFIG, WEIGHTS, "tokenizer.chars"]
    texts = [
        generated(
            capsys,
            f"ckpt_path={model}",
            "prompt=First",
            "max_new_tokens=20",
            "decode.strategy=nucleus",
            "decode.seed=3",
        )
        for model in (checkpoint, out)
    ]
    assert texts[0] == texts[1] and len(texts[0]) > len("First") + 10


def test_tied_weights_are_stored_once_and_loaded_into_both_names(make_config, tmp_path):
    from safetensors import safe_open

    checkpoint = torch.load(save_lm_checkpoint(make_config, tmp_path / "lm.ckpt"))
    shared = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    checkpoint["state_dict"] |= {"tied.a": shared, "tied.b": shared}
    torch.save(checkpoint, tmp_path / "tied.ckpt")
    export(str(tmp_path / "tied.ckpt"), str(tmp_path / "out"))
    with safe_open(tmp_path / "out" / WEIGHTS, framework="pt") as weights:
        names = set(weights.keys())
    assert ("tied.a" in names) != ("tied.b" in names)  # one copy
    state = read_checkpoint(tmp_path / "out")["state_dict"]
    assert torch.equal(state["tied.a"], shared) and torch.equal(state["tied.b"], shared)


def test_the_exported_files_have_the_mode_of_a_plain_open(exported):
    _, out = exported
    umask = os.umask(0)
    os.umask(umask)
    assert {stat.S_IMODE(path.stat().st_mode) for path in out.iterdir()} == {0o666 & ~umask}


def test_loading_an_export_unpickles_nothing(exported, monkeypatch, capsys):
    _, out = exported

    def refuse(*args, **kwargs):
        raise AssertionError("loading an exported model unpickled something")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    text = generated(capsys, f"ckpt_path={out}", "prompt=A", "decode.strategy=greedy")
    assert text.startswith("A")


def test_a_config_naming_code_is_refused_in_one_sentence(exported, capsys):
    _, out = exported
    config = json.loads((out / CONFIG).read_text())
    config["run"]["config"]["task"]["system"]["_target_"] = "os.system"
    (out / CONFIG).write_text(json.dumps(config))
    with pytest.raises(SystemExit, match=r"_target_ 'os.system' is not a class of attnlab"):
        main(["generate", f"ckpt_path={out}", "prompt=A"])


def test_a_pickle_in_place_of_the_weights_is_refused_in_one_sentence(exported):
    _, out = exported
    (out / WEIGHTS).write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    with pytest.raises(ConfigError, match="cannot be read as an exported model"):
        read_checkpoint(out)


@pytest.mark.parametrize(
    ("settings", "sentence"),
    [
        (["out=x"], "export needs ckpt_path"),
        (["ckpt_path=x.ckpt"], "export needs out"),
        (["ckpt_path=x.ckpt", "out=y", "dtype=half"], "export has no setting dtype"),
        (["ckpt_path=missing.ckpt", "out=y"], "missing.ckpt is not a file"),
    ],
)
def test_a_bad_request_is_one_sentence(settings, sentence, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=sentence):
        main(["export", *settings])


def test_export_writes_over_nothing_and_loads_only_what_it_wrote(exported, tmp_path):
    checkpoint, out = exported
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        export(str(checkpoint), str(out))
    with pytest.raises(ConfigError, match="is an export already"):
        export(str(out), str(tmp_path / "again"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"a directory without config\.json"):
        read_checkpoint(tmp_path / "empty")
    config = json.loads((out / CONFIG).read_text())
    (out / CONFIG).write_text(json.dumps({**config, "version": 99}))
    with pytest.raises(ConfigError, match="is not the config of an attnlab 1 export"):
        read_checkpoint(out)


def damaged(state: dict[str, torch.Tensor], how: str) -> dict[str, torch.Tensor]:
    name = next(n for n, t in state.items() if t.dim() == 2)  # a weight matrix
    if how == "shape":
        state[name] = state[name][:, :-1].contiguous()
    elif how == "dtype":
        state[name] = state[name].half()
    elif how == "nan":
        state[name] = torch.full_like(state[name], float("nan"))
    elif how == "missing":
        del state[name]
    else:
        state["extra.weight"] = torch.zeros(2)
    return state


def damage_weights(out, how: str) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(out / WEIGHTS, framework="pt") as weights:
        state = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118
        metadata = weights.metadata()
    save_file(damaged(state, how), out / WEIGHTS, metadata=metadata)


def damage_files(out, how: str) -> None:
    if how == "empty":
        (out / "tokenizer.chars").write_bytes(b"")
    elif how == "missing":
        (out / "tokenizer.chars").unlink()
    elif how == "unlisted":
        (out / "tokenizer.model").write_bytes(b"a model")
    else:
        config = json.loads((out / CONFIG).read_text())
        del config["files"]
        (out / CONFIG).write_text(json.dumps(config))


def piece_model(size: int) -> bytes:
    """A SentencePiece model of TEXT's characters with `size` pieces, trained elsewhere: its
    special pieces where SentencePiece puts them by default (no pad, unk 0, bos 1, eos 2)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    symbols = [f"<{i}>" for i in range(size - 3 - len(set(TEXT) - {"\n"}))]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT.splitlines()), model_writer=model, model_type="char",
        vocab_size=size, user_defined_symbols=symbols, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def swap_tokenizer(out, how: str) -> None:
    """Put another tokenizer in the export, listed with its SHA-256 as if exported with it: of
    another size, with its special pieces elsewhere, a link out of the export, or a pipe."""
    chars = out / "tokenizer.chars"
    if how == "smaller":
        chars.write_text("abc")
    elif how == "specials":
        chars.unlink()
        chars = out / "tokenizer.model"
        chars.write_bytes(piece_model(4 + len(set(TEXT))))
    elif how == "link":
        outside = out.parent / "elsewhere.chars"
        chars.rename(outside)
        chars.symlink_to(outside)
        return
    else:
        chars.unlink()
        os.mkfifo(chars)
        return
    config = json.loads((out / CONFIG).read_text())
    config["files"] = {chars.name: digest(chars.read_bytes())}
    (out / CONFIG).write_text(json.dumps(config))


DAMAGED_EXPORTS = {  # id: (damage, what the sentence says)
    "shape": (damage_weights, r"the checkpoint's \S+ is \(\d+, \d+\) torch.float32 where"),
    "dtype": (damage_weights, r"is \(\d+, \d+\) torch.float16 where the model .*torch.float32"),
    "nan": (damage_weights, r"holds NaN or infinite values"),
    "missing_tensor": (damage_weights, r"weights do not fit the model .*: it lacks \S+"),
    "extra": (damage_weights, r"it holds extra.weight, which the model has not"),
    "empty": (damage_files, r"tokenizer.chars is not the file that was exported \(its SHA-256"),
    "missing": (damage_files, r"tokenizer.chars, which config.json lists, is missing"),
    "unlisted": (damage_files, r"tokenizer.model is not one of the files config.json lists"),
    "unrecorded": (damage_files, r"config.json lists no files \(an export of an earlier"),
    "smaller": (swap_tokenizer, r"the checkpoint's tokenizer has 7 tokens where its model has 34"),
    "specials": (
        swap_tokenizer,
        r"the checkpoint's tokenizer holds pad at -1 \(not 0\), unk at 0 \(not 1\), bos at 1 "
        r"\(not 2\), eos at 2 \(not 3\): it is not the tokenizer the model was trained with",
    ),
    "link": (swap_tokenizer, r"tokenizer.chars links to .*elsewhere.chars, outside the export"),
    "fifo": (swap_tokenizer, r"tokenizer.chars is not a regular file: export the checkpoint"),
}


@pytest.mark.parametrize("how", DAMAGED_EXPORTS)
def test_a_damaged_export_is_one_sentence_before_any_text(how, exported):
    """Weights checked against the rebuilt model (names, shapes, dtypes, finiteness), and
    tokenizer files against the SHA-256 that config.json recorded at export."""
    _, out = exported
    damage, sentence = DAMAGED_EXPORTS[how]
    damage(out, how.removesuffix("_tensor"))
    with pytest.raises(SystemExit, match=sentence):
        main(["generate", f"ckpt_path={out}", "prompt=A"])


def test_an_export_into_a_place_it_cannot_write_is_one_sentence(exported, tmp_path):
    checkpoint, _ = exported
    blocker = tmp_path / "a file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match=r"cannot write the export into .*a file/out \(.*\)"):
        main(["export", f"ckpt_path={checkpoint}", f"out={blocker / 'out'}"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_export_with_an_impossible_setting_is_one_sentence_naming_it(exported):
    _, out = exported
    config = json.loads((out / CONFIG).read_text())
    config["hyper_parameters"]["architecture"]["pe"]["max_len"] = -5
    (out / CONFIG).write_text(json.dumps(config))
    with pytest.raises(SystemExit, match=r"max_len=-5 must be a positive integer"):
        main(["generate", f"ckpt_path={out}", "prompt=A"])


DAMAGED_RECORDS = {  # id: (edit of the checkpoint, what the sentence says)
    "no_overrides": (lambda c: c["attnlab"].pop("overrides"), r"attnlab.overrides is missing"),
    "no_config": (lambda c: c["attnlab"].pop("config"), r"attnlab.config is missing"),
    "no_hyperparameters": (lambda c: c.pop("hyper_parameters"), r"hyper_parameters is missing"),
    "overrides_a_number": (
        lambda c: c["attnlab"].update(overrides=5),
        r"attnlab.overrides is int, not list",
    ),
    "overrides_not_text": (
        lambda c: c["attnlab"].update(overrides=[["model=tiny"]]),
        r"attnlab.overrides holds something other than text",
    ),
    "config_a_list": (lambda c: c["attnlab"].update(config=[1]), r"attnlab.config is list"),
    "no_task_name": (
        lambda c: c["attnlab"]["config"]["task"].pop("name"),
        r"attnlab.config.task.name is missing",
    ),
    "no_root_dir": (
        lambda c: c["attnlab"]["config"]["paths"].pop("root_dir"),
        r"attnlab.config.paths.root_dir is missing",
    ),
}


@pytest.mark.parametrize("how", DAMAGED_RECORDS)
def test_a_checkpoint_with_a_damaged_run_record_is_one_sentence_naming_the_entry(
    how, exported, tmp_path
):
    checkpoint, out = exported
    edit, sentence = DAMAGED_RECORDS[how]
    stored = torch.load(checkpoint, weights_only=True)
    edit(stored)
    torch.save(stored, tmp_path / "edited.ckpt")
    with pytest.raises(SystemExit, match=rf"edited.ckpt's entry {sentence}.* damaged or edited"):
        main(["generate", f"ckpt_path={tmp_path / 'edited.ckpt'}", "prompt=A"])
    config = json.loads((out / CONFIG).read_text())
    as_checkpoint = {
        "hyper_parameters": config.pop("hyper_parameters"),
        "attnlab": config.pop("run"),
    }
    edit(as_checkpoint)
    config |= {
        "hyper_parameters": as_checkpoint.get("hyper_parameters"),
        "run": as_checkpoint["attnlab"],
    }
    (out / CONFIG).write_text(json.dumps(config))
    if how == "no_hyperparameters":  # an export's form is checked first
        sentence = r"config.json is not the config of an attnlab 1 export"
    else:
        sentence = rf"export's entry {sentence}.* damaged or edited"
    with pytest.raises(SystemExit, match=sentence):
        main(["generate", f"ckpt_path={out}", "prompt=A"])


@pytest.mark.slow
def test_an_export_onto_a_full_disk_is_one_sentence_leaves_nothing_and_runs_again(
    exported, small_disk
):
    checkpoint, _ = exported
    out = small_disk / "export"
    command = [ATTNLAB, "export", f"ckpt_path={checkpoint}", f"out={out}"]
    filler = fill(small_disk)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.fullmatch(
        rf"attnlab: could not write {out} \(No space left on device, \d+\.\d MiB free there\): "
        r"free space there, then export again \(nothing of it was left\)",
        result.stderr.strip(),
    ), result.stderr
    assert [p.name for p in small_disk.iterdir()] == ["filler"]
    filler.unlink()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert torch.equal(
        read_checkpoint(out)["state_dict"]["net.embed.weight"],
        torch.load(checkpoint, weights_only=True)["state_dict"]["net.embed.weight"],
    )
