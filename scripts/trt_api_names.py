"""Extract the names of TensorRT's Python API from its binding wheels into tests/fixtures/.

TensorRT cannot be installed where the tests run (it needs an NVIDIA GPU and driver), but its binding
wheels (``tensorrt-cu12-bindings`` 10.x, ``tensorrt-cu13-bindings`` 11.x, about 1.3 MB each) are real:
their extension module ``tensorrt_bindings/tensorrt.so`` holds, as C strings for pybind11, the name of
every class, method, property and enum value of that version's API. (The ``-libs`` wheels are the
stubs that download the libraries; they are not needed here.)

This script reads those strings once and writes one name per line to
``tests/fixtures/tensorrt-api-<version>.txt``; tests/backend/test_trt_api.py checks every TensorRT name the
pipeline uses against each file. Only identifier-shaped strings are kept (no C++ mangled symbols).
The linker merges string tails (``INPUT`` may be stored only as the end of ``SOME_INPUT``), so the test
matches a name as a *suffix* of a kept string, never as a whole line. The wheel's own Python files add
their top-level names (``__version__``).

Usage (from the repository root)::

    python -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 -d /tmp/trt 'tensorrt-cu12-bindings>=10,<11' 'tensorrt-cu13-bindings>=11,<12'
    python scripts/trt_api_names.py /tmp/trt/tensorrt_cu1*_bindings-*.whl

Rerun it for a new TensorRT release and update ``CHECKED`` in tests/backend/test_trt_api.py.
"""

from __future__ import annotations

import argparse
import ast
import re
import zipfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
_STRING = re.compile(rb"[\x20-\x7e]{2,}")
_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{1,63}")
_WHEEL = re.compile(r"^tensorrt_cu\d+_bindings-(?P<version>\d+(\.\d+)+)-")


def names_in_wheel(wheel: Path) -> list[str]:
    """The sorted identifier-shaped strings of the wheel's extension module and top-level Python names."""
    names: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.endswith(".so") and "/tensorrt" in f"/{member}":
                for text in _STRING.findall(archive.read(member)):
                    if _IDENTIFIER.fullmatch(text) and not text.startswith(b"_Z"):
                        names.add(text.decode())
            elif member.endswith(".py"):
                tree = ast.parse(archive.read(member))
                names |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    return sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="tensorrt-cuXX-bindings wheels")
    args = parser.parse_args()
    for wheel in args.wheels:
        match = _WHEEL.match(wheel.name)
        if not match:
            parser.error(f"{wheel.name} is not a tensorrt-cuXX-bindings wheel")
        out = FIXTURES / f"tensorrt-api-{match['version']}.txt"
        names = names_in_wheel(wheel)
        header = f"# identifier strings of {wheel.name}'s tensorrt.so (scripts/trt_api_names.py); match names as suffixes\n"
        out.write_text(header + "\n".join(names) + "\n")
        print(f"{out}: {len(names)} names")


if __name__ == "__main__":
    main()
