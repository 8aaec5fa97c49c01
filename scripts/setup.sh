#!/usr/bin/env bash
# Set up a machine: a virtualenv in .venv with the pinned stack, wrk for the load-generator benchmark,
# and chromium for the browser tests. Needs Python 3.11 or newer (3.11 is the version tested).
#
#   bash scripts/setup.sh          the CPU stack (tensorflow-cpu, onnxruntime): what CI uses
#   bash scripts/setup.sh --gpu    an NVIDIA GPU machine: tensorflow[and-cuda], TensorRT from NVIDIA's index,
#                                  and onnxruntime-gpu in place of onnxruntime (extras gpu,dev,tensorrt,gpu-serve)
#
# PYTHON=/path/to/python3.12 picks the interpreter (default python3); EXTRAS=a,b overrides the extras;
# SETUP_DRY_RUN=1 makes and checks .venv, then prints the pip commands instead of running them (no network).
# A half-made .venv (a python without a working pip, as a failed `python3 -m venv` leaves) is made again.
set -euo pipefail -o noglob  # no globbing: the extras' [cuda,cudnn] are words, not patterns
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SUPPORTED="Python 3.11 or newer (3.11 tested)"
GPU=0
for arg in "$@"; do
    case "$arg" in
        --gpu) GPU=1 ;;
        -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown argument '$arg': use --gpu on an NVIDIA GPU machine, nothing otherwise" >&2; exit 2 ;;
    esac
done
fail() { echo "setup.sh: $*" >&2; exit 1; }

# The interpreter: there, and a supported version (the code needs tomllib, in the standard library from 3.11).
command -v "$PY" >/dev/null 2>&1 || fail "no Python interpreter '$PY': install $SUPPORTED, or name one with PYTHON=/path/to/python3"
reported=$("$PY" --version 2>&1 || true)
[[ $reported =~ ^Python\ ([0-9]+)\.([0-9]+) ]] || fail "'$PY --version' did not report a Python version ('$reported'): name an interpreter with PYTHON=/path/to/python3"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
if [ "$major" -ne 3 ] || [ "$minor" -lt 11 ]; then
    fail "$PY is Python $major.$minor; keras-trt-pipeline supports $SUPPORTED: install one and run PYTHON=python3.11 bash scripts/setup.sh"
fi

# venv and ensurepip: Debian and Ubuntu ship them apart from python3, in python3.X-venv.
venv_package="python$major.$minor-venv"
if ! "$PY" -c "import ensurepip, venv" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup.sh: $PY has no venv/ensurepip module: installing $venv_package"
        (apt-get update -qq && apt-get install -y -qq "$venv_package") >/dev/null 2>&1 \
            || fail "$PY has no venv/ensurepip module and 'apt-get install $venv_package' failed: install it and run this again"
        "$PY" -c "import ensurepip, venv" >/dev/null 2>&1 \
            || fail "$PY still has no venv/ensurepip module after installing $venv_package: name another interpreter with PYTHON="
    else
        fail "$PY has no venv/ensurepip module: install $venv_package (sudo apt-get install $venv_package) and run this again"
    fi
fi

# .venv: made once; a half-made one (no working python or pip in it) is removed and made again.
venv_works() {  # its own prefix (not the interpreter it links to), a supported version, and pip
    .venv/bin/python -c "import os, sys; sys.exit(sys.version_info < (3, 11) or os.path.realpath(sys.prefix) != os.path.realpath('.venv'))" \
        >/dev/null 2>&1 && .venv/bin/python -m pip --version >/dev/null 2>&1
}
if { [ -e .venv ] || [ -L .venv ]; } && ! venv_works; then
    echo "setup.sh: .venv is half-made (no working Python $SUPPORTED with pip in it): making it again"
    rm -rf .venv
fi
if [ ! -e .venv ]; then
    "$PY" -m venv .venv || { rm -rf .venv; fail "'$PY -m venv .venv' failed (its message is above); the half-made .venv is removed: run this again once that is fixed"; }
    venv_works || { rm -rf .venv; fail "'$PY -m venv .venv' made a .venv without a working pip; it is removed: check '$PY -m ensurepip --version'"; }
fi

pip() {
    if [ -n "${SETUP_DRY_RUN:-}" ]; then echo "pip $*"; else .venv/bin/python -m pip "$@"; fi
}
# The versions of an extra, from pyproject.toml.
extra() { .venv/bin/python -c "import sys, tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies'][sys.argv[1]]))" "$1"; }
if [ "$GPU" = 1 ]; then
    extras=${EXTRAS:-gpu,dev,tensorrt,gpu-serve}
    index=(--extra-index-url https://pypi.nvidia.com)  # TensorRT's wheels
else
    extras=${EXTRAS:-cpu,dev,trt-check}  # TensorRT-RTX: the TensorRT build check without a GPU
    index=()
fi
pip install --quiet --upgrade pip
pip install --quiet ${index[@]+"${index[@]}"} -e ".[$extras]"
if [[ ,$extras, == *,gpu-serve,* ]]; then
    # onnxruntime-gpu installs the same `onnxruntime` module as the CPU wheel that the base dependencies
    # bring: remove both and install the CUDA build alone, so the module on disk is the GPU one.
    pip uninstall --quiet -y onnxruntime onnxruntime-gpu
    # shellcheck disable=SC2046
    pip install --quiet $(extra gpu-serve)
fi
# tf-keras (Keras 2 .h5 files) and keras-hub (the keras-hub zoo) require the `tensorflow` distribution, which
# tensorflow-cpu does not provide: install them without dependencies, their other needs with theirs
# (the versions are pyproject.toml's extras keras2, hub and hub-needs).
# shellcheck disable=SC2046
pip install --quiet --no-deps $(extra keras2) $(extra hub)
# shellcheck disable=SC2046
pip install --quiet $(extra hub-needs)
if [ -n "${SETUP_DRY_RUN:-}" ]; then
    echo "setup.sh: .venv is ready; SETUP_DRY_RUN: nothing installed"
    exit 0
fi
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
        (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "note: could not install chromium (only the browser tests need it)"
    else
        echo "note: chromium is not installed (only the browser tests need it): apt-get install chromium"
    fi
fi
if ! command -v shellcheck >/dev/null 2>&1; then  # the bundles' scripts are held to it (tests/mig/test_preflight.py)
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq shellcheck) >/dev/null 2>&1 \
            || echo "note: could not install shellcheck (the script-lint tests will say they were skipped)"
    else
        echo "note: shellcheck is not installed (the script-lint tests will say they were skipped): apt-get install shellcheck"
    fi
fi
# qemu-user runs the CPU INT8 tests under ONNX Runtime's real AVX2 kernels (qemu-x86_64 -cpu Haswell) on any x86 machine
if [ "$(uname -m)" = x86_64 ] && ! command -v qemu-x86_64 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq qemu-user) >/dev/null 2>&1 \
            || echo "note: could not install qemu-user (the AVX2-kernel tests will say they were skipped)"
    else
        echo "note: qemu-user is not installed (the AVX2-kernel tests will say they were skipped): apt-get install qemu-user"
    fi
fi
echo "setup done: activate with '. .venv/bin/activate'"
