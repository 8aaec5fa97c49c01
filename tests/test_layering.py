"""The import graph runs one way: helpers ← stages ← triton/loadtest/mig/tune ← config/build ← CLI.

Read from the source (every import, also the lazy ones inside functions), so a new upward import
fails here before it becomes a cycle; a cycle between modules of one layer fails too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pipeline"
TOP = {"pipeline.build", "pipeline.build_support", "pipeline.build_cli", "pipeline.cli", "pipeline.config", "pipeline.__main__"}
SERVICES = ("pipeline.triton", "pipeline.loadtest", "pipeline.mig", "pipeline.tune", "pipeline.inspect")
ORCHESTRATION = {"pipeline.publish", "pipeline.report", "pipeline.htmlreport"} | TOP


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name.startswith("pipeline")}


MODULES = {_module(p): _imports(p) for p in sorted(ROOT.rglob("*.py")) if "backends" not in p.parts}


def _is_cli(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in ("cli", "__main__") or module.endswith("_cli")


def _under(name: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _layer(module: str) -> int:
    if _is_cli(module) or module in TOP:
        return 4
    if _under(module, SERVICES) or module in ORCHESTRATION:
        return 2
    if _under(module, ("pipeline.stages",)):
        return 1
    return 0  # small helpers: errors, options, tensors, gates, stagecache, ...


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_it(module: str) -> None:
    upward = sorted(
        imported for imported in MODULES[module]
        if imported in MODULES and _layer(imported) > _layer(module) and not (_layer(module) == 4 and _is_cli(module))
    )
    assert not upward, f"{module} (layer {_layer(module)}) imports {upward}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not _is_cli(m) and m not in TOP))
def test_nothing_below_the_commands_imports_build_cli_or_config(module: str) -> None:
    assert not (MODULES[module] & TOP), f"{module} imports {sorted(MODULES[module] & TOP)}"


def test_the_checker_sees_lazy_imports() -> None:
    assert "pipeline.build" in MODULES["pipeline.build_cli"]  # imported inside a function
    assert _layer("pipeline.stages.int8") == 1 and _layer("pipeline.triton.verify") == 2 and _layer("pipeline.gates") == 0


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package_edges(module: str) -> set[str]:
    """What ``module`` imports that is a module here, without its own package (a submodule importing
    ``from pipeline.triton import x`` is an import of ``x``, not of the package's ``__init__``)."""
    return {name for name in MODULES[module] if name in MODULES and not module.startswith(name + ".")}


def test_no_import_cycles_even_within_a_layer() -> None:
    graph = {module: _package_edges(module) for module in MODULES}
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle_within_one_layer() -> None:
    graph = {"pipeline.report": {"pipeline.htmlreport"}, "pipeline.htmlreport": {"pipeline.report"}, "pipeline.errors": set()}
    assert _cycles(graph) == [["pipeline.htmlreport", "pipeline.report"]]


def test_every_module_the_layers_name_exists() -> None:
    named = TOP | ORCHESTRATION | set(SERVICES) | {"pipeline.stages"}
    assert sorted(n for n in named if n not in MODULES) == []


# ---- the package tree: nothing imports up it; no module does several jobs' worth of lines -------------------------

MAX_LINES = 450
# Nothing is exempt.
EVERY_FILE = sorted(ROOT.rglob("*.py"))


def _package(module: str) -> str | None:
    """The subpackage a module belongs to (``pipeline.loadtest`` for ``pipeline.loadtest.engine``); None at the top."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else None


def _reaches(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, imported) where ``module`` sits in a subpackage and ``imported``, outside it, imports that
    subpackage back (directly or through others): a module above it in the package tree."""
    found = []
    for module, imported in sorted(graph.items()):
        package = _package(module)
        if package is None:
            continue
        for name in sorted(imported):
            if _package(name) != package and any(_under(m, (package,)) for m in _reaches(name, graph)):
                found.append((module, name))
    return found


def test_no_module_imports_up_the_package_tree() -> None:
    graph = {module: _package_edges(module) for module in MODULES}
    assert _upward(graph) == []


def test_the_upward_check_sees_a_command_importing_the_page_that_reads_its_reports() -> None:
    graph = {"pipeline.loadtest.loadtest_cli": {"pipeline.htmlreport"}, "pipeline.htmlreport": {"pipeline.loadtest.report"},
             "pipeline.loadtest.report": set(), "pipeline.loadtest.engine": {"pipeline.errors"}, "pipeline.errors": set()}
    assert _upward(graph) == [("pipeline.loadtest.loadtest_cli", "pipeline.htmlreport")]


@pytest.mark.parametrize("path", [p.relative_to(ROOT.parent).as_posix() for p in EVERY_FILE])
def test_no_module_is_over_450_lines(path: str) -> None:
    lines = len((ROOT.parent / path).read_text().splitlines())
    assert lines <= MAX_LINES, f"{path} has {lines} lines (at most {MAX_LINES}): split it by job"
