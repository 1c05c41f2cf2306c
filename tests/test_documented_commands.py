"""Every command in a ```bash fence of README.md, CONTRIBUTING.md and docs/*.md works as
written, checked without running it:

- `python train.py ...` and `python eval.py ...` pass attnlab's preflight (every group option
  of a `-m` sweep exists) and compose with the first value of each sweep, and the attention
  parts build from the composed options (an option the pe does not take is refused);
- `attnlab <command> ...` parses with the CLI's own parser, and its key=value settings with
  the command's own reader (`tokenize` takes train.py's settings, so it composes);
- `make <target>` names a target of the Makefile;
- anything else (a git hook, an upload, a benchmark) is in NOT_RUN with the reason, and skips.

A placeholder (`<run>`, `<time>`, `...`) stands for the value PLACEHOLDERS gives it: composing
reads no file, so any path does. A command that reads a checkpoint (eval.py, a resume, attnlab
generate, translate, chat, export) reads one of the run trained by the nearest `python
train.py` above it in its fence (none: the default config), and must fit that run: a sweep's
job keeps no last.ckpt, a run with `test: false` has no test split to evaluate, and no length
asked of it (an evaluation length, a prompt and its new tokens) passes its positions.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, compose_config, make_parts
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from attnlab.commands.cli import export_settings, parser
from attnlab.commands.generate import parse_request
from attnlab.commands.translate import TRANSLATION_DATA, requested
from attnlab.runner.preflight import check_setting_keys

TOPICS = sorted((ROOT / "docs").glob("*.md"))  # docs/results/ holds studies, not commands
PAGES = ("README.md", "CONTRIBUTING.md", *(f"docs/{page.name}" for page in TOPICS))

# what each placeholder of the pages stands for
PLACEHOLDERS = {
    "<time>": "2025-01-01_12-00-00",
    "<run>": "logs/lm/runs/2025-01-01_12-00-00",
    "...": "logs/probe/runs/2025-01-01_12-00-00",
    "<dir>": "data/fr-en",
    "<text file>": "data/input.txt",
    "<dir of {train,valid,test}.txt>": "data/wikitext",
    "<corpus>": "data/corpus",
}

# commands the test does not check, by how they start, and why
NOT_RUN = {
    "pre-commit install": "it installs a git hook into this checkout",
    "wandb sync": "it needs network: it uploads runs to W&B",
    "python benchmarks/": "a benchmark: minutes of measurement (tests/test_benchmarks.py runs them small)",
}

FLAGS_WITH_A_VALUE = ("--cfg",)  # Hydra's flags that take the next word
CHECKPOINT_COMMANDS = {"generate", "translate", "chat", "export"}
DATA_OF = {  # the data module of the runs whose checkpoints a command takes
    "generate": "attnlab.tasks.lm.data.LMDataModule",
    "translate": TRANSLATION_DATA,
    "chat": "attnlab.tasks.seq2seq.dialogue.DialogueDataModule",
}


@dataclass(frozen=True)
class Command:
    """A documented command: where it is, its words as the shell splits them, and the
    training command above it in its fence (whose run its checkpoint is)."""

    page: str
    line: int
    text: str
    trained: Command | None
    part: int = 0  # its place in a list of commands on one line (`make install && make train`)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}" + (f"+{self.part}" if self.part else "")

    @property
    def words(self) -> list[str]:
        """The words of the command the page documents (after what a pipe feeds it)."""
        words = shlex.split(substituted(self.text), comments=True)
        return words[len(words) - words[::-1].index("|") :] if "|" in words else words


def substituted(line: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    return line


def fences(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, the line number of its first line, lines) of each fenced block of `text`."""
    lines = text.splitlines()
    opening = None
    for number, line in enumerate(lines, 1):
        if not line.startswith("```"):
            continue
        if opening is None:
            opening = number
        else:
            yield lines[opening - 1][3:].strip(), opening + 1, lines[opening : number - 1]
            opening = None


def joined(lines: list[str], start: int) -> Iterator[tuple[int, str]]:
    """(line number, line) of each command of a fence, a `\\` continuation joined to it."""
    pending, first = "", start
    for number, line in enumerate(lines, start):
        if not pending:
            first = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield first, pending + line
        pending = ""


def commands_of(page: str, text: str) -> list[Command]:
    """The commands of `text`'s bash fences, those a line lists with `&&` each one; blank and
    comment-only lines hold none."""
    commands = []
    for language, start, lines in fences(text):
        if language != "bash":
            continue
        trained = None
        for number, line in joined(lines, start):
            for part, text in enumerate(re.split(r"\s&&\s", line)):
                if not shlex.split(text, comments=True):
                    continue
                command = Command(page, number, text.strip(), trained, part)
                commands.append(command)
                words = command.words
                if words[:2] == ["python", "train.py"] and not resumed(words):
                    trained = command
    return commands


def resumed(words: list[str]) -> bool:
    return any(w.startswith(("run_dir=", "ckpt_path=")) for w in words)


