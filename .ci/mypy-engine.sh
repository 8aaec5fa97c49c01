#!/usr/bin/env bash
# Type-check the TensorRT engine stage against TensorRT's type stubs, without TensorRT installed, then the whole package.
#
# The stubs go into .ci/stubs (git-ignored) and reach mypy only through MYPYPATH. They must never
# be installed into the venv: their package is a folder tensorrt/ holding only __init__.pyi, which
# Python imports as an empty namespace package, so `import tensorrt` would succeed without
# TensorRT and the pipeline would think it can build engines.
#
# tensorrt-stubs 10.13.0.35.1 is machine-generated and needs three repairs before mypy reads it:
#   * parameters named `in` (a keyword) are a syntax error -> renamed `in_`;
#   * add_scale_nd has a required parameter after defaulted ones -> given a default;
#   * a module-level `bool: DataType` alias shadows builtins.bool in every `-> bool` annotation
#     -> dropped (the pipeline never uses trt.bool).
# Its remaining strict-mode complaints are about the stub itself, so each .pyi gets
# `# mypy: ignore-errors` (errors in stubs are reported even with --follow-imports=silent).
# `--stubs-only` fetches and repairs the stubs without running mypy (scripts/setup.sh does that).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
STUBS_VERSION="10.13.0.35.1"
STUBS=".ci/stubs"
MARKER="$STUBS/.repaired-$STUBS_VERSION"

# The trap this script exists to avoid: stubs leaked into the interpreter's own path.
"$PYTHON" - <<'EOF'
import importlib.util, sys
spec = importlib.util.find_spec("tensorrt")
if spec is not None and spec.origin is None:
    locations = ", ".join(spec.submodule_search_locations or [])
    sys.exit(f"error: 'tensorrt' resolves to an empty namespace package at {locations}; "
             "uninstall tensorrt-stubs from this environment")
EOF

if [ ! -f "$MARKER" ]; then
    rm -rf "$STUBS"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$STUBS" \
        "tensorrt-stubs==$STUBS_VERSION"
    PYI="$STUBS/tensorrt_bindings/tensorrt.pyi"
    sed -i -E \
        -e 's/([(,] ?)in: /\1in_: /g' \
        -e 's/(power: Weights = None, channel_axis: int)\)/\1 = ...)/' \
        -e '/^bool: DataType/d' \
        "$PYI"
    find "$STUBS" -name '*.pyi' -exec sed -i '1i # mypy: ignore-errors' {} +
    # Fail here, not deep inside mypy, if a stub still does not parse.
    find "$STUBS" -name '*.pyi' -exec "$PYTHON" -c \
        'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' {} +
    touch "$MARKER"
fi

if [ "${1:-}" = "--stubs-only" ]; then  # scripts/setup.sh fetches them, so the tests never need the network
    exit 0
fi

MYPYPATH="$STUBS" "$PYTHON" -m mypy --strict --follow-imports=silent \
    pipeline/stages/engine.py pipeline/backend/tensorrt_env.py pipeline/stages/shapes.py pipeline/data/profiles.py \
    pipeline/backend/trt_seam.py pipeline/backend/trt_compile.py pipeline/backend/plan_runner.py pipeline/backend/plan_binding.py
# The whole package, at the default strictness (pyproject.toml's [tool.mypy]): no module's types may drift.
"$PYTHON" -m mypy pipeline
