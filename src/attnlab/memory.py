"""What a setting will allocate, counted before anything is: a network's parameters, checked
against the memory this machine has free, so that a size that cannot fit is one sentence,
not minutes of swapping or the allocator's traceback.

The parameters are counted on one network built on the meta device (no memory, no values),
each stack only as deep as it must be to hold one layer of every kind the full stack has
(`attnlab.model.transformer.depth_of_every_kind`: the first layer and a repeated one, or one
of each layer a schedule makes): its parameters once, and each of the full stack's layers as
the built layer of its kind (`Stack.added_parameters`). The count is the full network's,
however deep it is, at a few layers' cost: a full meta build costs about 8 ms a layer, so
model.n_layers=100000000 would never finish. The same network is a system's check of its
variants before any data is read (`System.check_network`).

Data sets made in memory say what they will hold the same way (`check_free`).

Bytes per parameter: evaluation holds the fp32 weights (4); training adds their gradients
and AdamW's two moments (16).

A decoder-only model's forward pass over `batch` sequences of `length` tokens (training,
each evaluation length, generation's prompt, or its whole text where no key/value cache
is kept) holds at once at least: the boolean causal mask [1, 1, L, L] (one byte a pair,
`model.transformer.attention_mask`), the logits [B, L, V] (fp32; in training their
gradient too), and the stack's hidden states [B, L, d] (fp32; in training every layer's,
kept for the backward pass). What else a pass holds (scores, projections, the feed-forward
layer) depends on the kernel and is not counted: a run refused here could never fit; one
let through may still need more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture, ModelConfig
from attnlab.model.transformer import depth_of_every_kind

if TYPE_CHECKING:
    from attnlab.model.transformer import DecoderLM, Network

TRAINING_BYTES = 16  # weights, gradients, AdamW's exp_avg and exp_avg_sq, fp32 each
EVALUATION_BYTES = 4  # the weights
GIB = 1 << 30


def available_bytes() -> int:
    """Memory this machine has free now (Linux's MemAvailable), else its physical memory."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def sizes(architecture: Architecture) -> str:
    model = architecture.model
    layers = f"model.n_layers={model.n_layers}"
    if model.n_decoder_layers is not None:
        layers += f", model.n_decoder_layers={model.n_decoder_layers}"
    return f"model.d_model={model.d_model}, model.d_ff={model.d_ff}, {layers}"


def shallow(architecture: Architecture) -> Architecture:
    """The architecture with each stack only as deep as it must be to hold every kind of
    layer of the full one (`depth_of_every_kind`)."""
    model = architecture.model
    schedule = model.layer_schedule
    decoder = model.n_decoder_layers
    shallower = replace(
        model,
        n_layers=depth_of_every_kind(schedule, model.n_layers),
        n_decoder_layers=None if decoder is None else depth_of_every_kind(schedule, decoder),
    )
    return replace(architecture, model=shallower)


def meta_network(network: Callable[[Architecture], Network], architecture: Architecture) -> Network:
    """`network` of the `shallow` architecture built on the meta device: every variant is
    built against its stack's shape, and refuses a bad setting; one sentence where the
    sizes make tensors no machine can index."""
    try:
        with torch.device("meta"):
            return network(shallow(architecture))
    except RuntimeError as error:  # a size whose bytes overflow 64 bits
        if "overflow" not in str(error):
            raise
        raise ConfigError(
            f"{sizes(architecture)} make tensors larger than any machine can index: "
            "lower model.d_model or model.d_ff"
        ) from None


def parameters_of(net: Network, model: ModelConfig) -> int:
    """The parameters of `net` (a `meta_network`) at the depths `model` gives its stacks:
    its own, each once, and what each stack would hold beyond them."""
    own = sum(p.numel() for p in net.parameters())
    return own + sum(stack.added_parameters(depth) for stack, depth in net.stacks(model))


def check_free(needed: int, what: str, fix: str) -> None:
    """A ConfigError when `needed` bytes exceed what this machine has free: `what` needs
    them (a phrase naming the settings), `fix` says what to lower."""
    free = available_bytes()
    if needed > free:
        raise ConfigError(
            f"{what} needs {needed / GIB:,.1f} GiB where this machine has {free / GIB:,.1f} GiB "
            f"free: {fix}"
        )


def check_fits(
    network: Callable[[Architecture], Network],
    architecture: Architecture,
    bytes_per_parameter: int,
) -> None:
    """Build `network` once on the meta device (`meta_network`, its variants' checks); a
    ConfigError naming the sizes, when the full network's parameters alone need more memory
    than this machine has free."""
    parameters = parameters_of(meta_network(network, architecture), architecture.model)
    use = "training" if bytes_per_parameter == TRAINING_BYTES else "evaluating"
    check_free(
        parameters * bytes_per_parameter,
        f"{sizes(architecture)} make {parameters:,} parameters, and {use} them "
        f"({bytes_per_parameter} bytes each)",
        "lower model.d_model, model.d_ff, the layers or the pe's table (pe.max_len)",
    )


def forward_bytes(net: DecoderLM, batch: int, length: int, training: bool) -> int:
    """What a pass of `net` over [batch, length] tokens certainly holds at once (the module
    doc): the causal mask, the logits and the hidden states."""
    vocab, width = net.embed.weight.shape
    kept = 2 if training else 1  # the logits' gradient
    layers = net.stack.n_layers if training else 1
    return length * length + batch * length * 4 * (kept * vocab + layers * width)


def check_forward(net: DecoderLM, batch: int, length: int, training: bool, fix: str) -> None:
    """A ConfigError, saying `fix`, when a pass over `batch` sequences of `length` tokens
    cannot fit in the memory free."""
    check_free(
        forward_bytes(net, batch, length, training),
        f"{'training on' if training else 'a pass over'} {batch:,} sequence"
        f"{'' if batch == 1 else 's'} of {length:,} tokens (a {length:,}² causal mask, the "
        "logits and hidden states)",
        fix,
    )
