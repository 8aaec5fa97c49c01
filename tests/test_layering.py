"""The import graph runs one way: helpers ← stages ← triton/loadtest/mig/tune ← config/build ← CLI.

Read from the source (every import, also the lazy ones inside functions), so a new upward import
fails here before it becomes a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pipeline"
TOP = {"pipeline.build", "pipeline.build_cli", "pipeline.cli", "pipeline.config", "pipeline.__main__"}
SERVICES = ("pipeline.triton", "pipeline.loadtest", "pipeline.mig", "pipeline.tune", "pipeline.inspect")
ORCHESTRATION = {"pipeline.publish", "pipeline.report", "pipeline.htmlreport", "pipeline.inspection"} | TOP


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
