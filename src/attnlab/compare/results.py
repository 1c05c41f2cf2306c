"""RESULTS.md's tables and plots, generated from the records of the runs: `attnlab results`.

`attnlab archive SWEEP_DIR DEST` copies what each run below SWEEP_DIR recorded (its config,
overrides, metrics and status; not its checkpoints) to DEST, conventionally
docs/results/runs/<study>/, so that the results can be regenerated from the repository.
RESULTS.md marks where a study's table goes:

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
cannot drift from what ran. `attnlab results` rewrites each block from docs/results/runs/<study>/ and draws
docs/results/<study>.png (<study>_sinks.png for a sinks block, so that a study can hold both
its perplexities and its sinks), stamped with a digest of the records it was drawn from.
`attnlab results --check` writes nothing and fails when a block differs from what the
records give, or a figure's stamp from their digest. The kinds of table, and their plot:

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnlab.compare.blocks import bleu_margin, block_options, named, set_per_task
from attnlab.compare.budget import budget
from attnlab.compare.lengths import STAGE
from attnlab.compare.report import (
    configurations_table,
    plot_by_position,
    plot_configuration_curves,
    swept_keys,
)
from attnlab.compare.runs import Run, find_runs
from attnlab.compare.seeds import Configuration, configurations
from attnlab.compare.significance import HYPOTHESES, bootstrap_table
from attnlab.errors import ConfigError
from attnlab.plots import stamp, stamped
from attnlab.tasks.lm.report import lengths_table, plot_ppl_by_length
from attnlab.tasks.lm.sinks import plot_sinks, sinks_table
from attnlab.tasks.probe.report import extrapolation_table, probe_table
from attnlab.tasks.synthetic.report import (
    generalization_contrasts,
    generalization_table,
    plot_accuracy_by_length,
)

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


@dataclass(frozen=True)
class Kind:
    table: Callable[..., str]  # configurations -> text; with `baseline`, also the block's
    plot: Callable[[list[Configuration], Path], list[Path]]
    caption: str
    task: str | None = None  # the task whose runs it reads; None: any
    contrasts: Callable[[list[Configuration]], str] | None = None  # an `among=` block's table
    figure: str = ""  # added to the study's name to name its figure
    baseline: bool = False  # its tables take the block's `baseline=` (a label, or None)


def validation_loss(configs: list[Configuration], path: Path) -> list[Path]:
    return plot_configuration_curves(configs, "val/loss", path)


KINDS = {
    "probe": Kind(probe_table, plot_by_position, "accuracy by position", "probe"),
    "extrapolation": Kind(extrapolation_table, plot_by_position, "accuracy by position", "probe"),
    "configurations": Kind(
        configurations_table, validation_loss, "validation loss by step", baseline=True
    ),
    "lengths": Kind(lengths_table, plot_ppl_by_length, "perplexity by evaluation length", "lm"),
    "sinks": Kind(
        sinks_table, plot_sinks, "attention sink by evaluation length", "lm", figure="_sinks"
    ),
    "generalization": Kind(
        generalization_table,
        plot_accuracy_by_length,
        "exact match by length",
        contrasts=generalization_contrasts,
        baseline=True,
    ),
}


def block(
    study: str,
    kind: str,
    root: Path,
    draw: bool,
    baseline: str | None = None,
    among: str | None = None,
    margin: str | None = None,
    beside: str | None = None,
    per_task: str | None = None,
) -> str:
    """The generated text of one study's block, from root/docs/results/runs/<study>; with a
    baseline (a configuration's label), the paired bootstrap of test BLEU against it; with
    `among` (labels joined by ";"), those configurations alone and no plot; with `beside`
    (studies joined by ";"), their runs too; with `per_task` (keys joined by ";"), the
    block's own runs read "per_task" for those keys, and a sentence gives each task's value."""
    if kind not in KINDS:
        raise ConfigError(f"RESULTS.md block {study} has kind {kind!r}: use one of {list(KINDS)}")
    records = root / "docs" / "results" / "runs" / study
    runs, others = study_runs(records, study), beside.split(";") if beside else []
    if repeated := sorted({o for o in others if o == study or others.count(o) > 1}):
        raise ConfigError(
            f"RESULTS.md block {study} reads {', '.join(repeated)} twice (beside= names it again): "
            "name each other study once, and never the block's own"
        )
    matched_keys = per_task.split(";") if per_task else []
    runs, matched = set_per_task(runs, matched_keys, study) if matched_keys else (runs, "")
    for other in others:
        found = study_runs(records.parent / other, other)
        runs += [dataclasses.replace(run, name=f"{other}/{run.name}") for run in found]
    tasks, reads = {run.setting("task.name") for run in runs}, KINDS[kind].task
    if reads is not None and tasks != {reads}:
        raise ConfigError(
            f"RESULTS.md block {study} has kind {kind}, which reads {reads} runs, but its "
            f"records are of task {', '.join(sorted(map(str, tasks)))}: use kind configurations"
        )
    keys = swept_keys(runs)  # a per-task setting labels its runs even where nothing else is swept
    configs = configurations(runs, keys + [key for key in matched_keys if key not in keys])
    if among is not None:
        configs = named(configs, among.split(";"), study)
        runs = [run for config in configs for run in config.runs]
    contrasts = KINDS[kind].contrasts
    table = contrasts if among is not None and contrasts else KINDS[kind].table
    told = table(configs, baseline) if KINDS[kind].baseline else table(configs)
    text = budget(runs) + "\n\n" + (matched + "\n\n" if matched else "") + told + "\n"
    if baseline is not None and kind == "configurations":  # test BLEU's: seq2seq runs
        text += "\n" + bootstrap_table(configs, baseline, root, bleu_margin(study, margin)) + "\n"
    elif margin is not None:
        raise ConfigError(
            f"RESULTS.md block {study} has margin={margin} but no baseline: the equivalence "
            "test compares with a baseline, so add baseline=<a configuration's label>"
        )
    if among is not None:
        return text
    image = root / "docs" / "results" / f"{study}{KINDS[kind].figure}.png"
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
        text += f"\n![{study}: {KINDS[kind].caption}]({image.relative_to(root)})\n"
    return text


def study_runs(records: Path, study: str) -> list[Run]:
    """The runs archived in `records`, each record intact."""
    runs = find_runs(records) if records.is_dir() else []
    if not runs:
        raise ConfigError(f"no run records for {study} in {records}: run `attnlab archive`")
    if damaged := [run.damaged for run in runs if run.damaged]:
        raise ConfigError(
            f"{damaged[0]}: RESULTS.md's {study} is computed from intact records only; restore "
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


def regenerate(results_md: Path, draw: bool = True) -> str:
    """RESULTS.md with every block rebuilt from its records (plots drawn if `draw`)."""
    root = results_md.resolve().parent

    def rebuilt(m: re.Match[str]) -> str:
        options = block_options(m["study"], m["options"])
        text = block(m["study"], m["kind"], root, draw, **options)
        return m["open"] + text + m["close"]

    return BLOCK.sub(rebuilt, results_md.read_text())
