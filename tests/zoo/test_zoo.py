"""The model zoo end to end: every model builds FP32 + FP16 + INT8 without ``--shape``, passes its
gates, is served by the embedded tritonserver, verified against in-process outputs, and
load-tested once at concurrency 4. Sequence models keep ``-1`` dims in their Triton configs and
answer at both of their lengths exactly as in process.

Slow (each builds a real model: tens of seconds to a few minutes on 2 cores; see the README's zoo table).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.zoo.harness import PRECISIONS, assert_tensorrt_built, build_zoo_model, serve_zoo_model
from tests.zoo.models import SEQ_LENGTHS, ZOO

# Keras Applications backbones with random weights: 5-10 minutes each on 2 cores, which CI's 30 minutes
# cannot hold beside the rest (README zoo table). Opt in with `pytest --heavy`.
HEAVY = ("resnet50", "mobilenet_v3_small", "densenet121")
EXPECTED_PROFILES = {"transformer": "tokens:1x16/64x16/64x32", "lstm": "frames:1x16x6/64x16x6/64x32x6"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.heavy) if n in HEAVY else n for n in ZOO])
def test_zoo_model_builds_serves_verifies_and_loads(name: str, tmp_path: Path) -> None:
    entry = ZOO[name]
    run = build_zoo_model(entry, tmp_path)
    summary = json.dumps(run.as_json(), indent=1)[:4000]
    assert run.build_error is None, summary
    assert run.parity_passed, summary
    assert set(run.sizes) == set(PRECISIONS), summary
    assert_tensorrt_built(run, summary)  # the real builder built every GPU variant
    assert {p: g["passed"] for p, g in run.gates.items()} == {"fp16": True, "int8": True, "int8cpu": True}, summary
    assert run.figures == [], summary  # decided with room, and the CPU INT8 as close to FP32 as the INT8 graph
    if entry.sequence:
        [dims] = run.config_dims.values()
        assert dims[0] == -1, summary  # the sequence axis stays dynamic in Triton
        # lengths 16 (80% of samples) and 20: OPT 16, MIN 16, MAX 32 (the next power of two above 20)
        assert run.profiles == [EXPECTED_PROFILES[name]], summary

    serve_zoo_model(entry, tmp_path, run)
    summary = json.dumps(run.as_json(), indent=1)[:4000]
    assert run.served_error is None, summary
    assert {r["model"] for r in run.served if r["passed"]} == {f"{name}_{p}" for p in PRECISIONS}, summary
    assert run.loadtest_error is None, summary
    assert set(run.loadtest) == {f"{name}_{p}" for p in PRECISIONS}, summary
    assert all(point["requests"] > 0 and point["errors"] == 0 and point["concurrency"] == 4 for point in run.loadtest.values()), summary
    if entry.sequence:
        assert set(run.per_length) == {f"{name}_{p}@{n}" for p in PRECISIONS for n in SEQ_LENGTHS}, summary
        assert max(run.per_length.values()) <= 1e-5, summary
