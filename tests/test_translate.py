"""attnlab translate: a file translated with a trained model, no references, the same as the
run's own evaluation decodes it; bad requests are one sentence."""

from __future__ import annotations

import io
import os
import sys

import pytest
import torch
from helpers import attnlab, evaluated, fill
from test_translation_data import sentence_pairs, write_split

from attnlab.commands.translate import batches, translate
from attnlab.errors import ConfigError
from attnlab.runner.train import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny translation model trained on word-for-word pairs, in this process."""
    from helpers import compose_config

    root = tmp_path_factory.mktemp("mt")
    data = root / "data"
    for split, (count, seed) in {"train": (400, 0), "valid": (40, 1), "test": (30, 2)}.items():
        write_split(data, split, sentence_pairs(count, seed))
    cfg = compose_config(
        [
            "~logger", "callbacks.progress_bar.refresh_rate=0", "extras.print_config=false",
            "callbacks.model_summary.max_depth=0", "task=translation", f"task.data.dir={data}",
            "task.data.tokenizer.vocab_size=50", "task.data.tokenizer.pairs=1000", "model=tiny",
            "trainer.max_epochs=3", f"paths.data_dir={root / 'cache'}", "test=false",
        ],
        root / "run",
    )  # fmt: skip
    train(cfg)
    (best,) = (root / "run" / "checkpoints").glob("epoch_*.ckpt")
    return best, data, root


def test_greedy_translation_of_the_test_sources_is_what_evaluation_wrote(trained, tmp_path):
    best, data, root = trained
    evaluated(best, tmp_path / "eval", "decode.strategy=greedy", f"paths.data_dir={root / 'cache'}")
    out = tmp_path / "out.de"
    count = translate(
        [f"ckpt_path={best}", f"input={data / 'test.en'}", f"output={out}",
         "decode.strategy=greedy", "max_tokens=64"]
    )  # fmt: skip
    assert count == 30
    assert out.read_text() == (tmp_path / "eval" / "hypotheses" / "test.txt").read_text()


def test_standard_input_to_standard_output(trained, monkeypatch, capsys):
    best, _, _ = trained
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b\nc\n")))
    assert translate([f"ckpt_path={best}", "input=-", "decode.strategy=greedy"]) == 2
    assert len(capsys.readouterr().out.splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["input=x.en"], "translate needs a model"),
        (["ckpt_path=x"], "translate needs text"),
        (["ckpt_path=x", "input=x", "beam=4"], "translate has no setting beam"),
        (["ckpt_path=x", "input=x", "max_tokens=0"], "max_tokens=0 must be a positive integer"),
    ],
)
def test_a_bad_request_is_one_sentence(args, sentence):
    with pytest.raises(ConfigError, match=sentence):
        translate(args)


def test_a_missing_input_file_is_one_sentence(trained, tmp_path):
    best, _, _ = trained
    with pytest.raises(ConfigError, match=r"input=.* is not a file"):
        translate([f"ckpt_path={best}", f"input={tmp_path / 'none.en'}"])


OVERWRITE = (
    "attnlab: output={output} is the file translate reads as {read} (links followed): writing it "
    "would lose that file; pass output=<another file>, or leave output out to write to standard "
    "output"
)


@pytest.mark.parametrize("form", ["the same path", "a symbolic link", "a hard link"])
def test_an_output_onto_the_input_is_refused_and_the_input_kept(trained, tmp_path, form):
    best, data, _ = trained
    source = tmp_path / "in.en"
    source.write_bytes((data / "test.en").read_bytes())
    output = {"the same path": source, "a symbolic link": tmp_path / "link.en",
              "a hard link": tmp_path / "hard.en"}[form]  # fmt: skip
    if form == "a symbolic link":
        os.symlink(source.name, output)
    elif form == "a hard link":
        os.link(source, output)

    refused = attnlab("translate", f"ckpt_path={best}", f"input={source}", f"output={output}")

    assert refused.returncode == 1
    assert refused.stderr.strip() == OVERWRITE.format(output=output, read=f"input={source}")
    assert source.read_bytes() == (data / "test.en").read_bytes()


def test_an_output_onto_the_checkpoint_or_a_file_of_an_export_is_refused(trained, tmp_path):
    best, data, _ = trained
    exported = tmp_path / "export"
    assert attnlab("export", f"ckpt_path={best}", f"out={exported}").returncode == 0
    model = tmp_path / "model.ckpt"
    os.symlink(best, model)
    before = {path: path.read_bytes() for path in (best, *exported.iterdir())}
    for ckpt, output, read in [
        (model, best, f"ckpt_path={model}"),
        (exported, exported / "config.json", f"ckpt_path={exported} ({exported / 'config.json'})"),
    ]:
        refused = attnlab("translate", f"ckpt_path={ckpt}", f"input={data / 'test.en'}",
                          f"output={output}")  # fmt: skip
        assert refused.returncode == 1
        assert refused.stderr.strip() == OVERWRITE.format(output=output, read=read)
    refused = attnlab("export", f"ckpt_path={model}", f"out={best}")
    assert refused.stderr.strip() == (
        f"attnlab: out={best} is the file export reads as ckpt_path={model} (links followed): "
        "writing it would lose that file; pass out=<a new directory>"
    )
    assert {path: path.read_bytes() for path in before} == before


def test_standard_input_closed_is_one_sentence_and_empty_input_no_lines(trained):
    best, _, _ = trained
    closed = attnlab("translate", f"ckpt_path={best}", "input=-", stdin_closed=True)
    assert closed.returncode == 1
    assert closed.stderr.strip() == (
        "attnlab: translate reads standard input, and this process has none (it was closed): "
        "pass input=<a file>, or give it a terminal, a pipe or < file"
    )
    empty = attnlab("translate", f"ckpt_path={best}", "input=-")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "")


def test_batches_keep_each_batch_within_its_token_budget():
    lengths = [5, 1, 9, 3, 3, 12]
    found = list(batches(lengths, 10))
    assert sorted(i for batch in found for i in batch) == list(range(6))
    for batch in found:
        assert len(batch) == 1 or max(lengths[i] for i in batch) * len(batch) <= 10


def test_the_loaded_system_keeps_its_runs_data_settings_read_once(trained):
    from attnlab.commands.translate import evaluation_cut, stored_data
    from attnlab.data.tokenizer import VOCABULARY_KEY
    from attnlab.stored import load_system
    from attnlab.tasks.seq2seq.system import Seq2SeqSystem

    best, _, _ = trained
    system = load_system(best, Seq2SeqSystem, (lambda task: True, ""), VOCABULARY_KEY, "test")
    assert stored_data(system)["batching"]["max_eval_len"] == 1024  # conf/task/translation.yaml
    assert evaluation_cut(system) == 1023  # room for EOS


def test_an_exported_model_translates_and_evaluates_as_its_checkpoint(trained, tmp_path):
    from attnlab.commands.cli import main
    from attnlab.stored import read_checkpoint

    best, data, root = trained
    exported = tmp_path / "export"
    main(["export", f"ckpt_path={best}", f"out={exported}"])
    names = sorted(path.name for path in exported.iterdir())
    assert names == ["config.json", "model.safetensors", "source.model"]  # a joint vocabulary
    stored, loaded = read_checkpoint(best)["state_dict"], read_checkpoint(exported)["state_dict"]
    assert stored.keys() == loaded.keys()
    assert all(torch.equal(stored[name], loaded[name]) for name in stored)
    outputs = []
    for model in (best, exported):
        out = tmp_path / f"{model.name}.de"
        translate([f"ckpt_path={model}", f"input={data / 'test.en'}", f"output={out}",
                   "decode.strategy=nucleus", "decode.seed=1"])  # fmt: skip
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1] and outputs[0].strip()  # sampled: not all empty
    cache = f"paths.data_dir={root / 'cache'}"
    scores = [
        evaluated(model, tmp_path / f"eval-{n}", cache) for n, model in enumerate([best, exported])
    ]
    assert scores[0] == scores[1]


@pytest.mark.parametrize(
    "data,cut",
    [({"batching": {"max_eval_len": 64}}, 63), ({"max_eval_len": 64}, 63)],  # before: flat
    ids=["batching node", "flat, runs before the node"],
)
def test_the_evaluation_cut_is_read_from_either_layout_of_the_runs_data(data, cut):
    from types import SimpleNamespace

    from attnlab.commands.translate import evaluation_cut

    record = {"config": {"task": {"data": data}}}
    assert evaluation_cut(SimpleNamespace(run_record=record)) == cut
    with pytest.raises(ConfigError, match=r"no usable task\.data\.batching\.max_eval_len"):
        evaluation_cut(SimpleNamespace(run_record={"config": {"task": {"data": {}}}}))


def test_translations_onto_a_full_disk_are_one_sentence_and_the_earlier_output_kept(
    trained, small_disk
):
    best, data, _ = trained
    output = small_disk / "out.de"
    output.write_text("an earlier translation\n", encoding="utf-8")
    filler = fill(small_disk)

    refused = attnlab("translate", f"ckpt_path={best}", f"input={data / 'test.en'}",
                      f"output={output}")  # fmt: skip

    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().startswith(
        f"attnlab: could not write {output} (No space left on device"
    ), refused.stderr[-2000:]
    assert output.read_text(encoding="utf-8") == "an earlier translation\n"
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "out.de"], "no half file"
    filler.unlink()
    assert attnlab("translate", f"ckpt_path={best}", f"input={data / 'test.en'}",
                   f"output={output}").returncode == 0  # fmt: skip
    assert len(output.read_text(encoding="utf-8").splitlines()) == len(
        (data / "test.en").read_text(encoding="utf-8").splitlines()
    )
