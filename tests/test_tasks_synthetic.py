"""The synthetic length-generalization tasks against independent computations of their
answers (addition through Python ints, sort through counts, MQAR and passkey by scanning the
input), their lengths and vocabularies, their determinism, and the options they refuse."""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections import Counter
from pathlib import Path
from random import Random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from attnlab.config.build import own_class
from attnlab.config.options import CONF_DIR, options, variant
from attnlab.errors import ConfigError
from attnlab.tasks.synthetic.addition import PLUS, Addition
from attnlab.tasks.synthetic.copy import Copy
from attnlab.tasks.synthetic.data import Example, Generator
from attnlab.tasks.synthetic.mqar import FILLER as MQAR_FILLER
from attnlab.tasks.synthetic.mqar import MQAR, query_slots
from attnlab.tasks.synthetic.parity import Parity
from attnlab.tasks.synthetic.passkey import FILLER, KEY, QUERY, Passkey
from attnlab.tasks.synthetic.reverse import Reverse
from attnlab.tasks.synthetic.sort import Sort


def generator(task: str, **options: Any) -> Generator:
    """The generator of conf/task/<task>.yaml (data.generator) with `options` replaced, made
    by its class directly, so that the class's own checks meet any bad option."""
    node = variant("task", task)["data"]["generator"]
    return own_class(node.pop("_target_"))(**(node | options))


def synthetic_tasks() -> list[str]:
    """The options of conf/task whose YAML names a generator: the synthetic tasks."""
    return [
        task for task in options("task")
        if OmegaConf.select(OmegaConf.load(CONF_DIR / "task" / f"{task}.yaml"), "data.generator")
    ]  # fmt: skip


# settings beside each task's defaults that deserve their own checks (mqar: a small vocabulary)
VARIANTS = {
    "copy_identical": ("copy", {"alphabet": 3, "identical": True}),
    "reverse": ("reverse", {"alphabet": 4}),
    "addition_reversed": ("addition", {"reverse_digits": True}),
    "mqar": ("mqar", {"vocab_size": 64, "num_kv_pairs": 3, "layout": "answers_after"}),
    "mqar_scaled": (
        "mqar",
        {"layout": "answers_after", "vocab_size": 256, "num_kv_pairs": None,
         "tokens_per_pair": 8, "power_a": 1.0, "random_filler": True},
    ),
    "passkey_fixed": ("passkey", {"key_digits": 3, "filler_tokens": 2, "depth": 0.25}),
}  # fmt: skip
TASKS = [*synthetic_tasks(), *VARIANTS]  # every task at its defaults, and the variants


@functools.cache
def task_named(name: str) -> Generator:
    """The generator of TASKS' `name`, made when a test first asks (its config composed then,
    not while the tests are collected)."""
    task, options = VARIANTS.get(name, (name, {}))
    return generator(task, **options)


def solve_copy(task, length, tokens):
    assert len(tokens) == length
    if task.identical:
        assert len(set(tokens)) == 1
    return tokens


def solve_reverse(task, length, tokens):
    assert len(tokens) == length
    return [tokens[length - 1 - i] for i in range(length)]


def solve_sort(task, length, tokens):
    assert len(tokens) == length
    counts = Counter(tokens)
    return [symbol for symbol in range(task.symbols) for _ in range(counts[symbol])]


def solve_addition(task, length, tokens):
    assert len(tokens) == 2 * length + 1 and tokens[length] == PLUS
    a, b = tokens[:length], tokens[length + 1 :]
    if task.reverse_digits:
        a, b = a[::-1], b[::-1]
    assert length == 1 or (a[0] != 0 and b[0] != 0)
    total = str(int("".join(map(str, a))) + int("".join(map(str, b))))
    assert len(total) in (length, length + 1)
    digits = [int(c) for c in total]
    return digits[::-1] if task.reverse_digits else digits


def solve_parity(task, length, tokens):
    assert len(tokens) == length and set(tokens) <= {0, 1}
    return [tokens.count(1) % 2]