COMMANDS = [c for page in PAGES for c in commands_of(page, (ROOT / page).read_text())]


def not_run(words: list[str]) -> str | None:
    text = " ".join(words)
    return next((why for start, why in NOT_RUN.items() if text.startswith(start)), None)


def overrides(words: list[str]) -> list[str]:
    """The Hydra arguments of a command's words, flags and their values dropped."""
    kept, skip = [], False
    for word in words:
        if not skip and not word.startswith("-"):
            kept.append(word)
        skip = word in FLAGS_WITH_A_VALUE
    return kept


def first_values(args: list[str]) -> list[str]:
    """`args`, each sweep (`pe=rope,t5`) replaced by its first value (`pe=rope`)."""
    chosen = []
    for arg, override in zip(args, OverridesParser.create().parse_overrides(args), strict=True):
        if override.is_sweep_override():
            arg = f"{arg.split('=', 1)[0]}={next(override.sweep_string_iterator())}"
        chosen.append(arg)
    return chosen


def composed(args: tuple[str, ...], config: str, stored: tuple[str, ...] = ()) -> DictConfig:
    """The config of `args` (flags included) through attnlab's preflight and Hydra's compose,
    each sweep at its first value; its attention parts are built to check their options."""
    chosen = tuple(first_values(overrides(list(args))))
    if chosen != args:  # flags: the preflight checks every option of every sweep
        check_setting_keys(list(args), config)
    return composed_once(chosen, config, stored)


@functools.cache
def composed_once(args: tuple[str, ...], config: str, stored: tuple[str, ...]) -> DictConfig:
    """The config of `args` (no flags, no sweeps), once for every command that composes it."""
    chosen = check_setting_keys(list(args), config, stored)
    cfg = compose_config(chosen, Path("composed"), config)  # composing writes nothing there
    positions(cfg)
    return cfg


def positions(cfg: DictConfig) -> int | None:
    """The positions the run's attention has (its pe's or synthesizer's bound), or None."""
    nodes = [OmegaConf.to_container(cfg[g], resolve=True) for g in ("pe", "norm", "synthesizer")]
    return make_parts(*nodes).max_len


def run_overrides(command: Command) -> tuple[str, ...]:
    """The overrides of the run whose checkpoint `command` reads, as its checkpoint stores
    them (a sweep's first job)."""
    return tuple(first_values(overrides(command.trained.words[2:]))) if command.trained else ()


def setting(args: list[str], key: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"{key}=")), None)


def check_checkpoint(command: Command, args: list[str], run: DictConfig) -> None:
    """A checkpoint of a sweep's job is its best one: a finished job drops last.ckpt."""
    path = setting(args, "ckpt_path") or ""
    sweep = command.trained is not None and "-m" in command.trained.words
    if sweep and path.endswith("last.ckpt") and run.callbacks.latest.keep_when_done is not True:
        raise AssertionError(
            f"ckpt_path={path}: a finished job of the sweep above keeps no last.ckpt "
            "(callbacks.latest.keep_when_done): read its checkpoints/epoch_NNN.ckpt"
        )


def check_length(asked: int, what: str, run: DictConfig) -> None:
    bound = positions(run)
    if bound is not None and asked > bound:
        raise AssertionError(
            f"{what} asks for {asked} positions, and the run's attention has {bound}: use an "
            "encoding without a position bound (pe=alibi '~pe.max_len'), or ask for fewer"
        )


def check_train(command: Command) -> None:
    """A resume (`run_dir=`) is the run above's overrides, then the command line's."""
    args = tuple(a for a in command.words[2:] if not a.startswith("run_dir="))
    run = run_overrides(command) if resumed(command.words) else ()
    composed((*run, *args), "train", run)


def check_eval(command: Command) -> None:
    """eval.py composes the run's overrides, then its own (attnlab.runner.resume)."""
    run, args = run_overrides(command), command.words[2:]
    cfg = composed((*run, *args), "eval", run)
    check_checkpoint(command, args, cfg)
    if not cfg.test and cfg.split != "val":
        raise AssertionError(
            "the run is set test: false (its data has no test split): pass split=val"
        )
    if setting(args, "task.data.eval_lengths") is not None:
        check_length(max(cfg.task.data.eval_lengths), "task.data.eval_lengths", cfg)


def check_attnlab(command: Command) -> None:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parsed = parser().parse_args(command.words[1:])
    except SystemExit:
        raise AssertionError(f"attnlab's parser refuses it: {errors.getvalue().strip()}") from None
    check_settings(command, parsed)


