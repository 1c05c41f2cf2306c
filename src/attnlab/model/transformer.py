"""Transformer stacks built from the composable attention, and the models built from them.

A `Stack` owns one positional encoding, normalizer and synthesizer (per-layer parameters
live inside them) and N blocks; it computes positions and masks once per forward and keeps
the key/value cache for incremental decoding. A hybrid stack (`model.schedule`,
`attnlab.model.schedule`) gives layers other encodings, built once each beside the run's
(`encodings`), and spans that narrow their masks; the normalizer and synthesizer stay shared. Blocks are the `block` group's: the standard
attention + FFN (`attnlab.model.standard`) or the gated attention unit (`attnlab.model.gau`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.core import AttentionParts
from attnlab.attention.layer import KVCache
from attnlab.config.build import build
from attnlab.errors import ConfigError
from attnlab.model.architecture import AttentionConfig, ModelConfig
from attnlab.model.block import LayerCache, StackInputs
from attnlab.model.schedule import RUN_PE, LayerPlan, Schedule
from attnlab.pe.base import PositionalEncoding
from attnlab.shape import StackShape, per_layer_parameters
from attnlab.tensors import linear


@dataclass
class StackCache:
    """Per-layer self- and cross-attention caches of one decoder stack, and what its PEs drew
    at the session's first step (`PositionalEncoding.begin`), by module name."""

    self_kv: list[KVCache]
    cross_kv: list[KVCache]
    length: int = 0
    capacity: int | None = None  # positions the session will use, for PEs that draw them
    drawn: dict[str, Tensor | None] = field(default_factory=dict)

    @classmethod
    def empty(cls, n_layers: int, capacity: int | None = None) -> StackCache:
        caches = [KVCache() for _ in range(n_layers)], [KVCache() for _ in range(n_layers)]
        return cls(*caches, capacity=capacity)

    def reorder(self, index: Tensor) -> None:
        for cache in (*self.self_kv, *self.cross_kv):
            cache.reorder(index)


def attention_mask(
    q_pos: Tensor, k_pos: Tensor, padding: Tensor | None, causal: bool
) -> Tensor | None:
    """Boolean [B|1, 1, Lq, Lk], True where query i may attend key j; None when all may.

    Keys are the cached prefix followed by the queries, so a causal mask matters only when
    there is more than one query.
    """
    mask = None
    if causal and q_pos.shape[0] > 1:
        mask = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if padding is not None:
        keep = ~padding[:, None, None, :]
        mask = keep if mask is None else mask & keep
    return mask


def exactly_causal(q_pos: Tensor, k_pos: Tensor, padding: Tensor | None, causal: bool) -> bool:
    """Whether `attention_mask` is exactly the causal mask of Lq = Lk positions (no padding,
    no cached prefix): the mask SDPA's `is_causal=True` stands for."""
    return causal and padding is None and q_pos.shape[0] == k_pos.shape[0] > 1


def check_length(parts: AttentionParts, length: int, where: str) -> None:
    for group, part in (("pe", parts.pe), ("synthesizer", parts.synthesizer)):
        if part.max_len is not None and length > part.max_len:
            raise ConfigError(
                f"{where} has {length} positions but {type(part).__name__} is built for at most "
                f"{part.max_len} ({group}.{part.max_len_option}): raise it or shorten the sequences"
            )


class LayerKind(NamedTuple):
    """What sets a layer of a stack apart from the others: being the first, and its plan
    (encoding and span). Layers of one kind hold parameters of the same sizes."""

    first: bool
    plan: LayerPlan


class KindCount(NamedTuple):
    """Where a kind of layer first comes in a stack, and how many of its layers are of it."""

    first_layer: int
    layers: int


def layer_kinds(schedule: Schedule | None, n_layers: int) -> dict[LayerKind, KindCount]:
    """Each kind of layer a stack of n_layers has, in the order they first come. After the
    first layer the plans repeat every len(pattern) layers, so the first len(pattern) + 1
    layers hold every kind, and each of them stands for every len(pattern)-th layer after
    it: a count in O(len(pattern)) steps, however deep the stack."""
    period = 1 if schedule is None else len(schedule.pattern)
    kinds: dict[LayerKind, KindCount] = {}
    for i in range(min(n_layers, period + 1)):
        kind = LayerKind(i == 0, LayerPlan() if schedule is None else schedule.at(i))
        first, layers = kinds.get(kind, KindCount(i, 0))
        kinds[kind] = KindCount(first, layers + (1 if i == 0 else len(range(i, n_layers, period))))
    return kinds


