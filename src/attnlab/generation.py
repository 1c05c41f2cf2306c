"""Continuing text with a decoder-only language model, over the key/value cache.

Each step feeds only the newest token and reuses the keys and values of the earlier ones
(`cache=False` recomputes the whole prefix instead, which gives the same tokens: a test
checks it). Tokens are picked greedily or drawn by attnlab.decoding's Sampler (top-k,
nucleus, temperature) with a generator of its own, so a seed gives the same text again.

`attnlab generate ckpt_path=... [prompt=...] [max_new_tokens=N] [samples=N] [cache=false]
[decode.strategy=greedy|top_k|nucleus] [decode.top_k|top_p|temperature|seed=...]
[pe.scaling=linear|ntk|yarn pe.scaling_factor=... ...]` continues a prompt with a task=lm
checkpoint; the `pe.*` settings are those eval.py may change on a checkpoint (RoPE's
context extension), refused on a model whose pe has none. Its settings follow Hydra's
override grammar (quote a value holding characters the grammar reserves:
'prompt="O Romeo, Romeo!"'), but nothing is composed: no config, no output directory, no
interpolation. In the prompt, `\\n` and `\\t` stand for a line break and a tab. Defaults:
the run's `sample_prompt`, 200 new tokens or as many as a bounded positional encoding leaves
room for, one sample, the cache on, nucleus sampling with the run's decode settings. The
checkpoint is read as tensors and plain data only (attnlab.runner.resume.read_checkpoint); the
model is rebuilt from its hyperparameters, its weights and its tokenizer.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from attnlab.config import ConfigError, is_count
from attnlab.decoding import DecodeConfig, Sampler
from attnlab.model.transformer import DecoderLM
from attnlab.runner.resume import EVALUATION_OPTIONS, evaluation_options, with_settings

if TYPE_CHECKING:
    from attnlab.data.stream import StreamTokenizer
    from attnlab.systems.lm import LMSystem

S = TypeVar("S")  # the system class load_system rebuilds
LM_STRATEGIES = ("greedy", "top_k", "nucleus")
Pick = Callable[[Tensor], Tensor]  # log-probabilities [N, V] -> next tokens [N]

SETTINGS = ("ckpt_path", "prompt", "max_new_tokens", "samples", "cache")
DECODE_SETTINGS = ("strategy", "top_k", "top_p", "temperature", "seed")
PE_SETTINGS = sorted({name for names in EVALUATION_OPTIONS.values() for name in names})
TEXT_SETTINGS = ("ckpt_path", "prompt")  # read as written: prompt=true is the text "true"
DEFAULT_NEW_TOKENS = 200
ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}
QUOTING = "quote a value holding commas or special characters, e.g. 'prompt=\"O Romeo, Romeo!\"'"


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def check_strategy(strategy: Any) -> None:
    if strategy not in LM_STRATEGIES:
        raise ConfigError(
            f"decode.strategy={strategy} does not apply to a language model's text: use one of "
            f"{', '.join(LM_STRATEGIES)}"
        )


def picker(config: DecodeConfig, strategy: str, generator: torch.Generator) -> Pick:
    """How the next token is chosen: `strategy` with `config`'s top_k, top_p, temperature."""
    check_strategy(strategy)
    if strategy == "greedy":
        return lambda log_probs: log_probs.argmax(-1)
    top_k, top_p = (config.top_k, None) if strategy == "top_k" else (None, config.top_p)
    return Sampler(generator, config.temperature, top_k, top_p)


def check_room(net: DecoderLM, prompt_length: int, max_new_tokens: int) -> None:
    """A ConfigError when the prompt and the new tokens exceed the model's positions."""
    bound = net.stack.parts.max_len
    needed = prompt_length + max_new_tokens - 1  # the last new token is never read
    if bound is None or needed <= bound:
        return
    tokens = counted(prompt_length, "token")
    if prompt_length > bound:
        raise ConfigError(
            f"a prompt of {tokens} is longer than the {bound} positions of the "
            f"model's positional encoding: give a prompt of at most {bound} tokens"
        )
    raise ConfigError(
        f"a prompt of {tokens} and {max_new_tokens} new ones need {needed} "
        f"positions, but the model's positional encoding has {bound}: ask for at most "
        f"{bound + 1 - prompt_length} new tokens, or a shorter prompt"
    )


@torch.inference_mode()
def continue_text(
    net: DecoderLM, prompt: Tensor, max_new_tokens: int, pick: Pick, cache: bool = True
) -> Tensor:
    """`max_new_tokens` tokens [N, max_new_tokens] after each prompt of prompt [N, P]."""
    if prompt.shape[1] == 0:
        raise ConfigError("the prompt is empty: give at least one token of text to continue")
    check_room(net, prompt.shape[1], max_new_tokens)
    state = net.new_cache(prompt.shape[1] + max_new_tokens - 1) if cache else None
    tokens, new = prompt, prompt
    for _ in range(max_new_tokens):
        logits = net(new if cache else tokens, state)[:, -1]
        chosen = pick(torch.log_softmax(logits.float(), -1))
        tokens = torch.cat((tokens, chosen[:, None]), 1)
        new = chosen[:, None]
    return tokens[:, prompt.shape[1] :]


# text in, text out


def encode_prompt(tokenizer: StreamTokenizer, prompt: str) -> Tensor:
    """The ids of `prompt`, to be continued."""
    return torch.as_tensor(tokenizer.encode(prompt), dtype=torch.long)


