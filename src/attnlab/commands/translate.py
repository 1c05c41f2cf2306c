"""`attnlab translate ckpt_path=... input=<file or -> [output=<file or ->] [decode.*] [max_tokens=N]`:
translate the lines of a file (or of standard input) with a trained translation model; no
reference is needed.

The checkpoint is read as tensors and plain data and its system rebuilt from its
hyperparameters, weights and tokenizers (attnlab.stored.load_system). Each line is read
as training reads data (attnlab.data.text: normalized, a UTF-8 error names the line), cut to
the run's `task.data.batching.max_eval_len` tokens as evaluation cuts it (said on stderr), and
translated with the run's decode settings unless `decode.*` says otherwise (strategy, beam,
top_k, top_p, temperature, seed, length_penalty, no_repeat_ngram, max_len). Lines are sorted
by length and batched so that a batch holds at most `max_tokens` source tokens times the
beam (4,096 by default); the translations come out in the input's order, one a line, to
`output` (default: standard output). Greedy decoding of a run's test sources gives the
hypotheses its evaluation wrote (a test checks it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnlab.commands.arguments import parse_setting
from attnlab.commands.files import STANDARD, check_output, standard_input
from attnlab.config.build import current
from attnlab.config.values import is_count
from attnlab.data.text import read_lines, text_line
from attnlab.data.tokenizer import VOCABULARY_KEY
from attnlab.decoding.encoder_decoder import DecodeConfig, generate
from attnlab.errors import ConfigError
from attnlab.files import write_text
from attnlab.stored import load_system, nested

if TYPE_CHECKING:
    from attnlab.tasks.seq2seq.system import Seq2SeqSystem

SETTINGS = ("ckpt_path", "input", "output", "max_tokens")
DECODE_SETTINGS = (
    "strategy", "beam", "top_k", "top_p", "temperature", "seed", "length_penalty",
    "no_repeat_ngram", "max_len",
)  # fmt: skip
TRANSLATION_DATA = "attnlab.tasks.seq2seq.translation.TranslationDataModule"
DEFAULT_MAX_TOKENS = 4096


def requested(args: list[str], program: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and the decode.* settings of `program`'s key=value arguments; an output
    that is one of the files they read is refused."""

    def known(key: str) -> bool:
        return key in SETTINGS or (key.startswith("decode.") and key[7:] in DECODE_SETTINGS)

    names = [*SETTINGS, *(f"decode.{name}" for name in DECODE_SETTINGS)]
    settings: dict[str, Any] = {}
    decode: dict[str, Any] = {}
    for arg in args:
        key, value = parse_setting(arg, program, names, ("ckpt_path", "input", "output"), known)
        (decode if key.startswith("decode.") else settings)[key.removeprefix("decode.")] = value
    if "ckpt_path" not in settings:
        raise ConfigError(
            f"{program} needs a model: pass ckpt_path=<run>/checkpoints/epoch_NNN.ckpt"
        )
    if not is_count(settings.get("max_tokens", DEFAULT_MAX_TOKENS)):
        raise ConfigError(f"max_tokens={settings['max_tokens']!r} must be a positive integer")
    read = {key: str(settings[key]) for key in ("input", "ckpt_path") if key in settings}
    instead = "pass output=<another file>, or leave output out to write to standard output"
    check_output("output", str(settings.get("output", STANDARD)), read, program, instead)
    return settings, decode


def batches(lengths: list[int], budget: int) -> Iterator[list[int]]:
    """Line indices, shortest first, in batches whose longest line times their size stays
    within `budget` tokens (a line longer than the budget alone in its batch)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    for index in order:
        if batch and lengths[index] * (len(batch) + 1) > budget:
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


def translate(args: list[str]) -> int:
    """Translate what `args` ask for; the number of lines translated. The settings are
    checked before Lightning is imported, so that a refusal comes at once."""
    settings, decode = requested(args, "translate")
    if "input" not in settings:
        raise ConfigError("translate needs text: pass input=<file, or - for standard input>")
    from attnlab.tasks.seq2seq.system import Seq2SeqSystem

    max_tokens = settings.get("max_tokens", DEFAULT_MAX_TOKENS)

    def is_translation(task: dict[str, Any]) -> bool:
        return current(nested(task, "data").get("_target_")) == TRANSLATION_DATA

    wanted = "a translation checkpoint (a run of task=multi30k, wmt or translation)"
    path = str(settings["ckpt_path"])
    system = load_system(path, Seq2SeqSystem, (is_translation, wanted), VOCABULARY_KEY, "translate")
    config = replace(system.decode_config, **decode)
    lines = read_input(str(settings["input"]))
    cut = evaluation_cut(system)
    ids = [system.tokenizers.src.encode(line) for line in lines]
    if long := sum(len(i) > cut for i in ids):
        print(f"attnlab: {long} lines cut to their first {cut} tokens", file=sys.stderr)
    ids = [[*i[:cut], system.eos_id] for i in ids]
    out = decoded(system, ids, config, max_tokens, torch.Generator().manual_seed(config.seed))
    write_output(str(settings.get("output", "-")), out)
    return len(lines)


def decoded(
    system: Seq2SeqSystem,
    ids: list[list[int]],
    config: DecodeConfig,
    max_tokens: int,
    generator: torch.Generator,
) -> list[str]:
    """The decoded text for each source (ids ending in EOS), in the sources' order: batched
    by at most `max_tokens` source tokens times the beam, shortest first."""
    beam = config.beam if config.strategy == "beam" else 1
    out: list[str] = [""] * len(ids)
    with torch.inference_mode():
        for batch in batches([len(i) for i in ids], max(1, max_tokens // beam)):
            src = torch.full((len(batch), max(len(ids[i]) for i in batch)), system.pad_id)
            for row, index in enumerate(batch):
                src[row, : len(ids[index])] = torch.tensor(ids[index])
            hypotheses = generate(
                system.net, src, src == system.pad_id, system.bos_id, system.eos_id, config,
                config.strategy, config.beam, generator,
            )  # fmt: skip
            for index, hypothesis in zip(batch, hypotheses, strict=True):
                out[index] = system.tokenizers.tgt.decode(hypothesis)
    return out


def stored_data(system: Seq2SeqSystem) -> dict[str, Any]:
    """The task.data settings the system's run was trained with (load_system keeps them)."""
    return nested(system.run_record, "config", "task", "data")


def evaluation_cut(system: Seq2SeqSystem) -> int:
    """Source tokens kept before EOS, as the run's evaluation cut them: its
    task.data.batching.max_eval_len (task.data.max_eval_len in runs before batching was a
    node), less one."""
    data = stored_data(system)
    cut = data.get("batching", data).get("max_eval_len")
    if not is_count(cut, 2):
        raise ConfigError(
            f"the checkpoint's run record has no usable task.data.batching.max_eval_len ({cut!r}): "
            "pass a checkpoint that attnlab's train.py wrote"
        )
    return int(cut) - 1


def read_input(source: str) -> list[str]:
    if source == STANDARD:
        stdin = Path("<standard input>")
        lines = standard_input("translate").buffer
        return [text_line(raw, stdin, n) for n, raw in enumerate(lines, 1)]
    if not Path(source).is_file():
        raise ConfigError(
            f"input={source} is not a file: pass a text file, or - for standard input"
        )
    return list(read_lines(Path(source)))


def write_output(target: str, lines: list[str]) -> None:
    text = "".join(f"{line}\n" for line in lines)
    if target == STANDARD:
        sys.stdout.write(text)
    else:  # whole or not at all, at the file a link names
        write_text(Path(target).resolve(), text)
