"""What a figure calls its curves, and which curves share a panel.

A configuration's label is its swept overrides, `pe=rope,norm=l2`, perhaps followed by notes
in brackets (` (3 seeds)`, ` (n/a past 32)`). A panel holds at most MOST curves, so that each
keeps a colour, line style and marker of its own (`attnlab.plots`): a larger set is split
into families by the value of one swept key (norm=softmax, the other normalizers), the key
that needs the fewest panels, small families sharing a panel and a large one split evenly;
where no key groups them (a run's name for a label, a full factorial), in even chunks in
the table's order. In a panel, a key that
every label shares a value of says nothing: labels keep the keys that vary there, and only
the values where one key varies (`rope`, not `pe=rope`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

MOST = 8  # curves to a panel: the palette's colours
PAIR = re.compile(r",(?=[^,=\[\]{}]+=)")  # a comma that starts the next key=value
NOTES = re.compile(r"((?: \([^()]*\))*)$")  # the bracketed notes that end a label
Pairs = dict[str, str]


def parts(label: str) -> tuple[Pairs, str]:
    """A label's key=value pairs in their order ({} where it is not made of them: a run's
    name) and the notes after them."""
    notes = NOTES.search(label)
    suffix = notes.group(1) if notes else ""
    head = label[: len(label) - len(suffix)]
    pieces = [piece.partition("=") for piece in PAIR.split(head)]
    if not all(equals for _, equals, _ in pieces):
        return {}, suffix
    return {key: value for key, _, value in pieces}, suffix


def families(labels: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The labels split into panels of at most MOST, each with a title saying what it holds
    ("" where all fit in one): grouped by the value of the key that needs the fewest panels
    (`by_value`), or in chunks in their order where no key groups them into fewer."""
    if len(labels) <= MOST:
        return [("", list(labels))]
    settings = [parts(label)[0] for label in labels]
    keys = [k for k in dict.fromkeys(k for found in settings for k in found)
            if all(k in found for found in settings)]  # fmt: skip
    options = [
        (len(set(values)), by_value(list(labels), values, key))
        for key in keys
        if len(set(values := [found[key] for found in settings])) > 1
    ]
    fewest = math.ceil(len(labels) / MOST)
    # as few panels as can be, then the key of fewest values (norm: softmax or l2, not each pe)
    best = min(options, key=lambda option: (len(option[1]), option[0]), default=(0, None))[1]
    if best is None or len(best) > fewest + 1:
        return chunks(list(labels), "configurations")
    return best


def by_value(labels: list[str], values: list[str], key: str) -> list[tuple[str, list[str]]]:
    """The labels grouped by their value of `key`, in order: a group larger than MOST split
    evenly, smaller ones sharing panels of at most MOST (the first with room takes each);
    each panel titled with its values."""
    grouped: dict[str, list[str]] = {}
    for label, value in zip(labels, values, strict=True):
        grouped.setdefault(value, []).append(label)
    panels: list[tuple[list[str], list[str], bool]] = []  # values, labels, whether it has room
    for value, members in grouped.items():
        if len(members) > MOST:
            split = chunks(members, "")
            panels += [([f"{value} ({n + 1} of {len(split)})"], chunk, False)
                       for n, (_, chunk) in enumerate(split)]  # fmt: skip
            continue
        room = next((p for p in panels if p[2] and len(p[1]) + len(members) <= MOST), None)
        if room is None:
            panels.append(([value], list(members), True))
        else:
            room[0].append(value)
            room[1].extend(members)
    return [(f"{key}: {', '.join(names)}", members) for names, members, _ in panels]


def chunks(labels: list[str], what: str) -> list[tuple[str, list[str]]]:
    """`labels` in even chunks of at most MOST, each titled with its place among them."""
    count = math.ceil(len(labels) / MOST)
    step = math.ceil(len(labels) / count)
    return [
        (f"{what} {start + 1}–{min(start + step, len(labels))} of {len(labels)}".strip(),
         labels[start : start + step])
        for start in range(0, len(labels), step)
    ]  # fmt: skip


def short_labels(labels: Sequence[str]) -> tuple[str, str, dict[str, str]]:
    """What the labels of one panel share, the key that alone varies among them and the
    notes every label has, and each label without them; labels not made of key=value pairs
    stay whole."""
    found = [parts(label) for label in labels]
    if not labels or not all(settings for settings, _ in found):
        return "", "", {label: label for label in labels}
    keys = list(dict.fromkeys(key for settings, _ in found for key in settings))
    varied = [k for k in keys if len({settings.get(k, "") for settings, _ in found}) > 1]
    notes = {suffix for _, suffix in found}
    common = notes.pop().strip() if len(notes) == 1 else ""
    named = {}
    for label, (settings, suffix) in zip(labels, found, strict=True):
        if len(varied) == 1:
            text = settings.get(varied[0], "") or "(unset)"
        else:
            text = ", ".join(f"{k}={settings[k]}" for k in varied if settings.get(k))
        named[label] = (text or label) + ("" if common else suffix)
    if len(set(named.values())) < len(named):  # shortened too far: keep them whole
        return "", "", {label: label for label in labels}
    return (varied[0] if len(varied) == 1 else ""), common, named


LAYER = re.compile(r"(?:(?P<part>encoder|decoder)\.)?(?:\w+\.)?blocks\.(?P<n>\d+)\.(?P<kind>.+)")


def layer_name(module: str) -> str:
    """An attention layer's module path as a figure says it: `stack.blocks.0.self_attn` is
    layer 1, `decoder.blocks.1.cross.attn` decoder layer 2 (cross); other paths stay."""
    found = LAYER.fullmatch(module)
    if found is None:
        return module
    text = f"layer {int(found['n']) + 1}"
    if found["part"]:
        text = f"{found['part']} {text}"
    return f"{text} (cross)" if "cross" in found["kind"] else text
