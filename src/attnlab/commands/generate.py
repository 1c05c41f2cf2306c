"""`attnlab generate ckpt_path=... [prompt=...] [max_new_tokens=N] [samples=N] [cache=false]
[decode.strategy=greedy|top_k|nucleus] [decode.top_k|top_p|temperature|seed=...]
[pe.scaling=linear|ntk|yarn pe.scaling_factor=... ...]` continues a prompt with a task=lm
checkpoint; the `pe.*` settings are those eval.py may change on a checkpoint (RoPE's
context extension), refused on a model whose pe has none. Its settings follow Hydra's
override grammar (quote a value holding characters the grammar reserves:
'prompt="O Romeo, Romeo!"'), but nothing is composed: no config, no output directory, no
interpolation. In the prompt, `\\n` and `\\t` stand for a line break and a tab. Defaults:
the run's `sample_prompt`, 200 new tokens or as many as a bounded positional encoding leaves
room for, one sample, the cache on, nucleus sampling with the run's decode settings
(attnlab.decoding.decoder_only continues the text). The
checkpoint is read as tensors and plain data only (attnlab.stored.read_checkpoint); the
model is rebuilt from its hyperparameters, its weights and its tokenizer.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TextIO

import attnlab.pe
from attnlab.commands.arguments import parse_setting
from attnlab.config.values import is_count
from attnlab.decoding.decoder_only import (
    check_strategy,
    continuations,
    counted,
    encode_prompt,
    streamed,
)  # fmt: skip
from attnlab.errors import ConfigError
from attnlab.pe.base import PositionalEncoding
from attnlab.runner.same_model import evaluation_options, with_settings
from attnlab.stored import load_system, nested

if TYPE_CHECKING:
    from attnlab.decoding.encoder_decoder import DecodeConfig
    from attnlab.tasks.lm.system import LMSystem

SETTINGS = ("ckpt_path", "prompt", "max_new_tokens", "samples", "cache")
DECODE_SETTINGS = ("strategy", "top_k", "top_p", "temperature", "seed")


def every_subclass(cls: type) -> list[type]:
    return [cls, *(c for sub in cls.__subclasses__() for c in every_subclass(sub))]


def pe_settings() -> list[str]:
    """The options any of attnlab's encodings lets generate change on a trained model."""
    for module in pkgutil.iter_modules(attnlab.pe.__path__):
        importlib.import_module(f"attnlab.pe.{module.name}")
    encodings = every_subclass(PositionalEncoding)
    return sorted({name for cls in encodings for name in cls.evaluation_options})


PE_SETTINGS = pe_settings()
TEXT_SETTINGS = ("ckpt_path", "prompt")  # read as written: prompt=true is the text "true"
SAMPLE_RULE = "\n" + "-" * 40 + "\n"  # between the texts of samples=N > 1
ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unknown_symbols(system: LMSystem, prompt: str) -> int:
    """How many ids of `prompt` are the model's unknown symbol."""
    tokenizer = system.tokenizer
    assert tokenizer is not None
    return int((encode_prompt(tokenizer, prompt) == tokenizer.unk_id).sum())


@dataclass(frozen=True)
class Request:
    """What `attnlab generate` is asked for (the module docstring)."""

    ckpt_path: str
    prompt: str | None = None  # None: the run's sample_prompt
    max_new_tokens: int | None = None  # None: DEFAULT_NEW_TOKENS, or what the positions allow
    samples: int = 1
    cache: bool = True
    decode: dict[str, Any] = field(default_factory=dict)  # decode.* settings given
    pe: dict[str, Any] = field(default_factory=dict)  # pe.* settings given, keys as written

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "samples"):
            value = getattr(self, name)
            if value is not None and not is_count(value):
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if not isinstance(self.cache, bool):
            raise ConfigError(f"cache={self.cache!r} must be true or false")


def unescaped(text: str) -> str:
    """`text` with \\n, \\t and \\\\ written out as a line break, a tab and a backslash."""
    return re.sub(r"\\([nt\\])", lambda match: ESCAPES[match.group(1)], text)


def generate_setting(arg: str) -> tuple[str, Any]:
    def known(key: str) -> bool:
        return (
            key in SETTINGS
            or (key.startswith("decode.") and key[7:] in DECODE_SETTINGS)
            or (key.startswith("pe.") and key.rsplit(".", 1)[1] in PE_SETTINGS)
        )

    names = [*SETTINGS, *(f"decode.{name}" for name in DECODE_SETTINGS),
             *(f"pe.{name}" for name in PE_SETTINGS)]  # fmt: skip
    return parse_setting(arg, "generate", names, TEXT_SETTINGS, known)


