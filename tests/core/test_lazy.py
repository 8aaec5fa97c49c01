"""Install hints name only extras that exist in pyproject.toml."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.lazy import import_optional

ROOT = Path(__file__).resolve().parents[2]


def test_every_install_hint_names_an_existing_extra() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = []
    for path in (ROOT / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "import_optional" and len(node.args) >= 2:
                extra = node.args[1]
                assert isinstance(extra, ast.Constant), f"{path}:{node.lineno}: the extra must be a literal"
                named.append((f"{path.relative_to(ROOT)}:{node.lineno}", extra.value))
    assert named
    wrong = [(where, extra) for where, extra in named if extra is not None and extra not in extras]
    assert not wrong, f"install hints name extras pyproject.toml lacks: {wrong}"


def test_a_core_dependency_hint_says_reinstall_the_project() -> None:
    with pytest.raises(PipelineError, match=r"not importable .* reinstall the project's dependencies: pip install -e \.$"):
        import_optional("no_such_module_xyz", None, "testing")
    with pytest.raises(PipelineError, match=r"pip install '\.\[cpu\]' \(or '\.\[gpu\]' on a CUDA machine\)"):
        import_optional("no_such_module_xyz", "cpu", "testing")
