"""Continuing text with a decoder-only language model, over the key/value cache.

Each step feeds only the newest token and reuses the keys and values of the earlier ones
(`cache=False` recomputes the whole prefix instead, which gives the same tokens: a test
checks it). Tokens are picked greedily or drawn by attnlab.decoding.encoder_decoder's Sampler (top-k,
nucleus, temperature) with a generator of its own, so a seed gives the same text again.
One sample streams its text as it is drawn (`streamed`); before decoding starts, the key/value
cache the request will need, or without it the pass over every position, is checked against
the memory free.
What `attnlab generate` (attnlab.commands.generate) and the language model's validation
samples run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.decoding.encoder_decoder import DecodeConfig, Sampler
from attnlab.errors import ConfigError
from attnlab.memory import check_forward, check_free
from attnlab.model.transformer import DecoderLM

if TYPE_CHECKING:
    from attnlab.data.tokenizer import StreamTokenizer

LM_STRATEGIES = ("greedy", "top_k", "nucleus")
DEFAULT_NEW_TOKENS = 200
FEWER = "ask for fewer new tokens (max_new_tokens) or samples"
CONTEXT = 16  # tokens before a streamed token that its text is decoded after
Pick = Callable[[Tensor], Tensor]  # log-probabilities [N, V] -> next tokens [N]


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


def check_cache(net: DecoderLM, samples: int, positions: int) -> None:
    """A ConfigError when the keys and values of `positions` positions for `samples`
    sequences (4 bytes each of the model's width, per layer) exceed the memory free."""
    layers, width = net.stack.n_layers, net.embed.weight.shape[1]
    check_free(
        2 * layers * samples * positions * width * 4,
        f"continuing {counted(samples, 'sample')} to {positions:,} positions keeps a key/value "
        "cache that",
        FEWER,
    )


def drawn_tokens(
    net: DecoderLM, prompt: Tensor, max_new_tokens: int, pick: Pick, cache: bool = True
) -> Iterator[Tensor]:
    """The next tokens [N] after each prompt of prompt [N, P], step by step, as drawn; the
    request is checked here, before the first step is asked for."""
    if prompt.shape[1] == 0:
        raise ConfigError("the prompt is empty: give at least one token of text to continue")
    check_room(net, prompt.shape[1], max_new_tokens)
    positions = prompt.shape[1] + max_new_tokens - 1
    if cache:  # a pass over the prompt, then one token a step
        check_forward(net, prompt.shape[0], prompt.shape[1], False, "give a shorter prompt")
        check_cache(net, prompt.shape[0], positions)
    else:  # the last step passes over every position
        check_forward(net, prompt.shape[0], positions, False, f"{FEWER}, or keep the cache")
    return steps(net, prompt, max_new_tokens, pick, net.new_cache(positions) if cache else None)


@torch.inference_mode()
def steps(
    net: DecoderLM, prompt: Tensor, max_new_tokens: int, pick: Pick, state: Any
) -> Iterator[Tensor]:
    """drawn_tokens' steps: over the key/value cache `state`, or recomputing (None)."""
    cache = state is not None
    tokens, new = prompt, prompt
    for _ in range(max_new_tokens):
        logits = net(new if cache else tokens, state)[:, -1]
        chosen = pick(torch.log_softmax(logits.float(), -1))
        yield chosen
        new = chosen[:, None]
        if not cache:
            tokens = torch.cat((tokens, new), 1)


def continue_text(
    net: DecoderLM, prompt: Tensor, max_new_tokens: int, pick: Pick, cache: bool = True
) -> Tensor:
    """`max_new_tokens` tokens [N, max_new_tokens] after each prompt of prompt [N, P]."""
    return torch.stack(list(drawn_tokens(net, prompt, max_new_tokens, pick, cache)), 1)


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


def prepared(
    net: DecoderLM, tokenizer: StreamTokenizer, prompt: str, count: int | None, config: DecodeConfig
) -> tuple[Tensor, int, Pick]:
    """The prompt's ids, the number of new tokens (None: DEFAULT_NEW_TOKENS, or fewer if the
    model's positions end sooner) and the picker `config` draws with, seeded."""
    check_strategy(config.strategy)
    device = net.embed.weight.device
    ids = encode_prompt(tokenizer, prompt).to(device)
    if count is None:
        bound = net.stack.parts.max_len
        room = DEFAULT_NEW_TOKENS if bound is None else bound + 1 - len(ids)
        count = max(1, min(DEFAULT_NEW_TOKENS, room))
    generator = torch.Generator(device).manual_seed(config.seed)
    return ids, count, picker(config, config.strategy, generator)


def continuations(
    net: DecoderLM,
    tokenizer: StreamTokenizer,
    prompt: str,
    count: int | None,
    samples: int,
    config: DecodeConfig,
    cache: bool = True,
) -> list[str]:
    """`samples` texts continuing `prompt` by `count` tokens, drawn by `config` with its seed."""
    ids, count, pick = prepared(net, tokenizer, prompt, count, config)
    new = continue_text(net, ids.repeat(samples, 1), count, pick, cache)
    return [prompt + continuation(tokenizer, ids, row) for row in new]


def streamed(
    net: DecoderLM,
    tokenizer: StreamTokenizer,
    prompt: str,
    count: int | None,
    config: DecodeConfig,
    cache: bool = True,
) -> Iterator[str]:
    """One continuation of `prompt` (the tokens of `continuations`' with one sample), its
    text piece by piece as its tokens are drawn: each token's text as it reads after the
    CONTEXT tokens before it (a SentencePiece word's space; with a character tokenizer the
    very text of `continuations`). The request is checked before this returns."""
    ids, count, pick = prepared(net, tokenizer, prompt, count, config)
    tokens = drawn_tokens(net, ids[None], count, pick, cache)

    def pieces() -> Iterator[str]:
        before = ids
        for chosen in tokens:
            yield continuation(tokenizer, before[-CONTEXT:], chosen)
            before = torch.cat((before[-CONTEXT:], chosen))

    return pieces()
