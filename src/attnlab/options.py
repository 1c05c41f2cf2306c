"""Print every option of every config group as a Markdown table: `python -m attnlab.options`.

The README's options table is this output (a test keeps the two in sync).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = (
    "task", "pe", "norm", "synthesizer", "model", "trainer", "logger", "callbacks", "extras",
    "experiment", "hparams_search", "debug", "paths", "hydra", "hydra/launcher",
)  # fmt: skip


def first_comment(path: Path) -> str:
    """The first comment line of a YAML file that is not a Hydra directive."""
    for line in path.read_text().splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ")
    raise ValueError(f"{path} has neither a description nor a leading comment to show")


def option_rows(group: str, conf: Path = CONF) -> list[tuple[str, str, str]]:
    """(option, description, paper) for each YAML of a group; options without a
    `description` key describe themselves in their first comment line."""
    rows = []
    for path in sorted((conf / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        description = node.get("description") or first_comment(path)
        cells = (f"`{group}={path.stem}`", description, node.get("paper", ""))
        rows.append(tuple(cell.replace("|", "\\|") for cell in cells))
    return rows


def options_table(conf: Path = CONF) -> str:
    lines = ["| option | what it is | source |", "|---|---|---|"]
    for group in GROUPS:
        lines += [f"| {o} | {d} | {p} |" for o, d, p in option_rows(group, conf)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(options_table())