def solve_mqar(task, length, tokens):
    assert len(tokens) == length
    pairs = task.num_kv_pairs or length // task.tokens_per_pair
    context, region = tokens[: 2 * pairs], tokens[2 * pairs :]
    keys, values = context[0::2], context[1::2]
    half = task.symbols // 2
    assert all(1 <= k < half for k in keys) and all(half <= v < task.symbols for v in values)
    assert len(set(keys)) == len(set(values)) == pairs
    asked = [(offset, token) for offset, token in enumerate(region) if token in keys]
    assert sorted(token for _, token in asked) == sorted(keys)  # each key asked once
    assert all(offset % 2 == 0 and offset < len(region) - 1 for offset, _ in asked)
    filler = [token for token in region if token not in keys]
    assert task.random_filler or set(filler) <= {MQAR_FILLER}
    answers = []
    for _, query in asked:  # the value right after the query's key in the context
        position = next(i for i in range(0, 2 * pairs, 2) if context[i] == query)
        answers.append(context[position + 1])
    return answers


def solve_passkey(task, length, tokens):
    assert len(tokens) == length and tokens.count(KEY) == 1 and tokens.count(QUERY) == 1
    assert tokens[-1] == QUERY
    start = tokens.index(KEY) + 1
    key = tokens[start : start + task.key_digits]
    assert all(0 <= digit < 10 for digit in key)
    for segment in (tokens[: start - 1], tokens[start + task.key_digits : -1]):
        assert all(token == FILLER + i % task.filler_tokens for i, token in enumerate(segment))
    return key


SOLVE = {
    Copy: solve_copy,
    Reverse: solve_reverse,
    Sort: solve_sort,
    Addition: solve_addition,
    Parity: solve_parity,
    MQAR: solve_mqar,
    Passkey: solve_passkey,
}


@pytest.mark.parametrize("name", TASKS)
def test_every_task_has_an_independent_solver(name):
    assert type(task_named(name)) in SOLVE, (
        f"{name}: add a function computing its answer from the input another way to SOLVE"
    )


@pytest.mark.parametrize("name", TASKS)
@settings(max_examples=30, deadline=None)
@given(extra=st.integers(0, 60), seed=st.integers(0, 2**32))
def test_examples_carry_the_independently_computed_answer(name, extra, seed):
    task = task_named(name)
    length = task.min_length + extra
    tokens, answer, given = Example(*task.example(length, Random(seed)))
    assert given is None and answer == SOLVE[type(task)](task, length, tokens)
    assert all(0 <= t < task.symbols and type(t) is int for t in tokens + answer)


@pytest.mark.parametrize("name", TASKS)
def test_a_seed_fixes_the_examples_and_another_seed_changes_them(name):
    task = task_named(name)
    length = task.min_length + 20

    def draw(seed):
        rng = Random(seed)
        return [task.example(length, rng) for _ in range(3)]

    assert isinstance(task, Generator)
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


# seed 0's example of every task and variant: fixed test sets must not change between machines
# or Python releases (a new task's entry is the example it draws, checked by hand)
GOLDEN = json.loads((Path(__file__).parent / "data" / "synthetic_golden.json").read_text())


@pytest.mark.parametrize("name", TASKS)
def test_seed_0_still_draws_the_recorded_example(name):
    golden = GOLDEN.get(name, {"length": task_named(name).min_length + 5})
    drawn = Example(*task_named(name).example(golden["length"], Random(0)))
    assert name in GOLDEN, (
        f"tests/data/synthetic_golden.json has no {name}: check this example by hand and add "
        f'"{name}": {json.dumps({"length": golden["length"], "input": drawn.input, "output": drawn.output})}'
    )
    assert drawn == Example(golden["input"], golden["output"])


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("shift", [-1, 0.5])
def test_lengths_below_the_minimum_or_fractional_are_refused(name, shift):
    task = task_named(name)
    with pytest.raises(ConfigError, match="length"):
        task.example(task.min_length + shift, Random(0))


