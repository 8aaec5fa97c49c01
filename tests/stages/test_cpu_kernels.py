"""The CPU INT8 variant computes the same integers on every x86-64 CPU: 7-bit weights cannot saturate ORT's u8×s8
kernels where VNNI is missing, 8-bit ones are recorded as needing VNNI and refused on a CPU without it.

The saturation itself is measured on the machine at hand (ORT's real MatMulInteger kernel), so the suite checks on
an AVX2-only CPU that it saturates and on a VNNI CPU that it does not; ``emulated_u8s8`` reproduces the non-VNNI
pair sums in numpy, so a VNNI machine checks the non-VNNI arithmetic too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.backend.cpu_kernels import (METADATA_KEY, SAFE_WEIGHT, check_runs_here, cpu_flags, describe_cpu, has_vnni, kernels_from_weights,
                                         kernels_of_model, saturating_kernels)
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.calibration import calibration_from_path
from pipeline.stages.int8 import quantized_onnx_from_onnx
from pipeline.stages.int8_cpu import CPU_RECIPE, cpu_int8_onnx_from_onnx
from tests.haswell import haswell, native_outputs, needs_qemu, outputs_under_haswell

K = 64


def emulated_u8s8(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """u8×s8 matrix product as x86 without VNNI computes it: ``vpmaddubsw`` adds neighbouring products along K in
    saturating int16 lanes, ``vpmaddwd`` then sums those pairs into int32."""
    products = a.astype(np.int32)[:, :, None] * w.astype(np.int32)[None, :, :]  # [M, K, N]
    pairs = np.clip(products[:, 0::2] + products[:, 1::2], -32768, 32767)
    return pairs.sum(axis=1)


def ort_u8s8(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The same product through ONNX Runtime's own integer kernel on this CPU (MatMulInteger, uint8 × int8 → int32)."""
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, a.shape[1]])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [None, w.shape[1]])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]


@pytest.mark.parametrize("weight", [127, -128, SAFE_WEIGHT, -SAFE_WEIGHT])
def test_this_cpus_kernel_saturates_exactly_where_the_analysis_says(weight: int) -> None:
    a = np.full((4, K), 255, np.uint8)
    w = np.full((K, 3), weight, np.int8)
    exact = a.astype(np.int64) @ w.astype(np.int64)
    got = ort_u8s8(a, w)
    can_saturate = abs(weight) > SAFE_WEIGHT
    if saturating_kernels() is None or not can_saturate:
        assert np.array_equal(got, exact), (describe_cpu(cpu_flags()), got[0], exact[0])
    else:  # x86 without VNNI: the pair sums clip at ±32767/32768
        assert np.array_equal(got, emulated_u8s8(a, w)) and not np.array_equal(got, exact), (got[0], exact[0])


def test_seven_bit_weights_never_saturate_in_the_emulated_non_vnni_path() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (32, K), dtype=np.int64).astype(np.uint8)
    a[:4] = 255
    for bound, saturates in ((SAFE_WEIGHT, False), (127, True)):
        w = rng.integers(-bound, bound + 1, (K, 8)).astype(np.int8)
        w[:, 0] = bound  # a channel at the bound: the worst pair sum is 255·bound·2
        exact = a.astype(np.int64) @ w.astype(np.int64)
        assert np.array_equal(emulated_u8s8(a, w), exact) is not saturates, bound


