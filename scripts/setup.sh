#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv in .venv with the pinned stack, wrk for the load-generator benchmark,
# and chromium for the HTML report's headless-browser test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# TensorFlow on the CPU, and TensorRT-RTX for the build check without a GPU (EXTRAS=gpu,dev for a CUDA machine; add
# tensorrt there for the engine step)
.venv/bin/python -m pip install --quiet -e ".[${EXTRAS:-cpu,dev,trt-check}]"
# tf-keras (Keras 2 .h5 files) and keras-hub (the keras-hub zoo) require the `tensorflow` distribution, which
# tensorflow-cpu does not provide: install them without dependencies, their other needs with theirs
# (the versions are pyproject.toml's extras keras2, hub and hub-needs).
extra() { .venv/bin/python -c "import sys, tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies'][sys.argv[1]]))" "$1"; }
# shellcheck disable=SC2046
.venv/bin/python -m pip install --quiet --no-deps $(extra keras2) $(extra hub)
# shellcheck disable=SC2046
.venv/bin/python -m pip install --quiet $(extra hub-needs)
# TensorRT's type stubs for the engine stage's type check (into .ci/stubs, never the venv), fetched
# now so that running the tests needs no network.
PYTHON=.venv/bin/python bash .ci/mypy-engine.sh --stubs-only
if ! command -v wrk >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq wrk) >/dev/null 2>&1 || echo "note: could not install wrk (only scripts/bench_loadgen.py needs it)"
    else
        echo "note: wrk is not installed (only scripts/bench_loadgen.py needs it): apt-get install wrk"
    fi
fi
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "note: could not install chromium (only the HTML report's browser test needs it)"
    else
        echo "note: chromium is not installed (only the HTML report's browser test needs it): apt-get install chromium"
    fi
fi
echo "setup done: activate with '. .venv/bin/activate'"
