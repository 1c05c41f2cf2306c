"""The packages from a checkpoint to RESULTS.md import one way: every `import` of attnlab's
modules (at the top, inside functions, under `if TYPE_CHECKING`), read with `ast`, makes an
edge between the top-level packages of the two modules; among `LAYERS` those edges form no
cycle, and the statistics (`attnlab.compare`) import no task family."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import attnlab

SOURCE = Path(attnlab.__file__).parent
# the packages whose imports must go one way (a module maps to its top-level package)
LAYERS = ("compare", "tasks", "runner", "stored", "decoding", "systems", "export", "reports")


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[str, int]]:
    """Every module `path` imports (absolute names, relative ones resolved) and its line."""
    package = module_name(path).split(".")
    return imports(path.read_text(), package if path.name == "__init__.py" else package[:-1])


def imports(text: str, package: list[str]) -> list[tuple[str, int]]:
    """The modules a module of `package` (its parts) imports in `text`, wherever the
    statement is, each with its line; `from m import x` gives m and m.x (x may be a module)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((module, node.lineno))
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def top_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "attnlab" and len(parts) > 1 else None


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importer's package, imported's package) -> where: `module:line imports name`."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        name = module_name(path)
        source = top_package(name)
        for target_module, line in imported(path):
            target = top_package(target_module)
            if source in LAYERS and target in LAYERS and target != source:
                where = f"{name}:{line} imports {target_module}"
                edges.setdefault((source, target), []).append(where)
    return edges


def cycle(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """A cycle of packages ([a, b, ..., a]), or [] if there is none (depth-first search)."""
    after: dict[str, list[str]] = {}
    for source, target in sorted(edges):
        after.setdefault(source, []).append(target)
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        for nxt in after.get(node, []):
            if found := visit(nxt, [*path, node]):
                return found
        done.add(node)
        return []

    for start in sorted(after):
        if found := visit(start, []):
            return found
    return []


def test_the_packages_import_one_way() -> None:
    edges = import_edges()
    found = cycle(edges)
    steps = itertools.pairwise(found)
    detail = "; ".join(f"{a} -> {b} ({edges[a, b][0]})" for a, b in steps)
    assert not found, f"import cycle {' -> '.join(found)}: {detail}"


def test_the_statistics_import_no_task() -> None:
    tasks = [
        f"{module_name(path)}:{line} imports {name}"
        for path in sorted((SOURCE / "compare").rglob("*.py"))
        for name, line in imported(path)
        if name.startswith("attnlab.tasks")
    ]
    assert not tasks, f"attnlab.compare imports the task families: {tasks}"


def test_a_cycle_is_found_and_named() -> None:
    edges = {("a", "b"): ["x"], ("b", "c"): ["y"], ("c", "a"): ["z"], ("c", "d"): ["w"]}
    assert cycle(edges) == ["a", "b", "c", "a"]
    assert cycle({("a", "b"): ["x"], ("b", "c"): ["y"]}) == []


def test_imports_inside_functions_and_relative_ones_count() -> None:
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from attnlab.tasks.lm import stream\n"
        "def f():\n    import attnlab.runner.status\n"
        "from ..compare import runs\n"
    )
    found = {name for name, _ in imports(text, ["attnlab", "stored"])}
    assert {"attnlab.tasks.lm.stream", "attnlab.runner.status", "attnlab.compare.runs"} <= found


def test_a_training_run_imports_no_report_or_plot_until_it_draws():
    """The modules a run trains with leave the reporting rooms and attnlab's plots unimported
    (Lightning's torchmetrics imports matplotlib itself, where it is installed)."""
    import subprocess
    import sys

    program = (
        "import sys; import attnlab.runner.train, attnlab.runner.plan, attnlab.runner.trainer, "
        "attnlab.runner.loggers, attnlab.runner.summary, attnlab.runner.callbacks; "
        "import attnlab.tasks.lm.system, attnlab.tasks.probe.system; "
        "import attnlab.tasks.seq2seq.system, attnlab.tasks.synthetic.system; "
        "print(sorted(m for m in sys.modules "
        "if m.startswith(('attnlab.compare', 'attnlab.reports', 'attnlab.plots'))))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