def parse_request(args: list[str]) -> Request:
    """The request of `attnlab generate`'s key=value arguments."""
    settings: dict[str, Any] = {}
    decode: dict[str, Any] = {}
    pe: dict[str, Any] = {}
    for arg in args:
        key, value = generate_setting(arg)
        if key.startswith("decode."):
            decode[key[7:]] = value
        elif key.startswith("pe."):
            pe[key] = value
        else:
            settings[key] = value
    if "ckpt_path" not in settings:
        raise ConfigError(
            "generate needs the language model to continue the prompt with: pass "
            "ckpt_path=<run>/checkpoints/last.ckpt"
        )
    if "prompt" in settings:
        settings["prompt"] = unescaped(settings["prompt"])
    if "strategy" in decode:
        check_strategy(decode["strategy"])
    return Request(**settings, decode=decode, pe=pe)


def with_pe_settings(path: str, architecture: Any, settings: dict[str, Any]) -> Any:
    """The stored `architecture` with the flattened pe `settings` set, or a ConfigError where
    its pe has no such evaluation option (its class's `evaluation_options`)."""
    changeable = evaluation_options(architecture if isinstance(architecture, dict) else {})
    if refused := [key for key in settings if key not in changeable]:
        pe = nested(architecture, "pe").get("name")
        allowed = f"only {', '.join(changeable)}" if changeable else "none"
        raise ConfigError(
            f"{', '.join(refused)} cannot be set on {path}: its model has pe={pe}, whose "
            f"settings generate may change are {allowed}"
        )
    return with_settings(architecture, settings)


def load_language_model(path: str, pe_settings: dict[str, Any] | None = None) -> LMSystem:
    """The language model system a checkpoint holds, in eval mode, on the CPU (as
    `load_system` rebuilds it), with `pe_settings` ({"pe.scaling": "yarn", ...}) set in its
    architecture."""
    from attnlab.data.tokenizer import TOKENIZER_KEY
    from attnlab.tasks.lm.system import LMSystem

    def changes(stored: dict[str, Any]) -> dict[str, Any]:
        if not pe_settings:
            return {}
        return {"architecture": with_pe_settings(path, stored.get("architecture"), pe_settings)}

    def is_lm(task: dict[str, Any]) -> bool:
        return task.get("name") == "lm"

    return load_system(
        path,
        LMSystem,
        (is_lm, "a language model checkpoint (a run of task=lm)"),
        TOKENIZER_KEY,
        "generate",
        changes,
    )


def request_of(args: list[str]) -> tuple[Request, LMSystem, str, DecodeConfig]:
    """What `args` ask for: the request, the model, the prompt and the decoding settings
    (a prompt's symbols outside the vocabulary are said on standard error)."""
    request = parse_request(args)
    system = load_language_model(request.ckpt_path, request.pe)
    prompt = system.sample_prompt if request.prompt is None else request.prompt
    config = replace(system.decode_config, **{"strategy": "nucleus", **request.decode})
    if unknown := unknown_symbols(system, prompt):
        print(
            f"attnlab: {counted(unknown, 'symbol')} of the prompt not in the model's "
            "vocabulary, read as its unknown symbol",
            file=sys.stderr,
        )
    return request, system, prompt, config


def generate(args: list[str]) -> list[str]:
    """`attnlab generate`: the texts (prompt and continuation) that `args` ask for."""
    request, system, prompt, config = request_of(args)
    return continuations(
        system.net, system.tokenizer, prompt, request.max_new_tokens, request.samples, config,
        request.cache,
    )  # fmt: skip


def print_generated(args: list[str], out: TextIO) -> None:
    """Print the texts `args` ask for to `out`: one sample as its tokens are drawn, several
    (drawn together) when all are, between SAMPLE_RULE lines."""
    request, system, prompt, config = request_of(args)
    if request.samples > 1:
        texts = continuations(
            system.net, system.tokenizer, prompt, request.max_new_tokens, request.samples,
            config, request.cache,
        )  # fmt: skip
        print(SAMPLE_RULE.join(texts), file=out)
        return
    pieces = streamed(
        system.net, system.tokenizer, prompt, request.max_new_tokens, config, request.cache
    )
    out.write(prompt)
    for piece in pieces:
        out.write(piece)
        out.flush()
    out.write("\n")
