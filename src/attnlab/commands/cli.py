"""`attnlab compare DIR`, `attnlab dashboard --project P --group G`, `attnlab archive SWEEP DEST`,
`attnlab results`, `attnlab prune DIR`, `attnlab translate ckpt_path=... input=...`, `attnlab
chat ckpt_path=...`, `attnlab generate ckpt_path=... prompt=...`, `attnlab export
ckpt_path=... out=DIR` and `attnlab tokenize task=lm ...` (see README and the modules
attnlab.commands.prune, translate, chat, generation, stored and tokenize)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.errors import ConfigError, refused_by_machine


def settings_command(
    commands: argparse._SubParsersAction, name: str, example: str, **texts: str
) -> None:
    """A command taking KEY=VALUE settings; `example` shows some."""
    command = commands.add_parser(name, **texts)
    command.add_argument("settings", nargs="*", metavar="KEY=VALUE", help=example)


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="attnlab", description="Compare attnlab runs; generate text with a language model."
    )
    commands = main.add_subparsers(dest="command", required=True)
    compare = commands.add_parser(
        "compare",
        help="a table and plots of every run below a directory, written into it (or --out)",
        description="Writes comparison.md, comparison.csv and PNG plots into DIR, or into OUT.",
    )
    compare.add_argument("directory", type=Path, help="a sweep or run directory (or any above)")
    compare.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write them here instead (e.g. beside archived records)",
    )
    compare.add_argument(
        "--baseline",
        default=None,
        metavar="LABEL",
        help="the configuration the others are compared with, e.g. pe=rope "
        "(default: the first of the sweep)",
    )
    dashboard = commands.add_parser(
        "dashboard",
        help="a W&B report comparing the runs of one group (needs W&B online)",
        description="Builds and saves a W&B report of the runs of GROUP; prints its URL.",
    )
    dashboard.add_argument("--project", default="attnlab")
    dashboard.add_argument("--group", required=True, help="an experiment or sweep directory name")
    dashboard.add_argument("--entity", default=None, help="default: your W&B default entity")
    dashboard.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for W&B")
    archive = commands.add_parser(
        "archive",
        help="copy the records of a sweep's runs (config, metrics, status) for RESULTS.md",
        description="Copies each run's .hydra/config.yaml, overrides, csv/metrics.csv and "
        "status.json from SWEEP to DEST (no checkpoints), e.g. docs/results/runs/<study>.",
    )
    archive.add_argument("sweep", type=Path, help="a sweep or run directory")
    archive.add_argument("destination", type=Path, help="a directory that does not exist yet")
    results = commands.add_parser(
        "results",
        help="regenerate RESULTS.md's and its study pages' tables and plots from docs/results/runs",
        description="Rewrites each <!-- results:STUDY KIND --> block of FILE and of each study "
        "page beside it (docs/results/PAGE/README.md) from the run records in "
        "docs/results/runs/STUDY, and draws STUDY.png beside the page.",
    )
    results.add_argument("--file", type=Path, default=Path("RESULTS.md"))
    results.add_argument(
        "--check",
        action="store_true",
        help="write nothing; fail if a table or figure is out of date",
    )
    settings_command(
        commands,
        "translate",
        "e.g. ckpt_path=<run>/checkpoints/epoch_NNN.ckpt input=news.en output=news.de",
        help="translate a file (or standard input) with a translation model checkpoint",
        description="Writes the translation of every line of input, in order, to output. "
        "Settings are key=value: ckpt_path (required), input (a file, or - for standard "
        "input; required), output (a file, or - for standard output: the default), max_tokens "
        "(source tokens a batch, times the beam: 4096), and the run's decode settings to "
        "change: decode.strategy (greedy, beam, top_k, nucleus), decode.beam, decode.top_k, "
        "decode.top_p, decode.temperature, decode.seed, decode.length_penalty, "
        "decode.no_repeat_ngram, decode.max_len.",
    )
    settings_command(
        commands,
        "chat",
        "e.g. ckpt_path=... input=talks.txt",
        help="talk to a dialogue model checkpoint, or answer conversations read from a file",
        description="Without input: type a turn, read the model's reply; an empty line ends. "
        "With input=<file or ->: one conversation a line, turns ended by __eou__; the reply to "
        "each is written, one a line, to output (default: standard output). Also max_tokens "
        "and the decode.* settings of translate.",
    )
    prune = commands.add_parser(
        "prune",
        help="free the disk that finished runs below a directory no longer need",
        description="For each completed run below DIR: removes checkpoints/last.ckpt and "
        "drops the optimizer state from its best checkpoint; says how much it freed. Runs "
        "that are running, failed or were interrupted are left whole.",
    )
    prune.add_argument("directory", type=Path, help="a run, a sweep, or logs/")
    settings_command(
        commands,
        "generate",
        "e.g. ckpt_path=<run>/checkpoints/"
        "last.ckpt prompt=ROMEO: max_new_tokens=300 decode.strategy=nucleus decode.seed=1",
        help="continue a prompt with a language model checkpoint (task=lm)",
        description="Prints the prompt and its continuation by the model of the checkpoint ckpt_path. Settings "
        "are key=value in Hydra's override grammar: ckpt_path (required), prompt (default: "
        "the run's sample_prompt; \\n is a line break), max_new_tokens (default 200, or as "
        "many as the positions allow), samples (1), cache (true), decode.strategy (greedy, "
        "top_k, nucleus: the default), decode.top_k, decode.top_p, decode.temperature, "
        "decode.seed (default: the run's); for a RoPE model, the context extension eval.py "
        "also takes: pe.scaling (linear, ntk, yarn), pe.scaling_factor, pe.original_max_len, "
        "pe.yarn_alpha, pe.yarn_beta.",
    )
    settings_command(
        commands,
        "tokenize",
        "e.g. task=lm task.data.source=corpus task.data.dir=<corpus directory>",
        help="train a language model's tokenizer and encode its data into the cache, once",
        description="Takes train.py's settings (task=lm or experiment=lm_*, task.data.*) and "
        "builds what runs with them read: the tokenizer and each split's token stream, in "
        "parallel processes (task.data.num_threads), going on where a killed build stopped.",
    )
    settings_command(
        commands,
        "export",
        "ckpt_path=<run>/checkpoints/epoch_NNN.ckpt out=<new directory>",
        help="write a checkpoint's model as safetensors, a JSON config and tokenizer files",
        description="Writes into the new directory out: model.safetensors (the weights), "
        "config.json (hyperparameters and the run's record) and the tokenizer files. eval.py, "
        "translate, chat and generate take that directory as ckpt_path; loading it runs no code.",
    )
    return main


def export_settings(args: list[str]) -> dict[str, str]:
    """ckpt_path and out of `attnlab export`'s key=value arguments, both required."""
    from attnlab.commands.arguments import parse_setting

    names = ("ckpt_path", "out")
    settings = dict(parse_setting(a, "export", names, names, names.__contains__) for a in args)
    if missing := [name for name in names if name not in settings]:
        raise ConfigError(f"export needs {' and '.join(missing)}: pass ckpt_path=... out=<dir>")
    return settings


