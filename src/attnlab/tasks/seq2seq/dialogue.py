"""Dialogue data: conversations -> (context, response) pairs for an encoder-decoder.

Sources (`source`):
  chitchat  the BYU Chit-Chat corpus shipped by the PyPI package chitchat-dataset (offline):
            each conversation is a list of turns, a turn the utterances of one sender, which
            are joined into one text; conversations with other than two speakers are dropped.
  local     DailyDialog files `{dir}/dialogues.{split}.txt` (train, and whichever of
            validation and test exist): one dialogue a line, each turn ended by `__eou__`.
  hub       a Hugging Face dataset (`dataset`, `revision`) with DailyDialog's `dialog` column
            (attnlab.data.hub: an unreachable hub stops at once, naming the local source).

Normalization, the same for contexts, references and generated responses: whitespace
collapsed, and the space DailyDialog puts before punctuation removed ("day , right ?" ->
"day, right?").

Conversations: empty turns are dropped; conversations with fewer than `min_turns` turns, and
exact duplicates of an earlier conversation, are dropped (every count logged). A source with
train, validation and test splits of its own (DailyDialog's three files, or the hub's) keeps
them as they are; a test conversation that repeats a training one is dropped as a duplicate.
Otherwise (Chit-Chat, which has no splits; local files without dialogues.test.txt: said in a
warning) the conversations are pooled, shuffled with `data_seed` and split by conversation
(`valid_share`, `test_share` of them), so no conversation is in two splits. `data_seed` is
fixed across run seeds: runs of every seed share the split, the tokenizer and the test set,
and differ in initialization and batch order (`seed`) only.

Examples: every turn after the first is a response; its context is the `context_turns` turns
before it, each after its speaker's marker (<a> for the conversation's first speaker, <b>
for the other; SentencePiece keeps them whole). Contexts longer than `max_len` tokens are cut
from the left (their latest turns kept), not dropped. Tokenizers, token caches and batching
are the sequence-to-sequence data layer's (attnlab.tasks.seq2seq.data).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.config.values import require_counts
from attnlab.data.corpus import SPLITS, Pair
from attnlab.data.digest import file_digest
from attnlab.data.hub import HUB_SPLIT_NAMES, load_hub
from attnlab.data.text import read_lines
from attnlab.errors import ConfigError
from attnlab.tasks.seq2seq.data import Seq2SeqDataModule

log = logging.getLogger(__name__)

SOURCES = ("chitchat", "local", "hub")
SPEAKERS = ("<a>", "<b>")  # the markers of the first and the second speaker
END_OF_TURN = "__eou__"
MISSPELT_END = re.compile(r"_+\s*eou|eou\s*_+", re.IGNORECASE)  # __eou, eou__, __EOU__
Conversation = tuple[str, ...]
SPLIT_NAMES = {"train": "train", "valid": "validation", "test": "test"}  # as DailyDialog's files
BEFORE_PUNCTUATION = re.compile(r" (?=[,.!?;:%)])")


def normalize(text: str) -> str:
    """Whitespace collapsed, no space before punctuation (see the module docstring)."""
    return BEFORE_PUNCTUATION.sub("", " ".join(text.split()))


# conversations by split (the source's own: train, and valid and test where it has them),
# identity, description
Read = tuple[dict[str, list[Conversation]], dict[str, Any], str]


def chitchat_conversations(digests: Path) -> Read:
    """The two-speaker conversations of chitchat-dataset, their identity and description."""
    try:
        import chitchat_dataset
    except ImportError:
        raise ConfigError(
            "task.data.source=chitchat needs the chitchat-dataset package (pip install "
            "chitchat-dataset==0.9.0)"
        ) from None
    data = chitchat_dataset.Dataset()
    conversations = []
    for record in data.values():
        turns = record["messages"]
        if len({utterance["sender"] for turn in turns for utterance in turn}) == 2:
            conversations.append(tuple(" ".join(u["text"] for u in turn) for turn in turns))
    dropped = len(data) - len(conversations)
    log.info("chitchat: dropped %d conversations without exactly two speakers", dropped)
    identity = {"source": "chitchat", "sha256": file_digest(Path(data.path), digests)}
    return {"train": conversations}, identity, f"chitchat-dataset {data.path}"


def dailydialog_line(line: str, path: Path, number: int) -> Conversation:
    """The turns of one DailyDialog line (each ended by __eou__)."""
    if END_OF_TURN not in line:
        raise ConfigError(
            f"{path} line {number} has no {END_OF_TURN}: a DailyDialog line is one dialogue "
            f"whose turns each end with {END_OF_TURN}; fix or remove the line"
        )
    *turns, after = (turn.strip() for turn in line.split(END_OF_TURN))
    if after:
        raise ConfigError(
            f"{path} line {number} ends with a turn without {END_OF_TURN} ({after[:40]!r}): "
            f"end every turn with {END_OF_TURN}, or remove the text"
        )
    for turn in turns:
        if misspelt := MISSPELT_END.search(turn):
            raise ConfigError(
                f"{path} line {number} has {misspelt[0]!r} inside a turn: a misspelt "
                f"{END_OF_TURN} would merge two turns into one; fix the line"
            )
    return (*turns, "")


def dailydialog_files(directory: str | None, digests: Path) -> Read:
    """The dialogues of `{directory}/dialogues.{train,validation,test}.txt`, by split."""
    hint = (
        "pass task.data.dir=<directory of DailyDialog's dialogues.train.txt (and, optionally, "
        "dialogues.validation.txt and dialogues.test.txt): one dialogue a line, each turn "
        f"ended by {END_OF_TURN}>"
    )
    if directory is None:
        raise ConfigError(f"task.data.source=local needs a directory: {hint}")
    root = Path(directory).expanduser().resolve()
    files = {split: root / f"dialogues.{name}.txt" for split, name in SPLIT_NAMES.items()}
    files = {split: path for split, path in files.items() if path.is_file()}
    if not root.is_dir() or "train" not in files:
        raise ConfigError(f"task.data.dir={directory} has no dialogues.train.txt: {hint}")
    conversations = {
        split: [
            dailydialog_line(line, path, number)
            for number, line in enumerate(read_lines(path), 1)
            if line
        ]
        for split, path in files.items()
    }
    identity = {
        "source": "local",
        "sha256": [file_digest(path, digests) for path in files.values()],
    }
    found = ",".join(SPLIT_NAMES[split] for split in files)
    return conversations, identity, f"{root}/dialogues.{{{found}}}.txt"


def hub_conversations(dataset: str | None, revision: str | None, cache_dir: Path) -> Read:
    """The `dialog` column of every split of a hub dataset, by split."""
    if not dataset:
        raise ConfigError("task.data.source=hub needs task.data.dataset=<hub name>")
    hint = (
        "without network, pass task.data.source=local task.data.dir=<dir with dialogues.train.txt>"
    )
    data = load_hub(dataset, None, revision, cache_dir, hint)
    names = {split: name for split in SPLITS for name in HUB_SPLIT_NAMES[split] if name in data}
    if not names or "dialog" not in data[next(iter(names.values()))].column_names:
        raise ConfigError(
            f"{dataset!r} has no `dialog` column of turns in its splits ({list(data)}): "
            "check task.data.dataset"
        )
    conversations = {
        split: [tuple(turns) for turns in data[name]["dialog"]] for split, name in names.items()
    }
    identity = {"source": "hub", "dataset": dataset, "revision": revision}
    return conversations, identity, f"hub dataset {dataset}"


def read_conversations(
    source: str, directory: str | None, dataset: str | None, revision: str | None, cache: Path
) -> Read:
    if source not in SOURCES:
        raise ConfigError(f"task.data.source={source!r} is not one of: {', '.join(SOURCES)}")
    if source != "local" and directory is not None:
        raise ConfigError(
            f"task.data.dir={directory} is read only with task.data.source=local: add "
            "task.data.source=local to use those files"
        )
    if source == "chitchat":
        return chitchat_conversations(cache / "digests")
    if source == "local":
        return dailydialog_files(directory, cache / "digests")
    return hub_conversations(dataset, revision, cache / "hf")


def clean(
    conversations: list[Conversation], min_turns: int, seen: set[Conversation] | None = None
) -> list[Conversation]:
    """Normalized turns, empty ones dropped; short conversations dropped, and those already
    in `seen` (earlier in the list, or in the splits cleaned before with the same set)."""
    kept, seen = [], set() if seen is None else seen
    empty_turns = short = duplicates = 0
    for conversation in conversations:
        turns = tuple(normalize(turn) for turn in conversation)
        empty_turns += sum(1 for turn in turns if not turn)
        turns = tuple(turn for turn in turns if turn)
        if len(turns) < min_turns:
            short += 1
        elif turns in seen:
            duplicates += 1
        else:
            seen.add(turns)
            kept.append(turns)
    log.info(
        "conversations: kept %d; dropped %d empty turns, %d conversations of fewer than %d "
        "turns and %d duplicates", len(kept), empty_turns, short, min_turns, duplicates,
    )  # fmt: skip
    return kept


def split_conversations(
    conversations: list[Conversation], valid_share: float, test_share: float, seed: int
) -> dict[str, list[Conversation]]:
    """Conversations shuffled with `seed`, then cut into train, valid and test."""
    order = np.random.default_rng(seed).permutation(len(conversations))
    n_valid = round(valid_share * len(order))
    n_test = round(test_share * len(order))
    parts = {
        "valid": order[:n_valid],
        "test": order[n_valid : n_valid + n_test],
        "train": order[n_valid + n_test :],
    }
    return {split: [conversations[i] for i in sorted(rows)] for split, rows in parts.items()}


def examples(conversation: Conversation, context_turns: int) -> Iterator[tuple[str, str]]:
    """(context, response) for every turn after the first (see the module docstring)."""
    for t in range(1, len(conversation)):
        start = max(0, t - context_turns)
        context = " ".join(f"{SPEAKERS[j % 2]} {conversation[j]}" for j in range(start, t))
        yield context, conversation[t]


def given_splits(
    by_split: dict[str, list[Conversation]], min_turns: int
) -> dict[str, list[Conversation]]:
    """A source's own three splits, each cleaned; a conversation repeating one of an earlier
    split (train, then valid, then test) is dropped as a duplicate."""
    seen: set[Conversation] = set()
    return {split: clean(by_split[split], min_turns, seen) for split in SPLITS}


class DialogueCorpus:
    """The Corpus (attnlab.data.corpus) of one source's conversations, cleaned and split."""

    def __init__(
        self, read: Read, min_turns: int, context_turns: int, shares: tuple[float, float], seed: int
    ) -> None:
        by_split, identity, self.source = read
        self.given = set(by_split) == set(SPLITS)
        self.settings = {
            "conversations": identity, "min_turns": min_turns, "context_turns": context_turns,
            "shares": None if self.given else list(shares), "seed": None if self.given else seed,
        }  # fmt: skip
        if self.given:
            log.info("%s: its own train, validation and test splits, as given", self.source)
            self.conversations = given_splits(by_split, min_turns)
        else:
            pooled = [c for split in SPLITS for c in by_split.get(split, [])]
            if identity["source"] != "chitchat":  # Chit-Chat has no splits of its own
                log.warning(
                    "%s has no %s split: its %d conversations are pooled and split by "
                    "conversation, shares %s of them to validation and test (data_seed=%d)",
                    self.source, " or ".join(SPLIT_NAMES[s] for s in SPLITS if s not in by_split),
                    len(pooled), "/".join(map(str, shares)), seed,
                )  # fmt: skip
            self.conversations = split_conversations(clean(pooled, min_turns), *shares, seed)
        self.examples = {
            split: [pair for c in convs for pair in examples(c, context_turns)]
            for split, convs in self.conversations.items()
        }
        for split, convs in self.conversations.items():
            log.info(
                "%s: %d conversations, %d exchanges", split, len(convs), len(self.examples[split])
            )

    def identity(self, split: str) -> dict[str, Any]:
        return {**self.settings, "split": split}

    def describe(self, split: str) -> str:
        return f"{self.source} ({split} {'split' if self.given else 'share'})"

    def has(self, split: str) -> bool:
        return True

    def num_rows(self, split: str) -> int:
        return len(self.examples[split])

    def pairs(self, split: str, rows: np.ndarray | None = None) -> Iterator[Pair]:
        chosen = range(self.num_rows(split)) if rows is None else rows.tolist()
        for row in chosen:
            context, response = self.examples[split][row]
            yield row, context, response