def depth_of_every_kind(schedule: Schedule | None, n_layers: int) -> int:
    """The fewest first layers of a stack of n_layers that hold one of each kind of its
    layers (2 for a plain stack of two or more: the first and a repeated one)."""
    return 1 + max(first for first, _ in layer_kinds(schedule, n_layers).values())


class Stack(nn.Module):
    """N blocks sharing one positional encoding, normalizer and synthesizer."""

    def __init__(
        self,
        cfg: ModelConfig,
        attention: AttentionConfig,
        n_layers: int,
        causal: bool,
        cross: bool = False,
    ) -> None:
        super().__init__()
        shape = cfg.block.self_attention_shape(cfg, n_layers, causal)
        self.causal, self.n_layers = causal, n_layers
        self.parts = AttentionParts.from_config(
            attention.pe, attention.norm, attention.synthesizer, shape
        )
        schedule = self.schedule = cfg.layer_schedule
        self.plans = [LayerPlan() if schedule is None else schedule.at(i) for i in range(n_layers)]
        self.encodings = nn.ModuleDict()
        by_name = {RUN_PE: self.parts}  # AttentionParts over the shared norm and synthesizer
        if schedule is not None:
            for name, pe in scheduled_encodings(schedule, n_layers, self.parts.pe, shape).items():
                self.encodings[name] = pe
                by_name[name] = AttentionParts(pe, self.parts.norm, self.parts.synthesizer)
        self.layer_parts = [by_name[plan.pe] for plan in self.plans]  # not registered twice
        self.cross_parts = None
        if cross:
            chosen = cfg.cross_attention
            cross_pe = attention.pe if cfg.cross_pe else chosen["pe"]
            cross_shape = cfg.multi_head_shape(n_layers, causal=False, cross=True)
            self.cross_parts = AttentionParts.from_config(
                cross_pe, attention.norm, chosen["synthesizer"], cross_shape
            )
            if cfg.cross_pe and not self.cross_parts.pe.acts_in_attention:
                raise ConfigError(
                    f"model.cross_pe=true does nothing with {type(self.cross_parts.pe).__name__}, "
                    "which acts on token embeddings only (or not at all): set model.cross_pe=false"
                )
        self.blocks = nn.ModuleList(
            cfg.block.layer(cfg, shape, i, self.layer_parts[i], cross) for i in range(n_layers)
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.final_norm = cfg.layer_norm() if cfg.norm_first else nn.Identity()
        # the PEs that start a pass (the stack's, those inside it, a schedule's encodings), by
        # the name their draws are kept under in a cache: found once, not per pass
        encoders = {"": self.parts.pe, **{f"encodings.{n}": e for n, e in self.encodings.items()}}
        self.beginning = [
            (f"{prefix}.{name}".strip("."), module)
            for prefix, encoder in encoders.items()
            for name, module in encoder.named_modules()
            if isinstance(module, PositionalEncoding)
            and type(module).begin is not PositionalEncoding.begin
        ]

    def added_parameters(self, n_layers: int) -> int:
        """The parameters a stack of n_layers layers, of this one's options, holds beyond
        this one's, which holds every kind of layer it would (`depth_of_every_kind`): each
        layer's own as many more times as it has more layers of its kind, and the parts'
        entries for each layer (`per_layer_parameters`) as many more times as it has more
        layers. A parameter a layer shares with any other module of the stack is no layer's
        own: counted once, as `parameters()` counts it."""
        built = layer_kinds(self.schedule, self.n_layers)
        own = self.own_parameters()
        more = sum(
            (count.layers - built[kind].layers) * own[built[kind].first_layer]
            for kind, count in layer_kinds(self.schedule, n_layers).items()
        )
        each = sum(per_layer_parameters(module) for module in self.beside_layers()) // self.n_layers
        return more + (n_layers - self.n_layers) * each

    def beside_layers(self) -> list[nn.Module]:
        """The stack's modules other than its layers: its parts, a schedule's encodings,
        cross-attention's parts, the final norm."""
        return [module for name, module in self.named_children() if name != "blocks"]

    def own_parameters(self) -> list[int]:
        """Each layer's parameters that no other module of the stack holds."""
        beside = {id(p) for module in self.beside_layers() for p in module.parameters()}
        held = Counter(id(p) for block in self.blocks for p in block.parameters())
        return [
            sum(p.numel() for p in block.parameters() if held[id(p)] == 1 and id(p) not in beside)
            for block in self.blocks
        ]

    def check_length(self, length: int, memory_length: int | None = None) -> None:
        for parts in dict.fromkeys(self.layer_parts):
            check_length(parts, length, "the sequence")
        if self.cross_parts is not None and memory_length is not None:
            check_length(self.cross_parts, max(length, memory_length), "cross-attention")

    def begin(self, length: int, device: torch.device, cache: StackCache | None) -> None:
        """Start a forward pass over positions 0..length−1 for the PE and every PE inside it
        (`PositionalEncoding.begin`); a decoding session covers its cache's capacity and
        keeps what they drew at its first step."""
        drawn = {} if cache is None else cache.drawn
        if cache is not None and cache.capacity is not None:
            length = max(length, cache.capacity)
        for name, module in self.beginning:
            drawn[name] = module.begin(length, device, drawn.get(name))

    def forward(
        self,
        x: Tensor,
        padding: Tensor | None = None,
        memory: Tensor | None = None,
        memory_padding: Tensor | None = None,
        cache: StackCache | None = None,
    ) -> Tensor:
        """x [B, L, d] embedded tokens; padding [B, L] True at pad tokens (keys to ignore)."""
        offset = cache.length if cache is not None else 0
        length = x.shape[1]
        self.check_length(offset + length, None if memory is None else memory.shape[1])
        self.begin(offset + length, x.device, cache)
        k_pos = torch.arange(offset + length, device=x.device)
        q_pos = k_pos[offset:]
        inputs = StackInputs(
            self.parts,
            q_pos,
            k_pos,
            attention_mask(q_pos, k_pos, padding, self.causal),
            exactly_causal(q_pos, k_pos, padding, self.causal),
        )
        if memory is not None:
            inputs.cross_parts = self.cross_parts
            inputs.memory = memory
            inputs.memory_pos = torch.arange(memory.shape[1], device=x.device)
            inputs.memory_mask = attention_mask(q_pos, inputs.memory_pos, memory_padding, False)
        x = self.drop(self.parts.pe.embed(x, q_pos))
        spans: dict[LayerPlan, StackInputs] = {}  # one mask per span a pass
        for i, block in enumerate(self.blocks):
            layer_cache = LayerCache()
            if cache is not None:
                layer_cache = LayerCache(cache.self_kv[i], cache.cross_kv[i])
            plan = self.plans[i]
            if plan not in spans:
                spans[plan] = spanned(inputs, plan)
            x = block(x, replace(spans[plan], parts=self.layer_parts[i]), layer_cache)
        if cache is not None:
            cache.length += length
        return self.final_norm(x)


def spanned(inputs: StackInputs, plan: LayerPlan) -> StackInputs:
    """The stack's inputs with the mask narrowed to a layer's span (`LayerPlan.span_mask`)."""
    span = plan.span_mask(inputs.q_pos, inputs.k_pos)
    if span is None:
        return inputs
    mask = span[None, None] if inputs.mask is None else inputs.mask & span
    return replace(inputs, mask=mask, is_causal=False)


def scheduled_encodings(
    schedule: Schedule, n_layers: int, run_pe: PositionalEncoding, shape: StackShape
) -> dict[str, PositionalEncoding]:
    """The encodings a schedule gives some of a stack's layers besides the run's, built once
    each; one sentence where the schedule cannot mean what it says."""
    names = schedule.names(n_layers)
    if RUN_PE not in names:
        raise ConfigError(
            f"model.schedule gives none of the {n_layers} layers the run's pe "
            f"({type(run_pe).__name__}): put `pe` in its pattern, or choose that encoding with pe="
        )
    encodings = {name: schedule.encodings[name] for name in names if name != RUN_PE}
    built = {name: build(node, ("attnlab.pe.",), shape=shape) for name, node in encodings.items()}
    embedding = [type(pe).__name__ for pe in (run_pe, *built.values()) if pe.embeds]
    if built and embedding:
        raise ConfigError(
            f"model.schedule gives layers different encodings, but {', '.join(embedding)} adds "
            "positions to the token embeddings, before any layer: choose encodings that act in "
            "attention (rope, alibi, t5, none, ...)"
        )
    return built


class Network(Protocol):
    """What a system's network tells about itself before it is built at full depth: its
    stacks, each with the layers a config gives it (attnlab.memory counts a network built
    with fewer)."""

    def stacks(self, cfg: ModelConfig) -> list[tuple[Stack, int]]: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


class TokenEmbedding(nn.Module):
    """Token embeddings, N(0, 1/d)·√d as in Vaswani et al. or N(0, init_std²) unscaled."""

    def __init__(self, vocab_size: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, cfg.d_model))
        std = cfg.d_model**-0.5 if cfg.embed_scale else cfg.init_std
        nn.init.normal_(self.weight, std=std)
        self.scale = cfg.d_model**0.5 if cfg.embed_scale else 1.0

    def forward(self, tokens: Tensor) -> Tensor:
        embedded = F.embedding(tokens, self.weight)
        return embedded if self.scale == 1.0 else embedded * self.scale  # GPT-2's: unscaled


