"""The import graph runs one way: each package imports only the packages its ``__init__`` names.

The rules (``ALLOWED``) are stated here once and repeated as the ``May import:`` line of each package's
docstring, which a test holds equal to them. The imports are read from the source (every import,
also the lazy ones inside functions), so a new upward import fails here before it becomes a cycle;
the rules themselves form no cycle, and modules of one package form no import cycle either.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT as REPO

ROOT = REPO / "pipeline"

# Package → the packages its modules may import (besides its own modules and the root's __version__).
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "data": frozenset({"core"}),
    "backend": frozenset({"core", "data"}),
    "accuracy": frozenset({"core", "data"}),
    "models": frozenset({"core", "data"}),
    "stages": frozenset({"core", "data", "backend", "accuracy"}),
    "inspect": frozenset({"core", "data", "backend", "stages"}),
    "triton": frozenset({"core", "data", "backend", "accuracy"}),
    "loadtest": frozenset({"core", "data"}),
    "mig": frozenset({"core", "data", "backend", "triton"}),
    "tune": frozenset({"core", "data", "loadtest", "mig", "triton"}),
    "reports": frozenset({"core", "loadtest"}),
    "build": frozenset({"core", "data", "backend", "accuracy", "models", "stages", "triton", "mig"}),
    "commands": frozenset({"core", "data", "backend", "accuracy", "models", "stages", "inspect", "triton", "loadtest",
                           "mig", "tune", "reports", "build"}),
}
TOP = "(top)"  # pipeline/cli.py and pipeline/__main__.py: the command line, above every package
MAX_TOP_MODULES = 8
MAX_LINES = 450


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
    return {name for name in found if name == "pipeline" or name.startswith("pipeline.")}


# The Triton backend under pipeline/triton/backends/ and the Python models under pipeline/triton/python_models/ run inside
# tritonserver's Python stub: not packages.
MODULES = {_module(p): _imports(p) for p in sorted(ROOT.rglob("*.py")) if "backends" not in p.parts and "python_models" not in p.parts}


def _package(module: str) -> str | None:
    """``loadtest`` for ``pipeline.loadtest.engine`` and ``pipeline.loadtest``; TOP for ``pipeline.cli``;
    None for the root package ``pipeline`` (its ``__version__``, which anything may read)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return parts[1] if (ROOT / parts[1]).is_dir() else TOP


def _edges(graph: dict[str, set[str]], module: str) -> set[str]:
    """What ``module`` imports that is a module of the graph, without the packages it sits in (a submodule
    importing ``from pipeline.triton import x`` imports ``x``, not the package's ``__init__``)."""
    return {name for name in graph[module] if name in graph and not module.startswith(name + ".")}


def _violations(graph: dict[str, set[str]], modules: list[str] | None = None) -> list[str]:
    """Every import from one package into another that ``ALLOWED`` does not name, and every import of the
    command line (``pipeline.cli``) from inside a package."""
    found = []
    for module in sorted(graph) if modules is None else modules:
        source = _package(module)
        for name in sorted(_edges(graph, module)):
            target = _package(name)
            if target is None or target == source or source == TOP:
                continue
            if target == TOP or source is None or target not in ALLOWED.get(source, frozenset()):
                found.append(f"{module} ({source}) imports {name} ({target})")
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_package_its_own_may_not(module: str) -> None:
    assert _violations(MODULES, [module]) == []


def test_a_lower_package_importing_a_higher_one_fails() -> None:
    """Planted: core importing the build's config, data importing publishing, a stage importing the command line."""
    graph = {name: set(imported) for name, imported in MODULES.items()}
    graph["pipeline.core.errors"] |= {"pipeline.build.config"}
    graph["pipeline.data.workspace"] |= {"pipeline.build.publish"}
    graph["pipeline.stages.int8"] |= {"pipeline.cli"}
    assert _violations(graph) == [
        "pipeline.core.errors (core) imports pipeline.build.config (build)",
        "pipeline.data.workspace (data) imports pipeline.build.publish (build)",
        "pipeline.stages.int8 (stages) imports pipeline.cli ((top))",
    ]


def test_the_checker_sees_lazy_imports() -> None:
    assert "pipeline.build.orchestrator" in MODULES["pipeline.commands.build"]  # imported inside a function
    assert "pipeline.commands.build" in MODULES["pipeline.cli"]


def test_the_rules_form_no_cycle() -> None:
    """The allowed imports order the packages: none may reach itself through them."""
    assert _cycles({name: set(allowed) for name, allowed in ALLOWED.items()}) == []


def test_every_package_states_its_job_and_its_rules() -> None:
    """Each package's docstring says its job and, on a ``May import:`` line, exactly what ``ALLOWED`` says."""
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert packages == sorted(ALLOWED), "a new package needs its rules in ALLOWED and its docstring"
    wrong = {}
    for name in packages:
        doc = ast.get_docstring(ast.parse((ROOT / name / "__init__.py").read_text())) or ""
        line = re.search(r"^May import: (.*)$", doc, re.M)
        stated = frozenset() if line and line[1].startswith("nothing") else frozenset(re.findall(r"\w+", line[1] if line else "?"))
        if not line or stated != ALLOWED[name] or len(doc.split("\n\n")[0]) < 40:
            wrong[name] = doc
    assert not wrong, wrong


def test_the_design_notes_draw_the_same_packages_and_rules() -> None:
    """docs/design.md's package table: one row per package, its "may import" column equal to ``ALLOWED``."""
    text = (REPO / "docs" / "design.md").read_text()
    rows = re.findall(r"^\| `(\w+)/` \| [^|]+ \| ([^|]+) \|", text, re.M)
    drawn = {name: frozenset() if allowed.strip() == "nothing" else frozenset(re.findall(r"\w+", allowed)) for name, allowed in rows}
    assert drawn == ALLOWED


def test_every_test_folder_is_collected() -> None:
    """Tests mirror the packages (tests/build/ for pipeline/build/): no folder holding tests may match pytest's
    ``norecursedirs``, whose default would skip a folder named ``build`` without a word."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["norecursedirs"]
    folders = {p.parent.relative_to(REPO / "tests") for p in (REPO / "tests").rglob("test_*.py")}
    skipped = sorted(str(f) for f in folders for part in f.parts for pattern in patterns if fnmatch.fnmatch(part, pattern))
    assert skipped == []
    assert Path("build") in folders and not any(fnmatch.fnmatch("build", pattern) for pattern in patterns)


def test_only_the_command_line_stays_at_the_top() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top
    assert {_package(_module(p)) for p in ROOT.glob("*.py")} <= {None, TOP}
    assert MODULES["pipeline"] == set(), "the root package holds the version and imports nothing"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
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


def test_no_import_cycles_even_within_a_package() -> None:
    graph = {module: _edges(MODULES, module) for module in MODULES}
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle_within_one_package() -> None:
    graph = {"pipeline.reports.terminal": {"pipeline.reports.html"}, "pipeline.reports.html": {"pipeline.reports.terminal"},
             "pipeline.core.errors": set()}
    assert _cycles(graph) == [["pipeline.reports.html", "pipeline.reports.terminal"]]


@pytest.mark.parametrize("path", [p.relative_to(ROOT.parent).as_posix() for p in sorted(ROOT.rglob("*.py"))])
def test_no_module_is_over_450_lines(path: str) -> None:
    lines = len((ROOT.parent / path).read_text().splitlines())
    assert lines <= MAX_LINES, f"{path} has {lines} lines (at most {MAX_LINES}): split it by job"
