"""`attnlab compare DIR` and `attnlab dashboard --project P --group G` (see README)."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.config import ConfigError


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="attnlab", description="Compare attnlab runs.")
    commands = main.add_subparsers(dest="command", required=True)
    compare = commands.add_parser(
        "compare",
        help="a table and plots of every run below a directory, written into it",
        description="Writes comparison.md, comparison.csv and PNG plots into DIR.",
    )
    compare.add_argument("directory", type=Path, help="a sweep or run directory (or any above)")
    dashboard = commands.add_parser(
        "dashboard",
        help="a W&B report comparing the runs of one group (needs W&B online)",
        description="Builds and saves a W&B report of the runs of GROUP; prints its URL.",
    )
    dashboard.add_argument("--project", default="attnlab")
    dashboard.add_argument("--group", required=True, help="an experiment or sweep directory name")
    dashboard.add_argument("--entity", default=None, help="default: your W&B default entity")
    dashboard.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for W&B")
    return main


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        if args.command == "compare":
            from attnlab.compare.report import compare

            comparison = compare(args.directory)
            print(comparison.table())
            print(f"\nwrote {args.directory / 'comparison.md'}, comparison.csv and", end=" ")
            print(f"{len(comparison.plots)} plots")
        else:
            from attnlab.compare.dashboard import dashboard

            print(dashboard(args.project, args.group, args.entity, args.timeout))
    except ConfigError as error:
        raise SystemExit(f"attnlab: {error}") from None


if __name__ == "__main__":
    main()
