"""Multi-query associative recall, MQAR (Arora et al. 2023, "Zoology: Measuring and Improving
Recall in Efficient Language Models", ICLR 2024, arXiv 2312.04927; reference generator
HazyResearch/zoology `zoology/data/multiquery_ar.py`): key–value pairs, then queries for
every key; the answers are the queried keys' values.

The sequence, as Zoology's: the context k1 v1 k2 v2 … kN vN (N = num_kv_pairs), then a
query region, `length` tokens in all. Token 0 is the filler; keys are
drawn without replacement from 1..V/2−1 and values from V/2..V−1 (V = vocab_size, halves
rounded down), so keys and values never share a token. Each key is asked once, at an even
offset 2s of the query region (s = 0..⌊(length−2N)/2⌋−1); the N slots are drawn without
replacement with weight (s+1)^(a−1) (a = power_a: 0.01, Zoology's default, puts most queries
just after the context, 1 spreads them uniformly), by an exponential race (the N smallest
Exp(1)/weight), which gives the same distribution as drawing one slot after another.

Two layouts (`layout`). `zoology`, the paper's: the input is the context, and the output is
the query region, every token of it given (fed to the model, not predicted) but the one after
each query, which is the queried key's value, predicted and scored. As in Zoology the answer
is due right where its query stands, and exact match asks every value right. One difference:
Zoology's next input token after a query is a filler and its label the value; here the value
itself is the next token (the teacher's in training, the model's own in decoding), which no
later query can use, as each key is asked once.
`answers_after`: the input is context and query region, and the output the values of the
queried keys in the order the queries appear, after SEP. This is harder: the i-th answer must
first find the i-th query in the region (a positional step) before it looks up the value. A
model of 2 layers and width 64 did not learn it in 10,000 steps with any encoding (study 7,
docs/results/length_generalization/), where it had learned copy, reverse, sort, parity and passkey.
Unlike Zoology, which key sits in which slot is a uniform random permutation; Zoology gives
its keys, in context order, the slots in the order numpy draws them, and as each draw avoids
the slots already taken, late keys tend to get far slots: its query order leans towards the
context order.

Length = the number of input tokens (Zoology's input_seq_len), with N fixed by
`num_kv_pairs`: longer inputs then only add distance between queries and the pairs they ask
about, which is what a positional encoding has to bridge. Setting `tokens_per_pair` instead
scales the pairs with the length, N = ⌊length/tokens_per_pair⌋ (Zoology's Figure 2 keeps
length/N = 16: 64/4, 128/8, 256/16), so longer inputs also hold more to recall. A length
needs at least 4N tokens (Zoology's assertion). Zoology's other assertion, vocab_size >
length, has no role here and is not required.

`random_filler` replaces the filler 0s with tokens drawn uniformly from the vocabulary
(Zoology's random_non_queries; its Figure 2 configs leave it off), excluding this example's
keys: a filler equal to a key would be a query the answer list does not contain.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping
from typing import Any, ClassVar

from attnlab.config.values import is_count, is_number, require_counts
from attnlab.errors import ConfigError
from attnlab.tasks.synthetic.data import OPTIONS, Example, require_flags, require_length

FILLER = 0
LAYOUTS = ("zoology", "answers_after")


class MQAR:
    # options added with a new default: a run recorded before them keeps the value it ran with
    earlier_defaults: ClassVar[Mapping[str, Any]] = {"layout": "answers_after"}

    def __init__(
        self,
        vocab_size: int,
        num_kv_pairs: int | None,
        tokens_per_pair: int | None,
        power_a: float,
        random_filler: bool,
        layout: str,
    ) -> None:
        require_counts(OPTIONS, vocab_size=vocab_size)
        if (num_kv_pairs is None) == (tokens_per_pair is None):
            raise ConfigError(
                f"mqar needs exactly one of {OPTIONS}.num_kv_pairs (pairs per example) and "
                f"{OPTIONS}.tokens_per_pair (pairs growing with the length), the other null"
            )
        if num_kv_pairs is not None:
            require_counts(OPTIONS, num_kv_pairs=num_kv_pairs)
        if tokens_per_pair is not None and not is_count(tokens_per_pair, 4):
            raise ConfigError(
                f"{OPTIONS}.tokens_per_pair={tokens_per_pair!r} must be an integer of at least "
                "4: each pair needs two context tokens and a two-token query slot"
            )
        if not (is_number(power_a) and 0 < power_a < math.inf):
            raise ConfigError(
                f"{OPTIONS}.power_a={power_a!r} must be a positive number "
                "(0.01: queries near the context, 1: uniform)"
            )
        require_flags(random_filler=random_filler)
        if layout not in LAYOUTS:
            raise ConfigError(f"{OPTIONS}.layout={layout!r} is not one of: {', '.join(LAYOUTS)}")
        self.symbols, self.power_a, self.random_filler = vocab_size, power_a, random_filler
        self.layout = layout
        self.num_kv_pairs, self.tokens_per_pair = num_kv_pairs, tokens_per_pair
        self.min_length = 4 * num_kv_pairs if num_kv_pairs is not None else tokens_per_pair
        if num_kv_pairs is not None:
            self.require_keys(num_kv_pairs)

    def pairs(self, length: int) -> int:
        """N, the number of key–value pairs in an input of `length` tokens."""
        if self.num_kv_pairs is not None:
            return self.num_kv_pairs
        return length // self.tokens_per_pair

    def require_keys(self, pairs: int) -> None:
        available = self.symbols // 2 - 1
        if pairs > available:
            raise ConfigError(
                f"mqar with {pairs} key-value pairs needs {OPTIONS}.vocab_size of at least "
                f"{2 * pairs + 2} (keys come from 1..vocab_size/2-1), got {self.symbols}"
            )

    def example(self, length: int, rng: random.Random) -> Example:
        require_length("mqar", length, self.min_length)
        pairs = self.pairs(length)
        self.require_keys(pairs)
        half = self.symbols // 2
        keys = rng.sample(range(1, half), pairs)
        values = rng.sample(range(half, self.symbols), pairs)
        context = [token for pair in zip(keys, values, strict=True) for token in pair]
        region = self.filler(length - 2 * pairs, set(keys), rng)
        slots = query_slots(len(region) // 2, pairs, self.power_a, rng)
        asked = rng.sample(range(pairs), pairs)  # asked[i]: the pair queried at slots[i]
        for slot, pair in zip(slots, asked, strict=True):
            region[2 * slot] = keys[pair]
        if self.layout == "answers_after":
            return Example(context + region, [values[pair] for pair in asked])
        given = [True] * len(region)
        for slot, pair in zip(slots, asked, strict=True):
            region[2 * slot + 1], given[2 * slot + 1] = values[pair], False
        return Example(context, region, given)

    def filler(self, size: int, keys: set[int], rng: random.Random) -> list[int]:
        if not self.random_filler:
            return [FILLER] * size
        tokens = []
        while len(tokens) < size:
            token = rng.randrange(self.symbols)
            if token not in keys:
                tokens.append(token)
        return tokens


def query_slots(space: int, count: int, power_a: float, rng: random.Random) -> list[int]:
    """`count` distinct slots of 0..space−1 in increasing order, slot s drawn with weight
    (s+1)^(power_a−1) without replacement."""
    race = [rng.expovariate(1.0) * (s + 1) ** (1.0 - power_a) for s in range(space)]
    return sorted(heapq.nsmallest(count, range(space), key=race.__getitem__))
