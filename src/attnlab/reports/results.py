"""RESULTS.md's tables and plots, generated from the records of the runs: `attnlab results`.

`attnlab archive SWEEP_DIR DEST` copies what each run below SWEEP_DIR recorded (its config,
overrides, metrics and status; not its checkpoints) to DEST, conventionally
docs/results/runs/<study>/, so that the results can be regenerated from the repository.
RESULTS.md is the index of the studies; each study has a page of its own,
docs/results/<page>/README.md, and a page (or RESULTS.md) marks where a study's table goes:

    <!-- results:<study> <kind> -->              or, comparing test BLEU with a baseline:
    <!-- results:<study> <kind> baseline=<a configuration's label, e.g. synthesizer=dot> -->
    ... generated: the table and a link to its heat map ...
    <!-- /results:<study> -->

Options come in any order (`compare/blocks.py` reads them), and so do a label's `key=value`
pairs (their order in the tables follows the records read). `among=<label>;<label>;...`
(labels without the task) keeps
only those configurations, in that order, and draws no plot: a claim about some of a study's
configurations is judged among them alone (Kazemnejad et al. rank five encodings, not
twelve). A generalization block then
gives, instead of the tables by length that the study's full block holds, their mean
reciprocal ranks among themselves and the verdict rule's answer for each pair of them.
`margin=<BLEU>`, with a baseline, adds two one-sided tests of equivalence within ±margin to
the paired bootstrap (for a claim of closeness: "competitive", "within 0.2 BLEU").
`beside=<study>;<study>...` reads those studies' records with the block's own, named
`<study>/<run>`: new configurations judged against another study's baselines (study 8's
mechanisms against study 7's encodings) without running the baselines again.
`per_task=<key>;<key>...` names settings that the block's own runs match to each task (T5's
`pe.max_distance` to each task's training distances): they read `per_task` in the labels, so
that those runs are one configuration across tasks, and the block says each task's value.

Each block opens with the study's budget read from the runs' configs and statuses (steps,
learning rate, warm-up, schedule, checkpoint selection, early stopping), so that the text
cannot drift from what ran. `attnlab results` rewrites each block of every page from
docs/results/runs/<study>/ (each study's records read once) and draws <study>.png beside the
page that holds the block (<study>_sinks.png for a sinks block, so that a study can hold
both its perplexities and its sinks), stamped with a digest of the records it was drawn
from; a figure it drew that no block links any more is removed. The paired bootstraps are
kept beside the records (`compare.bootstraps`). `attnlab results --check` writes nothing and
fails naming each page and block that differs from what the records give, a figure whose
stamp differs from their digest, or a figure no block links. The kinds of table, and their
plot (each family declares its own in its report.py, `configurations` is
`attnlab.compare.report`'s; `attnlab.reports.families` merges them):

    probe           token and sequence accuracy beside what theory predicts (see
                    `attnlab.studies.probe`), the rows that disagree in bold; accuracy by
                    position, configurations × positions
    extrapolation   accuracy on the trained lengths, at trained positions of longer
                    sequences and at the positions never trained; accuracy by position
    configurations  every test metric with ties within the seed spread, parameters and
                    training tokens/s; the validation loss curves
    lengths         language models (task=lm): test perplexity at each evaluation length, in
                    non-overlapping and in sliding windows, the mean and its 95% t interval
                    over the seeds, n/a past the model's positions; perplexity by length
                    (`attnlab.compare.lengths`)
    sinks           language models tested with task.system.sink_windows: each layer's
                    attention sink by evaluation length, the mean and its 95% t interval over
                    the seeds, under uniform attention's; a panel per layer (`compare.sinks`)
    generalization  the synthetic tasks: test exact match in each bucket of lengths per task,
                    the mean and its 95% t interval over the seeds, and each configuration's
                    mean reciprocal rank across tasks (the task its unit); exact match by length
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.compare.blocks import bleu_margin, block_options, named, set_per_task
from attnlab.compare.bootstraps import Bootstraps
from attnlab.compare.budget import budget
from attnlab.compare.lengths import STAGE
from attnlab.compare.report import swept_keys
from attnlab.compare.runs import Run, find_runs
from attnlab.compare.seeds import configurations
from attnlab.compare.significance import HYPOTHESES, bootstrap_table
from attnlab.errors import ConfigError
from attnlab.plots import stamp, stamped
from attnlab.reports.families import KINDS

RECORD = (
    ".hydra/config.yaml",
    ".hydra/overrides.yaml",
    "csv/metrics.csv",
    "status.json",
    f"lengths/{STAGE}.json",  # a language model's: which evaluation lengths it could take
    HYPOTHESES,  # a sequence-to-sequence model's test output, for the paired bootstrap
)
BLOCK = re.compile(
    r"(?P<open><!-- results:(?P<study>[\w-]+) (?P<kind>\w+)(?P<options>(?: \S+)*?) -->\n)"
    r"(?P<body>.*?)(?P<close><!-- /results:(?P=study) -->)",
    re.DOTALL,
)


def archive(sweep: Path, destination: Path) -> int:
    """Copy the record of every run below `sweep` into `destination`; the number of runs."""
    runs = sorted({config.parent.parent for config in sweep.rglob(".hydra/config.yaml")})
    if not runs:
        raise ConfigError(f"{sweep} holds no runs (no .hydra/config.yaml below it)")
    if destination.exists():
        raise ConfigError(f"{destination} exists: remove it first, or archive to a new directory")
    if damaged := [run.damaged for run in find_runs(sweep) if run.damaged]:
        raise ConfigError(f"{damaged[0]}: restore it, or move its run out of {sweep} to archive")
    for run in runs:
        for name in RECORD:
            if (run / name).is_file():
                target = destination / run.relative_to(sweep) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run / name, target)
    return len(runs)


def block(
    study: str,
    kind: str,
    page: Path,
    reading: Reading,
    draw: bool,
    baseline: str | None = None,
    among: str | None = None,
    margin: str | None = None,
    beside: str | None = None,
    per_task: str | None = None,
) -> str:
    """The generated text of one study's block on `page`, from <root>/docs/results/runs/<study>
    (its figure beside the page); with a
    baseline (a configuration's label), the paired bootstrap of test BLEU against it; with
    `among` (labels joined by ";"), those configurations alone and no plot; with `beside`
    (studies joined by ";"), their runs too; with `per_task` (keys joined by ";"), the
    block's own runs read "per_task" for those keys, and a sentence gives each task's value."""
    root = reading.root
    where = block_name(page, root, study)
    if kind not in KINDS:
        raise ConfigError(f"{where} has kind {kind!r}: use one of {list(KINDS)}")
    records = root / "docs" / "results" / "runs" / study
    runs, others = reading.runs(records, study), beside.split(";") if beside else []
    if repeated := sorted({o for o in others if o == study or others.count(o) > 1}):
        raise ConfigError(
            f"{where} reads {', '.join(repeated)} twice (beside= names it again): "
            "name each other study once, and never the block's own"
        )
    matched_keys = per_task.split(";") if per_task else []
    runs, matched = set_per_task(runs, matched_keys, where) if matched_keys else (runs, "")
    for other in others:
        found = reading.runs(records.parent / other, other)
        runs += [dataclasses.replace(run, name=f"{other}/{run.name}") for run in found]
    tasks, reads = {run.setting("task.name") for run in runs}, KINDS[kind].task
    if reads is not None and tasks != {reads}:
        raise ConfigError(
            f"{where} has kind {kind}, which reads {reads} runs, but its "
            f"records are of task {', '.join(sorted(map(str, tasks)))}: use kind configurations"
        )
    keys = swept_keys(runs)  # a per-task setting labels its runs even where nothing else is swept
    configs = configurations(runs, keys + [key for key in matched_keys if key not in keys])
    if among is not None:
        configs = named(configs, among.split(";"), where)
        runs = [run for config in configs for run in config.runs]
    contrasts = KINDS[kind].contrasts
    table = contrasts if among is not None and contrasts else KINDS[kind].table
    told = table(configs, baseline) if KINDS[kind].baseline else table(configs)
    text = budget(runs) + "\n\n" + (matched + "\n\n" if matched else "") + told + "\n"
    if baseline is not None and kind == "configurations":  # test BLEU's: seq2seq runs
        test = reading.bootstraps.test(records)
        paired = bootstrap_table(configs, baseline, root, bleu_margin(where, margin), test)
        text += "\n" + paired + "\n"
    elif margin is not None:
        raise ConfigError(
            f"{where} has margin={margin} but no baseline: the equivalence "
            "test compares with a baseline, so add baseline=<a configuration's label>"
        )
    if among is not None:
        return text
    image = page.parent / f"{study}{KINDS[kind].figure}.png"
    source = records_digest(runs)
    if draw:
        if image in KINDS[kind].plot(configs, image):
            stamp(image, source)
        else:  # nothing to draw now: no figure of earlier records stays linked
            image.unlink(missing_ok=True)
    elif image.is_file() and stamped(image) != source:
        raise ConfigError(
            f"{image.relative_to(root)} was drawn from other records than "
            f"{records.relative_to(root)} holds: run `attnlab results`"
        )
    if image.is_file():
        reading.figures.add(image)
        text += f"\n![{study}: {KINDS[kind].caption}]({image.name})\n"
    return text


def study_runs(records: Path, study: str) -> list[Run]:
    """The runs archived in `records`, each record intact."""
    runs = find_runs(records) if records.is_dir() else []
    if not runs:
        raise ConfigError(f"no run records for {study} in {records}: run `attnlab archive`")
    if damaged := [run.damaged for run in runs if run.damaged]:
        raise ConfigError(
            f"{damaged[0]}: the tables of {study} are computed from intact records only; restore "
            "the file (git checkout docs/results) or archive the study again"
        )
    return runs


def records_digest(runs: list[Run]) -> str:
    """A digest of the runs' archived records: what a study's figure is drawn from."""
    digest = hashlib.sha256()
    for run in sorted(runs, key=lambda run: run.name):
        digest.update(Path(run.name).as_posix().encode() + b"\0")
        for name in RECORD:
            path = run.path / name
            digest.update(path.read_bytes() if path.is_file() else b"")
            digest.update(b"\0")
    return f"records sha256 {digest.hexdigest()}"


@dataclass
class Reading:
    """What the pages of one root share as they are regenerated: each study's records, read
    once; the paired bootstraps, kept and computed; the figures their blocks link."""

    root: Path
    bootstraps: Bootstraps = field(default_factory=Bootstraps)
    figures: set[Path] = field(default_factory=set)
    read: dict[Path, list[Run]] = field(default_factory=dict)

    def runs(self, records: Path, study: str) -> list[Run]:
        if records not in self.read:
            self.read[records] = study_runs(records, study)
        return list(self.read[records])


def block_name(page: Path, root: Path, study: str) -> str:
    """How an error names a block: its page, from the root, and its study."""
    try:
        shown = page.resolve().relative_to(root.resolve())
    except ValueError:
        shown = page
    return f"{shown} block {study}"


def pages(root: Path) -> list[Path]:
    """RESULTS.md, the index, and each study's page: docs/results/<page>/README.md."""
    found = sorted((root / "docs" / "results").glob("*/README.md"))
    return [root / "RESULTS.md", *(page for page in found if page.parent.name != "runs")]


def regenerate(page: Path, draw: bool = True, reading: Reading | None = None) -> str:
    """`page` with every block rebuilt from its records (plots drawn beside it if `draw`);
    alone, the page's directory is the root its records are read below (RESULTS.md's)."""
    reading = reading or Reading(page.resolve().parent)

    def rebuilt(m: re.Match[str]) -> str:
        options = block_options(block_name(page, reading.root, m["study"]), m["options"])
        text = block(m["study"], m["kind"], page, reading, draw, **options)
        return m["open"] + text + m["close"]

    return BLOCK.sub(rebuilt, page.read_text())


def differing_blocks(text: str, regenerated: str) -> list[str]:
    """The opening marks of the blocks of `text` that `regenerated` rewrote."""
    pairs = zip(BLOCK.finditer(text), BLOCK.finditer(regenerated), strict=True)
    return [old["open"].strip() for old, new in pairs if old["body"] != new["body"]]


def unlinked_figures(reading: Reading, places: list[Path]) -> list[Path]:
    """The figures `attnlab results` drew (stamped) in `places` that no block links now."""
    drawn = (figure for place in places for figure in sorted(place.glob("*.png")))
    return [f for f in drawn if f not in reading.figures and stamped(f) is not None]


@dataclass(frozen=True)
class Regenerated:
    texts: dict[Path, str]  # each page's text, its blocks rebuilt
    unlinked: list[Path]  # figures of earlier blocks, linked by none now
    reading: Reading


def regenerate_pages(root: Path, draw: bool) -> Regenerated:
    """Every page below `root` rebuilt (nothing written but figures, if `draw`)."""
    reading = Reading(root)
    texts = {page: regenerate(page, draw, reading) for page in pages(root) if page.is_file()}
    places = sorted({page.parent for page in texts} | {root / "docs" / "results"})
    return Regenerated(texts, unlinked_figures(reading, places), reading)
