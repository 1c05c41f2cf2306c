"""attnlab chat: replies to conversations read from a file are what the run's evaluation
decodes for the same contexts; the terminal form keeps the conversation."""

from __future__ import annotations

import io
import os
import sys

import pytest
from helpers import attnlab, compose_config, evaluated
from test_dialogue import conversation, dialogue_line, write_dialogues

from attnlab.commands.chat import chat
from attnlab.errors import ConfigError
from attnlab.runner.train import train
from attnlab.tasks.seq2seq.dialogue import END_OF_TURN

TEST_TALKS = [conversation(100 + n, 3) for n in range(3)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny dialogue model on local DailyDialog-style files with their own test split."""
    root = tmp_path_factory.mktemp("chat")
    data = root / "dd"
    write_dialogues(data, "train", [dialogue_line(conversation(n, 4)) for n in range(60)])
    write_dialogues(data, "validation", [dialogue_line(conversation(60 + n, 3)) for n in range(4)])
    write_dialogues(data, "test", [dialogue_line(talk) for talk in TEST_TALKS])
    cfg = compose_config(
        [
            "~logger", "callbacks.progress_bar.refresh_rate=0", "extras.print_config=false",
            "callbacks.model_summary.max_depth=0", "task=dailydialog", "task.data.source=local",
            f"task.data.dir={data}", "task.data.tokenizer.vocab_size=36", "task.data.tokenizer.pairs=500",
            "model=tiny", "trainer.max_steps=20", "test=false", "decode.max_len=12",
            f"paths.data_dir={root / 'cache'}",
        ],
        root / "run",
    )  # fmt: skip
    train(cfg)
    (best,) = (root / "run" / "checkpoints").glob("epoch_*.ckpt")
    return best, root


def test_replies_to_a_file_of_conversations_are_what_evaluation_decodes(trained, tmp_path):
    best, root = trained
    evaluated(best, tmp_path / "eval", "decode.strategy=greedy", f"paths.data_dir={root / 'cache'}")
    contexts = [talk[:t] for talk in TEST_TALKS for t in range(1, len(talk))]  # corpus order
    talks = tmp_path / "talks.txt"
    talks.write_text("".join(f" {END_OF_TURN} ".join(turns) + "\n" for turns in contexts))
    out = tmp_path / "replies.txt"
    chat([f"ckpt_path={best}", f"input={talks}", f"output={out}", "decode.strategy=greedy"])
    assert out.read_text() == (tmp_path / "eval" / "hypotheses" / "test.txt").read_text()


def test_the_terminal_form_answers_each_turn_until_an_empty_line(trained, monkeypatch, capsys):
    best, _ = trained
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\nhow are you?\n\nnot read\n"))
    chat([f"ckpt_path={best}", "decode.strategy=greedy"])
    replies = capsys.readouterr().out.splitlines()
    assert len(replies) == 2 and all(line.startswith("model: ") for line in replies)


def test_a_translation_or_probe_checkpoint_is_refused_in_one_sentence(tmp_path):
    from attnlab.runner.checkpoints import AtomicCheckpointIO
    from attnlab.stored import RECORD_KEY

    path = tmp_path / "probe.ckpt"
    config = {"task": {"name": "probe", "data": {}}, "paths": {"root_dir": str(tmp_path)}}
    record = {"overrides": [], "config": config}
    checkpoint = {RECORD_KEY: record, "state_dict": {}, "hyper_parameters": {}}
    AtomicCheckpointIO().save_checkpoint(checkpoint, path)
    with pytest.raises(ConfigError, match="chat needs a dialogue checkpoint"):
        chat([f"ckpt_path={path}"])


def test_an_exported_model_replies_as_its_checkpoint(trained, tmp_path, monkeypatch, capsys):
    from attnlab.commands.cli import main

    best, _ = trained
    exported = tmp_path / "export"
    main(["export", f"ckpt_path={best}", f"out={exported}"])
    capsys.readouterr()
    replies = []
    for model in (best, exported):
        monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\nhow are you?\n\n"))
        chat([f"ckpt_path={model}", "decode.strategy=greedy"])
        replies.append(capsys.readouterr().out)
    assert replies[0] == replies[1] and replies[0].count("model: ") == 2


def test_replies_written_through_a_link_onto_the_conversations_are_refused(trained, tmp_path):
    best, _ = trained
    talks = tmp_path / "talks.txt"
    talks.write_text("hello there __eou__ how are you? __eou__\n")
    replies = tmp_path / "replies.txt"
    os.symlink(talks, replies)

    refused = attnlab("chat", f"ckpt_path={best}", f"input={talks}", f"output={replies}")

    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"attnlab: output={replies} is the file chat reads as input={talks} (links followed): "
        "writing it would lose that file; pass output=<another file>, or leave output out to "
        "write to standard output"
    )
    assert talks.read_text() == "hello there __eou__ how are you? __eou__\n"


@pytest.mark.parametrize("form", [[], ["input=-"]], ids=["terminal", "input=-"])
def test_standard_input_closed_is_one_sentence(trained, form):
    best, _ = trained
    closed = attnlab("chat", f"ckpt_path={best}", *form, stdin_closed=True)
    assert closed.returncode == 1
    assert closed.stderr.strip() == (
        "attnlab: chat reads standard input, and this process has none (it was closed): pass "
        "input=<a file>, or give it a terminal, a pipe or < file"
    )
    assert closed.stdout == ""