class Tagger(nn.Module):
    """Token embeddings -> a bidirectional or causal stack -> a class per token."""

    def __init__(
        self,
        cfg: ModelConfig,
        attention: AttentionConfig,
        vocab_size: int,
        num_classes: int,
        causal: bool,
    ) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, cfg)
        self.stack = Stack(cfg, attention, cfg.n_layers, causal=causal)
        self.head = linear(cfg.d_model, num_classes, True, cfg.init_std)

    def stacks(self, cfg: ModelConfig) -> list[tuple[Stack, int]]:
        return [(self.stack, cfg.n_layers)]

    def hidden(self, tokens: Tensor, padding: Tensor | None) -> Tensor:
        return self.stack(self.embed(tokens), padding)

    def forward(self, tokens: Tensor, padding: Tensor | None) -> Tensor:
        return self.head(self.hidden(tokens, padding))


class DecoderLM(nn.Module):
    """Token embeddings -> a causal stack -> next-token logits: a decoder-only language model.
    With tie_embeddings the output projection is the embedding matrix (Press & Wolf 2017)."""

    def __init__(self, cfg: ModelConfig, attention: AttentionConfig, vocab_size: int) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, cfg)
        self.stack = Stack(cfg, attention, cfg.n_layers, causal=True)
        self.output = (
            None if cfg.tie_embeddings else linear(cfg.d_model, vocab_size, False, cfg.init_std)
        )

    def stacks(self, cfg: ModelConfig) -> list[tuple[Stack, int]]:
        return [(self.stack, cfg.n_layers)]

    def forward(self, tokens: Tensor, cache: StackCache | None = None) -> Tensor:
        """Logits [B, T, V] of the token after each of tokens [B, T] (the new ones only when
        a cache holds the earlier ones)."""
        hidden = self.stack(self.embed(tokens), None, cache=cache)
        if self.output is None:
            return hidden @ self.embed.weight.t()
        return self.output(hidden)

    def new_cache(self, capacity: int | None = None) -> StackCache:
        """An empty cache for a decoding session of at most `capacity` positions (needed by
        PEs that draw positions per session, pe=randomized)."""
        return StackCache.empty(self.stack.n_layers, capacity)