def print_exported(args: list[str]) -> None:
    from attnlab.commands.files import check_output
    from attnlab.export import export

    settings = export_settings(args)
    read = {"ckpt_path": settings["ckpt_path"]}
    check_output("out", settings["out"], read, "export", "pass out=<a new directory>")
    files = export(settings["ckpt_path"], settings["out"])
    print(f"wrote {', '.join(files)} into {settings['out']}")


MODEL_COMMANDS = ("generate", "chat", "export", "translate")  # they run a model


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.command in MODEL_COMMANDS:
        from attnlab.tensors import flush_denormals

        flush_denormals()
    try:
        if args.command == "compare":
            from attnlab.reports.families import compare

            out = args.out or args.directory
            comparison = compare(args.directory, out, args.baseline)
            print(comparison.table())
            print(f"\nwrote {out / 'comparison.md'}, comparison.csv and", end=" ")
            print(f"{len(comparison.plots)} plots")
        elif args.command == "dashboard":
            from attnlab.compare.dashboard import dashboard

            print(dashboard(args.project, args.group, args.entity, args.timeout))
        elif args.command == "archive":
            from attnlab.reports.results import archive

            count = archive(args.sweep, args.destination)
            print(f"archived the records of {count} runs in {args.destination}")
        elif args.command == "generate":
            from attnlab.commands.generate import print_generated

            print_generated(args.settings, sys.stdout)
        elif args.command == "prune":
            print_pruned(args.directory)
        elif args.command == "chat":
            from attnlab.commands.chat import chat

            chat(args.settings)
        elif args.command == "export":
            print_exported(args.settings)
        elif args.command == "tokenize":
            from attnlab.commands.tokenize import tokenize

            print("\n".join(tokenize(args.settings)))
        elif args.command == "translate":
            from attnlab.commands.translate import translate

            translate(args.settings)
        else:
            update_results(args.file, args.check)
    except ConfigError as error:
        raise SystemExit(f"attnlab: {error}") from None
    except Exception as error:  # a full disk, a read-only place: what to do, in one sentence
        if (refusal := refused_by_machine(error)) is None:
            raise
        raise SystemExit(f"attnlab: {refusal}") from None


