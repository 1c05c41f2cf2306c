"""A table's rows as dicts (column -> cell) and their Markdown: the form every report of
`attnlab compare` and every RESULTS.md block writes."""

import math

Row = dict[str, object]


def format_cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[Row]) -> str:
    columns = list(dict.fromkeys(key for cells in rows for key in cells))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join(format_cell(cells.get(c)) for c in columns) + " |" for cells in rows
    ]
    return "\n".join(lines)