@pytest.fixture(scope="module")
def both_forms(digits_convnet: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("cpu-kernels")
    data = calibration_from_path(digits_convnet.calib, signature_from_onnx(digits_convnet.model))
    seven = cpu_int8_onnx_from_onnx(digits_convnet.model, folder / "seven.onnx", data)
    eight_bit = dataclasses.replace(CPU_RECIPE, weight_bits=8)
    eight = quantized_onnx_from_onnx(digits_convnet.model, folder / "eight.onnx", data, eight_bit, method="percentile", percentile=99.999,
                                     batch_size=None, max_memory_gib=2.0, keep_nodes=())
    return seven, eight


def test_the_cpu_int8_variant_records_seven_bit_weights(both_forms: tuple[Path, Path]) -> None:
    seven, eight = both_forms
    recorded = json.loads({p.key: p.value for p in onnx.load(str(seven)).metadata_props}[METADATA_KEY])
    assert recorded == {"weight_bits": 7, "max_weight": 64, "needs": []}  # per-channel 7-bit: each channel's largest is ±64
    assert kernels_of_model(seven) == kernels_from_weights(seven)
    derived = kernels_of_model(eight)  # recorded as 8-bit by its finish step, and derived the same without the record
    assert (derived.weight_bits, derived.max_weight, derived.needs) == (8, 127, ("vnni",))


def test_a_model_needing_vnni_is_refused_in_one_line_on_a_cpu_without_it(both_forms: tuple[Path, Path]) -> None:
    seven, eight = both_forms
    avx2 = {"sse4_1", "avx2", "fma"}
    check_runs_here({"m_int8cpu": seven}, avx2, x86=True)  # 7-bit: anywhere
    check_runs_here({"m_int8cpu": eight}, avx2 | {"avx512_vnni"}, x86=True)
    check_runs_here({"m_int8cpu": eight}, avx2, x86=False)  # not x86: no 16-bit saturation to refuse
    with pytest.raises(PipelineError) as refused:
        check_runs_here({"m_int8cpu": eight, "n_int8cpu": seven}, avx2, x86=True)
    message = str(refused.value)
    assert message.startswith("m_int8cpu: 8-bit weights") and "avx512_vnni / avx_vnni" in message and "x86-64 without VNNI (avx2)" in message
    assert "n_int8cpu" not in message and "\n" not in message


def test_the_seven_bit_variant_computes_as_its_exact_qdq_graph_on_this_cpu(both_forms: tuple[Path, Path], digits_convnet: Any) -> None:
    """Whatever this CPU is: ORT's fused integer kernels (as served) agree with the Q/DQ graph's float arithmetic, which
    is what a VNNI CPU computes; the 8-bit form does too only where VNNI is present (or where nothing saturates)."""
    from pipeline.backend.onnxrt import session_from_onnx

    seven, _ = both_forms
    images = digits_convnet.eval_images[:128]
    fused = session_from_onnx(seven).run(None, {"image": images})[0]
    exact = session_from_onnx(seven, exact_qdq=True).run(None, {"image": images})[0]
    assert np.abs(fused - exact).max() < 0.05  # int32 bias and uint8 requantization rounding only
    assert (fused.argmax(1) == exact.argmax(1)).mean() >= 0.98


@pytest.mark.slow
def test_the_embedded_server_refuses_an_8_bit_model_exactly_where_it_would_saturate(both_forms: tuple[Path, Path], tmp_path: Path) -> None:
    """Published as ``digits_int8cpu``, the 8-bit form is refused in one line on a CPU without VNNI (serve and verify
    start the embedded server this way) and served on one with VNNI; the 7-bit form is served on either."""
    from pipeline.data.artifacts import Artifact
    from pipeline.triton.config import model_config_from_artifact
    from pipeline.triton.repository import publish_repository
    from pipeline.triton.server import TritonServer

    seven, eight = both_forms
    for form, path in (("seven", seven), ("eight", eight)):
        repo = tmp_path / form
        artifact = Artifact("int8cpu", "onnx", path)
        cfg = model_config_from_artifact(artifact, name="digits_int8cpu", signature=signature_from_onnx(path), max_batch=8)
        publish_repository([artifact], model="digits", repository=repo, configs={"digits_int8cpu": cfg}, extra_files={},
                           version_policy="new", report={}, reproduce="test")
        if form == "eight" and saturating_kernels() is not None:
            with pytest.raises(PipelineError, match=r"digits_int8cpu/1: 8-bit weights .* this CPU, which lacks VNNI"):
                TritonServer(repo, log_path=tmp_path / f"{form}.log").__enter__()
            continue
        with TritonServer(repo, log_path=tmp_path / f"{form}.log") as server:
            assert list(server.ready_models) == ["digits_int8cpu"], form


# --- the real AVX2 kernels, on any x86 machine (tests/haswell.py) ---------------------------------------------------------
@needs_qemu
def test_under_real_avx2_kernels_the_seven_bit_variant_computes_as_natively(both_forms: tuple[Path, Path], digits_convnet: Any, tmp_path: Path) -> None:
    """The CPU INT8 variant (7-bit weights) served on an AVX2-only CPU gives what it gives here: the integers cannot
    saturate, so only the float epilogue's vector width could differ (measured: identical)."""
    seven, _ = both_forms
    feed = {"image": np.ascontiguousarray(digits_convnet.eval_images[:128])}
    [emulated], [native] = outputs_under_haswell(seven, feed, tmp_path), native_outputs(seven, feed)
    np.testing.assert_allclose(emulated, native, rtol=0, atol=1e-6)
    assert np.array_equal(emulated.argmax(1), native.argmax(1))


@needs_qemu
def test_under_real_avx2_kernels_eight_bit_weights_saturate_and_serving_refuses_them(both_forms: tuple[Path, Path]) -> None:
    """The control: under the same emulation 255 × 127 over 64 terms clips (the emulation bites), the 8-bit form is
    refused by the check serve and verify run before starting the server, and the 7-bit form is not."""
    seven, eight = both_forms
    probe = haswell("from pipeline.backend.cpu_kernels import saturating_kernels; print(saturating_kernels())")
    assert probe.returncode == 0 and probe.stdout.split()[-1] == "1048544", probe.stdout + probe.stderr[-2000:]
    a, w = np.full((1, K), 255, np.uint8), np.full((K, 1), 127, np.int8)
    assert int(emulated_u8s8(a, w)[0, 0]) == 1048544  # the numpy reproduction of the non-VNNI pair sums agrees
    refuse = ("import sys\nfrom pipeline.backend.cpu_kernels import check_runs_here\nfrom pipeline.core.errors import PipelineError\n"
              "check_runs_here({'digits_int8cpu': sys.argv[2]})\ntry:\n    check_runs_here({'digits_int8cpu': sys.argv[1]})\n"
              "except PipelineError as exc:\n    print('REFUSED', exc.problem)")
    done = haswell(refuse, str(eight), str(seven))
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("REFUSED digits_int8cpu: 8-bit weights") and "measured: 255 × 127 over 64 terms gave 1,048,544" in line, line