def continuation(tokenizer: StreamTokenizer, prompt: Tensor, new: Tensor) -> str:
    """The text of `new` as it reads after `prompt` (with the space a SentencePiece word
    carries, which decoding it alone would drop)."""
    before = tokenizer.decode(prompt)
    whole = tokenizer.decode(torch.cat((prompt, new)))
    return whole[len(before) :] if whole.startswith(before) else tokenizer.decode(new)


def continuations(
    system: LMSystem,
    prompt: str,
    count: int | None,
    samples: int,
    config: DecodeConfig,
    cache: bool = True,
) -> list[str]:
    """`samples` texts continuing `prompt` by `count` tokens (None: DEFAULT_NEW_TOKENS, or
    fewer if the model's positions end sooner), drawn by `config` with its seed."""
    check_strategy(config.strategy)
    tokenizer = system.tokenizer
    assert tokenizer is not None, "a language model system loaded from a checkpoint"
    ids = encode_prompt(tokenizer, prompt).to(system.device)
    if count is None:
        bound = system.net.stack.parts.max_len
        room = DEFAULT_NEW_TOKENS if bound is None else bound + 1 - len(ids)
        count = max(1, min(DEFAULT_NEW_TOKENS, room))
    generator = torch.Generator(system.device).manual_seed(config.seed)
    pick = picker(config, config.strategy, generator)
    new = continue_text(system.net, ids.repeat(samples, 1), count, pick, cache)
    return [prompt + continuation(tokenizer, ids, row) for row in new]


def unknown_symbols(system: LMSystem, prompt: str) -> int:
    """How many ids of `prompt` are the model's unknown symbol."""
    tokenizer = system.tokenizer
    assert tokenizer is not None
    return int((encode_prompt(tokenizer, prompt) == tokenizer.unk_id).sum())


# attnlab generate


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


def parse_setting(
    arg: str, program: str, names: Sequence[str], text: Sequence[str], known: Callable[[str], bool]
) -> tuple[str, Any]:
    """(key, value) of one `key=value` in Hydra's override grammar, a setting of `program`
    (`known`; `names` lists them), the keys in `text` read as written."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    try:
        override = OverridesParser.create().parse_override(arg)
    except Exception:
        raise ConfigError(f"cannot read {arg!r} as key=value: {QUOTING}") from None
    key = override.key_or_group
    plain = override.type is OverrideType.CHANGE and override.package is None
    if not plain or override.is_sweep_override() or "=" not in arg:
        raise ConfigError(f"{arg!r} is not a plain key=value (one value per setting): {QUOTING}")
    if not known(key):
        raise ConfigError(f"{program} has no setting {key}: its settings are {', '.join(names)}")
    value = override.value()
    if key in text and not isinstance(value, str):
        value = arg.split("=", 1)[1].strip()  # as written, not as a number, bool or null
    return key, value


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


def nested(node: Any, *keys: str) -> dict[str, Any]:
    """node[keys[0]][keys[1]]..., or {} where the stored data holds no such dict."""
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def with_pe_settings(path: str, architecture: Any, settings: dict[str, Any]) -> Any:
    """The stored `architecture` with the flattened pe `settings` set, or a ConfigError where
    its pe has no such evaluation option (attnlab.runner.resume.EVALUATION_OPTIONS)."""
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
    from attnlab.data.stream import TOKENIZER_KEY
    from attnlab.systems.lm import LMSystem

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


def load_system(
    path: str,
    kind: type[S],
    task_check: tuple[Callable[[dict[str, Any]], bool], str],
    stored_key: str,
    program: str,
    changes: Callable[[dict[str, Any]], dict[str, Any]] = lambda stored: {},
) -> S:
    """The system of class `kind` that a checkpoint of a task `task_check` accepts (a test of
    the stored task node, and what it asks for in words) holds, in eval mode, on
    the CPU: read as tensors and plain data (a checkpoint file or an exported directory),
    rebuilt from its hyperparameters with `changes(hyperparameters)` set over them (no code
    named by the file runs, no interpolation is resolved), its weights and the tokenizers it
    stores under `stored_key`, and the run's record (overrides and config, as data) in
    `run_record`."""
    from attnlab.config import own_class
    from attnlab.stored import RECORD_KEY, read_checkpoint, rebuild

    checkpoint = read_checkpoint(path)
    task = nested(checkpoint, RECORD_KEY, "config", "task")
    accepts, wanted = task_check
    if not accepts(task) or stored_key not in checkpoint:
        raise ConfigError(
            f"{path} holds a model of task={task.get('name')}: {program} needs {wanted}"
        )
    system_class = own_class(nested(task, "system").get("_target_"))
    hyperparameters = checkpoint.get("hyper_parameters")
    if not (issubclass(system_class, kind) and isinstance(hyperparameters, dict)):
        raise ConfigError(f"{path} holds no {kind.__name__} to rebuild")
    try:
        system = rebuild(system_class, checkpoint, changes(hyperparameters))
    except ConfigError:
        raise
    except (TypeError, KeyError, RuntimeError, ValueError) as error:
        raise ConfigError(
            f"{path} cannot be rebuilt into its model ({type(error).__name__}): it was written "
            "by another version of attnlab, or damaged"
        ) from None
    return system.eval()


def generate(args: list[str]) -> list[str]:
    """`attnlab generate`: the texts (prompt and continuation) that `args` ask for."""
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
    return continuations(
        system, prompt, request.max_new_tokens, request.samples, config, request.cache
    )
