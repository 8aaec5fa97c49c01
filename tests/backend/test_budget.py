"""Memory budget: activation bytes per sample from ONNX shape inference, and the batch that fits."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.backend.budget import ACTIVATION_ALLOWANCE, BASE_BYTES, GIB, WEIGHT_COPIES, MemoryEstimate, batch_for_budget, memory_estimate
from pipeline.core.errors import PipelineError


def _save(path: Path, nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_per_sample_bytes_are_every_activation_of_one_sample(tmp_path: Path) -> None:
    """x [b,3,8,8] → Conv(4) [b,4,8,8] → Relu → Flatten [b,256] → MatMul [b,10]: per sample
    768 (input) + 1024 + 1024 + 1024 + 40 bytes; weights 432 + 16 + 10240 bytes."""
    rng = np.random.default_rng(0)
    path = _save(
        tmp_path / "m.onnx",
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"], axis=1),
            helper.make_node("MatMul", ["f", "m"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        {"w": rng.random((4, 3, 3, 3), dtype=np.float32), "b": np.zeros(4, np.float32), "m": rng.random((256, 10), dtype=np.float32)},
    )
    estimate = memory_estimate(path)
    assert estimate == MemoryEstimate(weight_bytes=432 + 16 + 10240, fixed_activation_bytes=0, bytes_per_sample=768 + 3 * 1024 + 40, unknown_tensors=0)


def test_dynamic_axes_are_sized_from_the_given_shapes(tmp_path: Path) -> None:
    path = _save(
        tmp_path / "seq.onnx",
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        {},
    )
    assert memory_estimate(path, {"x": (100, 4)}).bytes_per_sample == 2 * 100 * 4 * 4
    assert memory_estimate(path).bytes_per_sample == 2 * 1 * 4 * 4  # unknown length counts as 1
    with pytest.raises(PipelineError, match=r"per-sample shape \(100,\) for input 'x' has 1 dims, the model input has 2 besides the batch"):
        memory_estimate(path, {"x": (100,)})


def test_batch_for_budget(caplog: pytest.LogCaptureFixture) -> None:
    estimate = MemoryEstimate(weight_bytes=100 << 20, fixed_activation_bytes=0, bytes_per_sample=100 << 20, unknown_tensors=0)
    room = 2 * GIB - BASE_BYTES - WEIGHT_COPIES * (100 << 20)
    assert batch_for_budget(estimate, 2.0) == room // (100 << 20) == 13
    assert batch_for_budget(estimate, 2.0, max_batch=8) == 8
    assert batch_for_budget(estimate, 64.0) == (64 * 1024 - 512 - 200) // 100 == 648
    # three models at once (FP32, FP16, INT8 in the accuracy stage) share one process: its base is
    # paid once, weights and a batch of activations three times (not a third of the budget each,
    # which would leave less than one sample for a 90 MiB model under 2 GiB)
    assert batch_for_budget(estimate, 2.0, runners=3) == (2048 - 512 - 3 * 200) // 300 == 3
    small = MemoryEstimate(weight_bytes=90 << 20, fixed_activation_bytes=0, bytes_per_sample=2 << 20, unknown_tensors=0)
    assert batch_for_budget(small, 2.0, runners=3, max_batch=64) == 64
    with caplog.at_level(logging.INFO, logger="pipeline.backend.budget"):  # weights the budget cannot hold: an allowance beyond them
        assert batch_for_budget(estimate, 0.5) == ACTIVATION_ALLOWANCE // (100 << 20) == 5
    assert "overflow --max-memory-gib 0.5: batches of 5" in caplog.text
    wide = MemoryEstimate(weight_bytes=100 << 20, fixed_activation_bytes=0, bytes_per_sample=3 * GIB, unknown_tensors=0)
    with caplog.at_level(logging.WARNING, logger="pipeline.backend.budget"):  # weights that fit, a sample that does not
        assert batch_for_budget(wide, 2.0) == 1
    assert "needs more than --max-memory-gib 2 even one sample at a time" in caplog.text
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(PipelineError, match="the memory budget must be a positive number of GiB"):
            batch_for_budget(estimate, bad)


def test_a_model_whose_weights_cannot_keep_the_budget_is_told_what_a_stage_will_take() -> None:
    from pipeline.backend.budget import memory_need

    assert memory_need(100 << 20, 2.0) is None  # 3 × 100 MiB + 1.5 GiB fits 2 GiB
    line = memory_need(2003 << 20, 2.0)
    assert line is not None and "2,003 MiB of weights cannot keep --max-memory-gib 2" in line
    assert "up to 7.4 GiB (3 × weights + 1.5 GiB)" in line and "--max-memory-gib 7.4" in line
