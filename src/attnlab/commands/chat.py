"""`attnlab chat ckpt_path=... [input=<file or ->] [output=<file or ->] [decode.*]`: talk to a
trained dialogue model.

Without `input`, a conversation in the terminal: each line typed is a turn, the model
answers it, and an empty line (or end of input) ends the conversation. With `input`, one
conversation a line, its turns ended by `__eou__` as DailyDialog writes them; the model's
reply to each conversation's last turn is written, one a line, in order.

The model sees what it saw in training (attnlab.tasks.seq2seq.dialogue): turns normalized, the last
`task.data.context_turns` turns of the conversation, each after its speaker's marker, cut
from the left to the run's `task.data.batching.max_eval_len` tokens. The run's decode settings apply
unless `decode.*` changes them (attnlab.commands.translate lists them); sampling draws from one
generator seeded by `decode.seed`, so a seed gives the same replies again.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import torch

from attnlab.commands.files import STANDARD, standard_input
from attnlab.commands.translate import (
    DEFAULT_MAX_TOKENS,
    decoded,
    evaluation_cut,
    requested,
    stored_data,
    write_output,
)
from attnlab.config.build import current
from attnlab.data.text import read_lines
from attnlab.data.tokenizer import VOCABULARY_KEY
from attnlab.errors import ConfigError
from attnlab.stored import load_system, nested
from attnlab.tasks.seq2seq.dialogue import END_OF_TURN, examples, normalize

DIALOGUE_DATA = "attnlab.tasks.seq2seq.dialogue.DialogueDataModule"


class Chat:
    """A dialogue model ready to answer conversations (lists of turns)."""

    def __init__(self, args: list[str]) -> None:
        from attnlab.tasks.seq2seq.system import Seq2SeqSystem

        self.settings, decode = requested(args, "chat")

        def is_dialogue(task: dict[str, Any]) -> bool:
            return current(nested(task, "data").get("_target_")) == DIALOGUE_DATA

        wanted = "a dialogue checkpoint (a run of task=chitchat or dailydialog)"
        path = str(self.settings["ckpt_path"])
        self.system = load_system(
            path, Seq2SeqSystem, (is_dialogue, wanted), VOCABULARY_KEY, "chat"
        )
        self.config = replace(self.system.decode_config, **decode)
        data = stored_data(self.system)
        self.context_turns = int(data["context_turns"])
        self.cut = evaluation_cut(self.system)
        self.generator = torch.Generator().manual_seed(self.config.seed)

    def context(self, turns: list[str]) -> list[int]:
        """The ids of the context the model answers: as training built it."""
        conversation = (*(normalize(turn) for turn in turns), "")
        *_, (context, _) = examples(conversation, self.context_turns)
        ids = self.system.tokenizers.src.encode(context)[-self.cut :]
        return [*ids, self.system.eos_id]

    def replies(self, conversations: list[list[str]]) -> list[str]:
        ids = [self.context(turns) for turns in conversations]
        max_tokens = self.settings.get("max_tokens", DEFAULT_MAX_TOKENS)
        return decoded(self.system, ids, self.config, max_tokens, self.generator)


def conversations_of(source: str) -> list[list[str]]:
    """One conversation a line, its turns ended by __eou__ (a last turn may go without)."""
    if source == STANDARD:
        lines = [line.strip() for line in standard_input("chat")]
    elif Path(source).is_file():
        lines = list(read_lines(Path(source)))
    else:
        raise ConfigError(
            f"input={source} is not a file: pass a text file, or - for standard input"
        )
    return [[t.strip() for t in line.split(END_OF_TURN) if t.strip()] or [""] for line in lines]


def typed(stdin: TextIO) -> str:
    """The next turn from the terminal (or a pipe); "" at an empty line or the end of input."""
    try:
        return (input("you: ") if stdin.isatty() else stdin.readline()).strip()
    except EOFError:
        return ""


def chat(args: list[str]) -> None:
    """`attnlab chat` (the module docstring)."""
    bot = Chat(args)
    if "input" in bot.settings:
        replies = bot.replies(conversations_of(str(bot.settings["input"])))
        write_output(str(bot.settings.get("output", STANDARD)), replies)
        return
    stdin = standard_input("chat")
    print("(an empty line ends the conversation)", file=sys.stderr)
    turns: list[str] = []
    while line := typed(stdin):
        (reply,) = bot.replies([[*turns, line]])
        turns += [line, reply]
        print(f"model: {reply}", flush=True)
