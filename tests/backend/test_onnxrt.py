"""ONNX Runtime session factory: exact Q/DQ semantics against a numpy reference, and user errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.backend.onnxrt import session_from_onnx
from pipeline.core.errors import PipelineError
from tests.onnx_graphs import BIAS_B, BIAS_W, bias_model


def _fake_quant(x: np.ndarray, scale: np.ndarray, axis: int | None = None) -> np.ndarray:
    """ONNX QuantizeLinear→DequantizeLinear to int8 with zero point 0: round half to even, saturate."""
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
    return (np.clip(np.rint(x / scale), -128, 127) * scale).astype(np.float32)


def _conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NCHW convolution, stride 1, no padding, in float64."""
    n, _, h, wd = x.shape
    k = w.shape[2]
    out = np.zeros((n, w.shape[0], h - k + 1, wd - k + 1))
    for i in range(h - k + 1):
        for j in range(wd - k + 1):
            out[:, :, i, j] = np.einsum("nchw,ochw->no", x[:, :, i : i + k, j : j + k], w)
    return out + b[None, :, None, None]


def _qdq_conv_matmul(path: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    conv_w = rng.standard_normal((3, 2, 2, 2)).astype(np.float32)
    mm_w = rng.standard_normal((27, 4)).astype(np.float32)
    consts = {
        "x_scale": np.array(0.0625, np.float32),  # a power of two: ties below are exact
        "conv_w": conv_w,
        "conv_w_scale": (np.abs(conv_w).max(axis=(1, 2, 3)) / 127).astype(np.float32),
        "conv_b": rng.standard_normal(3).astype(np.float32),
        "h_scale": np.array(0.1, np.float32),
        "mm_w": mm_w,
        "mm_w_scale": (np.abs(mm_w).max(axis=0) / 127).astype(np.float32),
    }
    inits = dict(consts)
    zero = {"x_zp": np.int8(0), "conv_w_zp": np.zeros(3, np.int8), "h_zp": np.int8(0), "mm_w_zp": np.zeros(4, np.int8)}
    inits.update({k: np.asarray(v) for k, v in zero.items()})

    def qdq(name: str, axis: int | None = None) -> list[onnx.NodeProto]:
        kw = {} if axis is None else {"axis": axis}
        args = [f"{name}_scale", f"{name}_zp"]
        return [
            helper.make_node("QuantizeLinear", [name, *args], [f"{name}_q"], **kw),
            helper.make_node("DequantizeLinear", [f"{name}_q", *args], [f"{name}_dq"], **kw),
        ]

    nodes = [
        *qdq("x"),
        *qdq("conv_w", axis=0),
        helper.make_node("Conv", ["x_dq", "conv_w_dq", "conv_b"], ["conv"]),
        helper.make_node("Flatten", ["conv"], ["h"], axis=1),
        *qdq("h"),
        *qdq("mm_w", axis=1),
        helper.make_node("MatMul", ["h_dq", "mm_w_dq"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return consts


def test_exact_qdq_matches_numpy_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    consts = _qdq_conv_matmul(tmp_path / "qdq.onnx", rng)
    x = rng.uniform(-10, 10, (5, 2, 4, 4)).astype(np.float32)  # beyond ±7.94: saturates at -128/127
    x[0, 0, 0, :3] = [0.03125, 0.09375, -0.15625]  # ties 0.5, 1.5, -2.5: round half to even → 0, 2, -2
    xq = _fake_quant(x, consts["x_scale"])
    wq = _fake_quant(consts["conv_w"], consts["conv_w_scale"], axis=0)
    h = _conv2d(xq.astype(np.float64), wq.astype(np.float64), consts["conv_b"]).reshape(5, -1).astype(np.float32)
    hq = _fake_quant(h, consts["h_scale"])
    mq = _fake_quant(consts["mm_w"], consts["mm_w_scale"], axis=1)
    expected = hq.astype(np.float64) @ mq.astype(np.float64)

    got = session_from_onnx(tmp_path / "qdq.onnx", exact_qdq=True, threads=1).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert np.abs(x).max() > 127 * consts["x_scale"]  # the reference really exercised saturation
    fp32 = _conv2d(x.astype(np.float64), consts["conv_w"], consts["conv_b"]).reshape(5, -1) @ consts["mm_w"]
    assert np.abs(got - fp32).max() > 1e-2  # and really differs from unquantized arithmetic


def test_default_session_rounds_the_float_bias_but_exact_qdq_does_not(tmp_path: Path) -> None:
    """x, w int8 with scale 1, float bias 0.6/-0.4, output requantized with scale 2: rounding the
    bias to int32 first (ORT's optimizer) changes round((acc + b) / 2) for acc = 2 (2.6/2 → 1
    but 3/2 → 2). TensorRT keeps the bias in float, as the exact session does."""
    bias_model(tmp_path / "bias.onnx")
    x = np.array([1.2, -2.0, 3.0, 0.4], np.float32).reshape(1, 1, 2, 2)

    xq = _fake_quant(x, np.float32(1.0))
    conv = xq * BIAS_W.reshape(1, 2, 1, 1) + BIAS_B.reshape(1, 2, 1, 1)
    expected = _fake_quant(np.maximum(conv, 0), np.float32(2.0))
    exact = session_from_onnx(tmp_path / "bias.onnx", exact_qdq=True).run(None, {"x": x})[0]
    np.testing.assert_array_equal(exact, expected)
    optimized = session_from_onnx(tmp_path / "bias.onnx").run(None, {"x": x})[0]
    assert optimized[0, 0, 0, 0] == 4.0 and exact[0, 0, 0, 0] == 2.0


def test_threads_and_errors(tmp_path: Path) -> None:
    _qdq_conv_matmul(tmp_path / "qdq.onnx", np.random.default_rng(0))
    session = session_from_onnx(tmp_path / "qdq.onnx", threads=1)
    assert session.get_session_options().intra_op_num_threads == 1
    assert not session.get_session_options().enable_mem_pattern  # see session_from_onnx: doubles peak memory
    with pytest.raises(PipelineError, match="does not exist"):
        session_from_onnx(tmp_path / "missing.onnx")
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07garbage")
    with pytest.raises(PipelineError, match="ONNX Runtime cannot load '.*broken.onnx'"):
        session_from_onnx(tmp_path / "broken.onnx")
    with pytest.raises(PipelineError, match="threads must be at least 1"):
        session_from_onnx(tmp_path / "qdq.onnx", threads=0)