@pytest.mark.parametrize(
    ("make", "option"),
    [
        (lambda: generator("copy", alphabet=0), "alphabet"),
        (lambda: generator("copy", alphabet=2.0), "alphabet"),
        (lambda: generator("copy", identical="yes"), "identical"),
        (lambda: generator("reverse", alphabet=0), "alphabet"),
        (lambda: generator("sort", alphabet=1), "alphabet"),
        (lambda: generator("addition", reverse_digits=1), "reverse_digits"),
        (lambda: generator("mqar", num_kv_pairs=0), "num_kv_pairs"),
        (lambda: generator("mqar", vocab_size=17, num_kv_pairs=8), "vocab_size"),
        (lambda: generator("mqar", num_kv_pairs=None), "tokens_per_pair"),
        (lambda: generator("mqar", tokens_per_pair=16), "tokens_per_pair"),
        (lambda: generator("mqar", num_kv_pairs=None, tokens_per_pair=3), "tokens_per_pair"),
        (lambda: generator("mqar", power_a=0), "power_a"),
        (lambda: generator("mqar", power_a=math.nan), "power_a"),
        (lambda: generator("mqar", random_filler="no"), "random_filler"),
        (lambda: generator("passkey", key_digits=0), "key_digits"),
        (lambda: generator("passkey", filler_tokens=0), "filler_tokens"),
        (lambda: generator("passkey", depth=1.5), "depth"),
        (lambda: generator("passkey", depth=-0.1), "depth"),
        (lambda: generator("passkey", depth="middle"), "depth"),
    ],
)
def test_bad_options_are_refused_in_one_sentence(make, option):
    with pytest.raises(ConfigError, match=option) as error:
        make()
    assert "\n" not in str(error.value)


def test_copy_identical_draws_its_symbol_per_example():
    rng = Random(0)
    assert {generator("copy", identical=True).example(4, rng)[0][0] for _ in range(200)} == set(
        range(10)
    )


def test_addition_reversed_digits_mirror_the_default_format():
    for seed in range(20):
        tokens, total = generator("addition").example(5, Random(seed))
        mirrored, mirrored_total = generator("addition", reverse_digits=True).example(
            5, Random(seed)
        )
        assert mirrored == [*tokens[:5][::-1], PLUS, *tokens[6:][::-1]]
        assert mirrored_total == total[::-1]


def test_addition_carries_into_a_new_digit_about_60_percent_of_the_time():
    rng = Random(0)  # exactly 4860/8100 of the two-digit pairs sum to 100 or more
    longer = sum(len(generator("addition").example(2, rng)[1]) == 3 for _ in range(4000))
    assert abs(longer / 4000 - 0.6) < 0.04


def test_addition_runs_past_pythons_int_string_limit():
    tokens, total = generator("addition").example(5000, Random(0))
    a, b = tokens[:5000], tokens[5001:]
    low = int("".join(map(str, a[-30:]))) + int("".join(map(str, b[-30:])))
    assert total[-30:] == [int(c) for c in f"{low % 10**30:030d}"]
    assert len(total) in (5000, 5001) and total[0] != 0


@pytest.mark.parametrize("length", [1, 2, 7, 20])
def test_parity_classes_are_balanced_at_every_length(length):
    rng = Random(length)
    odd = sum(Parity().example(length, rng)[1][0] for _ in range(4000))
    assert abs(odd / 4000 - 0.5) < 0.04