class EncoderDecoder(nn.Module):
    """A bidirectional encoder and a causal decoder with cross-attention (translation).

    With tie_embeddings, the decoder's input embedding and output projection share one
    matrix, and the encoder shares it too when source and target use one joint vocabulary
    (separate vocabularies of equal size still number different pieces alike: never shared).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        attention: AttentionConfig,
        src_vocab_size: int,
        tgt_vocab_size: int,
        joint_vocab: bool = True,
    ) -> None:
        super().__init__()
        if joint_vocab and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"a joint vocabulary has one size, not {src_vocab_size} (source) and "
                f"{tgt_vocab_size} (target)"
            )
        self.tgt_embed = TokenEmbedding(tgt_vocab_size, cfg)
        shared = cfg.tie_embeddings and joint_vocab
        self.src_embed = self.tgt_embed if shared else TokenEmbedding(src_vocab_size, cfg)
        self.encoder = Stack(cfg, attention, cfg.n_layers, causal=False)
        self.decoder = Stack(cfg, attention, cfg.decoder_layers, causal=True, cross=True)
        self.output = (
            None if cfg.tie_embeddings else linear(cfg.d_model, tgt_vocab_size, False, cfg.init_std)
        )

    def stacks(self, cfg: ModelConfig) -> list[tuple[Stack, int]]:
        return [(self.encoder, cfg.n_layers), (self.decoder, cfg.decoder_layers)]

    def encode(self, src: Tensor, src_padding: Tensor) -> Tensor:
        return self.encoder(self.src_embed(src), src_padding)

    def decode(
        self, tgt: Tensor, memory: Tensor, memory_padding: Tensor, cache: StackCache | None = None
    ) -> Tensor:
        """Next-token logits [B, T, V] for target prefix tokens tgt [B, T] (the new ones only
        when a cache holds the earlier ones)."""
        hidden = self.decoder(self.tgt_embed(tgt), None, memory, memory_padding, cache)
        if self.output is None:
            return hidden @ self.tgt_embed.weight.t()
        return self.output(hidden)

    def forward(self, src: Tensor, src_padding: Tensor, tgt: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src, src_padding), src_padding)

    def new_cache(self, capacity: int | None = None) -> StackCache:
        """An empty decoder cache for at most `capacity` target positions (see DecoderLM's)."""
        return StackCache.empty(self.decoder.n_layers, capacity)