def print_pruned(directory: Path) -> None:
    from attnlab.commands.prune import prune

    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory: pass a run or sweep directory")
    pruned = prune(directory)
    print(
        f"{pruned.runs} finished runs below {directory}: removed or rewrote {pruned.files} "
        f"checkpoints, freed {pruned.freed / 2**20:,.1f} MiB"
    )
    for why in pruned.damaged:
        print(f"left whole, as its status cannot be read: {why}")


def update_results(path: Path, check: bool) -> None:
    """Rebuild the blocks of RESULTS.md (`path`) and of every study page beside it; with
    `check`, write nothing and fail naming each page and block out of date."""
    from attnlab.files import write_text
    from attnlab.reports.results import regenerate_pages

    if not path.is_file():
        raise ConfigError(f"{path} does not exist: pass --file <RESULTS.md>")
    root = path.resolve().parent
    done = regenerate_pages(root, draw=not check)
    if check:
        fail_if_out_of_date(root, done.texts, done.unlinked)
        print(f"{path} and its {len(done.texts) - 1} study pages match their run records")
        return
    changed = [page for page, text in done.texts.items() if text != page.read_text()]
    for page in changed:
        write_text(page, done.texts[page])
    for figure in done.unlinked:
        figure.unlink()
    kept = done.reading.bootstraps.write()
    print(
        f"regenerated the tables of {path} and its {len(done.texts) - 1} study pages: "
        f"{len(changed)} pages changed, {len(done.unlinked)} unlinked figures removed, "
        f"{len(kept)} files of paired bootstraps written"
    )


def fail_if_out_of_date(root: Path, texts: dict[Path, str], unlinked: list[Path]) -> None:
    from attnlab.reports.results import differing_blocks

    stale = [
        f"{page.relative_to(root)} (block {mark})"
        for page, text in texts.items()
        for mark in differing_blocks(page.read_text(), text)
    ]
    if stale:
        raise ConfigError(
            f"{'; '.join(stale)} {'is' if len(stale) == 1 else 'are'} out of date with its run "
            "records: run `attnlab results`"
        )
    if unlinked:
        raise ConfigError(
            f"{', '.join(str(f.relative_to(root)) for f in unlinked)} "
            f"{'is' if len(unlinked) == 1 else 'are'} linked by no block: run `attnlab "
            "results`, which removes figures of blocks that are gone"
        )


if __name__ == "__main__":
    main()
