"""Every Polygraphy call the package makes, bound against the installed Polygraphy's real signatures.

Calls through names imported from ``polygraphy`` are found in the source (AST) and bound with
``inspect.signature(...).bind`` using the call's positional count and keyword names; methods called
on Polygraphy objects whose type the AST cannot know are listed in ``METHOD_CALLS``. Polygraphy's
TensorRT backend imports without TensorRT (it imports ``tensorrt`` lazily), so its signatures are
real here even though TensorRT cannot run. This is how ``str_from_engine(engine, show_layers=False)``
(a TypeError on 0.53.6, which takes ``(engine, context, ...)``) would have been caught.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"


@dataclass(frozen=True)
class Call:
    where: str
    module: str
    chain: tuple[str, ...]  # the imported name, then attributes (Comparator.run)
    positional: int
    keywords: tuple[str, ...]
    starred: bool


def _chain(node: ast.expr) -> tuple[str, ...] | None:
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        inner = _chain(node.value)
        return inner + (node.attr,) if inner else None
    return None


def polygraphy_calls(source: str, where: str) -> Iterator[Call]:
    """Calls in ``source`` through a name imported from a ``polygraphy`` module."""
    tree = ast.parse(source)
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "polygraphy":
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain = _chain(node.func)
        if chain and chain[0] in imported:
            module, name = imported[chain[0]]
            starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
            yield Call(f"{where}:{node.lineno}", module, (name, *chain[1:]), len(node.args), tuple(k.arg for k in node.keywords if k.arg),
                       starred)


def bind(call: Call) -> None:
    """Bind ``call`` against the real signature; TypeError when Polygraphy would refuse it."""
    target: Any = importlib.import_module(call.module)
    for attr in call.chain:
        target = getattr(target, attr)
    signature = inspect.signature(target)
    if call.starred:
        return
    signature.bind(*[None] * call.positional, **{k: None for k in call.keywords})


def package_calls() -> list[Call]:
    return [c for path in sorted(PACKAGE.rglob("*.py")) for c in polygraphy_calls(path.read_text(), str(path.relative_to(PACKAGE.parent)))]


CALLS = package_calls()

# Methods called on Polygraphy objects (the AST cannot know their type): (module, class.method, positional, keywords).
METHOD_CALLS = [
    ("polygraphy.backend.trt", ("TrtRunner", "set_profile"), 2, ()),  # plan_runner.ProfiledRunner (self, index)
    ("polygraphy.backend.base", ("BaseRunner", "infer"), 2, ()),  # (self, feed_dict)
    ("polygraphy.backend.base", ("BaseRunner", "get_input_metadata"), 1, ("use_numpy_dtypes",)),
    ("polygraphy.backend.base", ("BaseRunner", "last_inference_time"), 1, ()),
    ("polygraphy.backend.base", ("BaseRunner", "activate"), 1, ()),
    ("polygraphy.backend.base", ("BaseRunner", "deactivate"), 1, ()),
    ("polygraphy.backend.base", ("BaseRunner", "__init__"), 1, ("name",)),  # ProfiledRunner's super().__init__
]


def test_the_package_calls_polygraphy_and_every_call_is_found() -> None:
    found = {c.chain for c in CALLS}
    assert {("str_from_engine",), ("TrtRunner",), ("Comparator", "run"), ("str_from_onnx",)} <= found, found


@pytest.mark.parametrize("call", CALLS, ids=[f"{c.where}:{'.'.join(c.chain)}" for c in CALLS])
def test_every_polygraphy_call_binds_to_the_installed_signature(call: Call) -> None:
    bind(call)


@pytest.mark.parametrize("module, chain, positional, keywords", METHOD_CALLS, ids=[".".join(c[1]) for c in METHOD_CALLS])
def test_methods_called_on_polygraphy_objects_bind(module: str, chain: tuple[str, ...], positional: int, keywords: tuple[str, ...]) -> None:
    bind(Call("listed", module, chain, positional, keywords, starred=False))


def test_the_check_catches_the_old_str_from_engine_call() -> None:
    """The call inspect made before: Polygraphy 0.53.6 needs the execution context too."""
    source = "from polygraphy.backend.trt.util import str_from_engine\nstr_from_engine(engine, show_layers=False)\n"
    [call] = polygraphy_calls(source, "old")
    with pytest.raises(TypeError, match="context"):
        bind(call)