def check_settings(command: Command, parsed: argparse.Namespace) -> None:
    """The key=value settings of a settings command, read by the command's own reader, and
    the run its checkpoint comes from."""
    name, settings = parsed.command, getattr(parsed, "settings", [])
    if name == "tokenize":
        composed(tuple(settings), "train")
        return
    if name not in CHECKPOINT_COMMANDS:
        return
    if name == "generate":
        request = parse_request(settings)
    elif name == "export":
        export_settings(settings)
    else:
        requested(settings, name)
    if command.trained is None:
        return
    run = composed(run_overrides(command), "train")
    check_checkpoint(command, settings, run)
    if name in DATA_OF and run.task.data._target_ != DATA_OF[name]:
        raise AssertionError(f"attnlab {name} takes no checkpoint of the run above")
    if name == "generate" and request.max_new_tokens is not None:
        prompt = run.task.system.sample_prompt if request.prompt is None else request.prompt
        asked = len(prompt) + request.max_new_tokens - 1  # a token a character at most
        check_length(asked, "the prompt and max_new_tokens", run)


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_-]+):", text, re.MULTILINE))


def check_make(command: Command) -> None:
    targets = [w for w in command.words[1:] if "=" not in w and not w.startswith("-")]
    missing = sorted(set(targets) - makefile_targets())
    assert not missing, f"the Makefile has no target {', '.join(missing)}"


CHECKS = {
    ("python", "train.py"): check_train,
    ("python", "eval.py"): check_eval,
    ("attnlab",): check_attnlab,
    ("make",): check_make,
}


def check(command: Command) -> None:
    """Raise where `command` would not work as written (the module docstring)."""
    words = command.words
    unknown = [w for w in words if "<" in w or ">" in w]
    assert not unknown, f"{' '.join(unknown)}: a placeholder PLACEHOLDERS does not list"
    for start, checked in CHECKS.items():
        if tuple(words[: len(start)]) == start:
            checked(command)
            return
    raise AssertionError(f"{words[0]}: neither checked here nor listed in NOT_RUN with a reason")


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_each_documented_command_works_as_written(command: Command) -> None:
    reason = not_run(command.words)
    if reason is not None:
        pytest.skip(reason)
    check(command)


def test_each_reason_not_to_run_a_command_is_used():
    used = {start for c in COMMANDS for start in NOT_RUN if " ".join(c.words).startswith(start)}
    assert used == set(NOT_RUN), f"NOT_RUN lists commands no page has: {set(NOT_RUN) - used}"


def test_every_fence_names_its_language_and_no_command_is_outside_one():
    for page in PAGES:
        text = (ROOT / page).read_text()
        untagged = [start - 1 for language, start, _ in fences(text) if not language]
        assert not untagged, f"{page}: the fences opening on lines {untagged} name no language"
        inside = {n for _, start, lines in fences(text) for n in range(start, start + len(lines))}
        loose = [
            number for number, line in enumerate(text.splitlines(), 1)
            if number not in inside and re.match(r" {4,}(python|attnlab|make) ", line)
        ]  # fmt: skip
        assert not loose, f"{page}: an indented command outside a ```bash fence, lines {loose}"


def snippet(text: str) -> Command:
    """The last command of a bash fence holding `text`."""
    return commands_of("snippet", f"```bash\n{text}\n```\n")[-1]


def test_a_fence_joins_continued_lines_and_drops_comments():
    command = snippet('python train.py pe=rope \\\n    seed=1   # a comment, "quoted"')
    assert command.words == ["python", "train.py", "pe=rope", "seed=1"]
    assert command.line == 2  # the fence opens on line 1


@pytest.mark.parametrize(
    "text, refusal",
    [
        ("python train.py pe=ropee", "did you mean pe=rope"),
        ("python train.py -m pe=rope,ropee", "did you mean pe=rope"),
        ("python train.py model.dmodel=64", "not a setting"),
        ("python train.py experiment=lm_shakespeare_char pe=alibi", "no option max_len"),
        ("attnlab comparre logs", "parser refuses"),
        ("attnlab generate prompt=hi", "needs the language model"),
        ("make tset", "no target tset"),
        ("torchrun train.py", "nor listed in NOT_RUN"),
        ("python train.py ckpt_path=<checkpoint>", "placeholder"),
        (
            "python train.py experiment=lm_shakespeare_char\n"
            "attnlab generate ckpt_path=<run>/checkpoints/last.ckpt prompt=ROMEO: max_new_tokens=300",
            "the run's attention has 64",
        ),
        (
            "python train.py experiment=lm_shakespeare_char\n"
            "python eval.py ckpt_path=<run>/checkpoints/last.ckpt split=val "
            "task.data.eval_lengths=[64,256]",
            "the run's attention has 64",
        ),
        (
            "python train.py experiment=lm_shakespeare_char pe=alibi '~pe.max_len'\n"
            "python eval.py ckpt_path=<run>/checkpoints/last.ckpt",
            "pass split=val",
        ),
        (
            "python train.py -m task=chitchat seed=1,2\n"
            "python eval.py ckpt_path=<run>/checkpoints/last.ckpt",
            "keeps no last.ckpt",
        ),
        (
            "python train.py task=multi30k\nattnlab generate ckpt_path=<run>/checkpoints/last.ckpt",
            "takes no checkpoint of the run above",
        ),
    ],
)
def test_a_command_that_would_not_work_is_named_with_why(text: str, refusal: str) -> None:
    with pytest.raises(Exception, match=re.escape(refusal)):
        check(snippet(text))