class DialogueDataModule(Seq2SeqDataModule):
    """Conversations for an encoder-decoder; the options are task.data's (conf/task/*.yaml)."""

    def __init__(
        self,
        source: str,
        dir: str | None,
        dataset: str | None,
        revision: str | None,
        min_turns: int,
        context_turns: int,
        valid_share: float,
        test_share: float,
        tokenizer: Mapping[str, Any],
        batching: Mapping[str, Any],
        data_seed: int,
        seed: int,
        num_workers: int,
        cache_dir: str,
    ) -> None:
        require_counts("task.data", min_turns=min_turns, context_turns=context_turns)
        if min_turns < 2:
            raise ConfigError(
                f"task.data.min_turns={min_turns} must be at least 2: a response needs a turn before it"
            )
        for name, share in (("valid_share", valid_share), ("test_share", test_share)):
            if not 0 < share < 0.5:
                raise ConfigError(
                    f"task.data.{name}={share} must be a share of the conversations in (0, 0.5)"
                )
        cache = Path(cache_dir).expanduser().resolve()
        super().__init__(
            ("context", "response"), tokenizer, batching, cache, data_seed, seed, num_workers,
            user_symbols=SPEAKERS, cut_sources=True,
        )  # fmt: skip
        read = read_conversations(source, dir, dataset, revision, cache)
        shares = (valid_share, test_share)
        self.corpus = DialogueCorpus(read, min_turns, context_turns, shares, data_seed)