@pytest.mark.parametrize(("space", "count", "power_a"), [(4, 2, 0.5), (5, 2, 0.01)])
def test_mqar_query_slots_are_successive_power_law_draws(space, count, power_a):
    weights = [(s + 1) ** (power_a - 1) for s in range(space)]
    p = [w / sum(weights) for w in weights]

    def sequential(order):  # probability of drawing these slots one after another
        chance, left = 1.0, 1.0
        for slot in order:
            chance, left = chance * p[slot] / left, left - p[slot]
        return chance

    expected = {tuple(sorted(order)): 0.0 for order in itertools.permutations(range(space), count)}
    for order in itertools.permutations(range(space), count):
        expected[tuple(sorted(order))] += sequential(order)
    rng, n = Random(0), 10000
    seen = Counter(tuple(query_slots(space, count, power_a, rng)) for _ in range(n))
    for slots, chance in expected.items():
        assert abs(seen[slots] / n - chance) < 4 * math.sqrt(chance * (1 - chance) / n) + 1e-3


def test_mqar_asks_its_keys_in_every_order():
    options = {"vocab_size": 64, "num_kv_pairs": 3, "power_a": 1.0, "layout": "answers_after"}
    task, rng = generator("mqar", **options), Random(0)
    orders = set()
    for _ in range(300):
        tokens, answer, _ = task.example(40, rng)
        orders.add(tuple(tokens[1:6:2].index(value) for value in answer))
    assert orders == set(itertools.permutations(range(3)))


def test_mqar_power_law_keeps_queries_nearer_the_context_than_uniform():
    def mean_offset(power_a):
        task = generator(
            "mqar", vocab_size=64, num_kv_pairs=2, power_a=power_a, layout="answers_after"
        )
        rng = Random(0)
        offsets = []
        for _ in range(200):
            tokens = task.example(200, rng).input
            offsets += [i for i, t in enumerate(tokens[4:]) if t in tokens[0:4:2]]
        return sum(offsets) / len(offsets)

    assert mean_offset(0.01) < 0.6 * mean_offset(1.0)


def test_mqar_scaled_pairs_follow_the_length_until_the_keys_run_out():
    task = generator(  # keys 1..9
        "mqar", vocab_size=20, num_kv_pairs=None, tokens_per_pair=4, layout="answers_after"
    )
    assert len(task.example(39, Random(0)).output) == 9
    with pytest.raises(ConfigError, match="vocab_size"):
        task.example(40, Random(0))


@settings(max_examples=40, deadline=None)
@given(extra=st.integers(0, 60), seed=st.integers(0, 2**32), random_filler=st.booleans())
def test_mqar_zoology_layout_asks_for_each_value_right_after_its_query(extra, seed, random_filler):
    options = {"vocab_size": 64, "num_kv_pairs": 3, "random_filler": random_filler}
    zoology = generator("mqar", layout="zoology", **options)
    after = generator("mqar", layout="answers_after", **options)
    length = zoology.min_length + extra
    context, region, given = zoology.example(length, Random(seed))
    tokens, answer, _ = after.example(length, Random(seed))  # the same draws, laid out after SEP
    assert context == tokens[:6] and len(context) + len(region) == length
    predicted = [i for i, g in enumerate(given) if not g]
    assert [region[i] for i in predicted] == answer  # the values, in the order asked
    assert [region[i - 1] for i in predicted] == [t for t in tokens[6:] if t in context[0::2]]
    assert all(region[i] == tokens[6 + i] for i in range(len(region)) if given[i])


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("length", [7, 8, 50])
def test_passkey_key_sits_at_the_requested_depth(depth, length):
    task = generator("passkey", key_digits=3)
    tokens, key = task.at_depth(length, depth, Random(0))
    filler = length - 3 - 2
    assert tokens.index(KEY) == round(depth * filler)
    assert key == solve_passkey(task, length, tokens)


def test_passkey_random_depth_covers_every_prefix_evenly():
    task, rng = generator("passkey", key_digits=2), Random(0)
    prefixes = Counter(task.example(7, rng)[0].index(KEY) for _ in range(4000))
    assert sorted(prefixes) == [0, 1, 2, 3]
    assert all(abs(count / 4000 - 0.25) < 0.04 for count in prefixes.values())


def test_passkey_refuses_a_depth_outside_0_1_per_example():
    with pytest.raises(ConfigError, match="depth"):
        generator("passkey").at_depth(20, 1.01, Random(0))
