"""Which x86 CPUs compute a CPU INT8 model as it was gated: ONNX Runtime's u8×s8 kernels with and without VNNI.

ORT's CPU integer kernels (QLinearConv, QLinearMatMul, QGemm, MatMulIntegerToFloat) multiply uint8 activations by
int8 weights. On x86 CPUs without VNNI they use ``vpmaddubsw``, which adds each pair of neighbouring products in a
*saturating 16-bit* lane: with full-range weights that pair sum reaches 255·127·2 = 64,770 > 32,767 and is silently
clipped (ORT's quantization docs: "U8S8 ... might suffer from saturation issues"; the cause of 8-point accuracy
drops measured on AVX2-only AMD EPYC machines). With VNNI (``vpdpbusd``: avx512_vnni, avx_vnni) the products go
straight into int32 and nothing saturates. Weights within ±64 (ORT's ``reduce_range``: 7 bits) cannot overflow
either way, 255·64·2 = 32,640, so such a model computes the same integers on every x86-64 CPU.

The CPU INT8 variant is built with 7-bit weights (:data:`pipeline.stages.int8_cpu.CPU_WEIGHT_BITS`); what its
weights need is recorded in the model file's metadata (:data:`METADATA_KEY`) and re-derived from the weights for
files without it (older builds, other tools), so ``serve``, ``verify`` and ``deploy`` can refuse a model whose
weights need VNNI on a CPU that lacks it (:func:`check_runs_here`).
"""

from __future__ import annotations

import functools
import json
import platform
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.onnx_files import graph_proto

METADATA_KEY = "cpu_int8_kernels"
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # /proc/cpuinfo names; AMX CPUs (amx_int8) have avx512_vnni too
SAFE_WEIGHT = 64  # |w| ≤ 64: 255·64·2 = 32,640 fits a signed 16-bit lane
_INTEGER_KERNEL_OPS = ("Conv", "MatMul", "Gemm")


@dataclass(frozen=True)
class CpuKernels:
    """What a CPU INT8 model's integer kernels need of an x86 CPU."""

    weight_bits: int  # 7 when every weight is within ±64, else 8
    max_weight: int  # the largest |int8 weight| feeding a Conv/MatMul/Gemm
    needs: tuple[str, ...]  # () or ("vnni",)

    def describe(self) -> str:
        if self.needs:
            return f"{self.weight_bits}-bit weights (up to ±{self.max_weight}): needs an x86 CPU with VNNI ({' or '.join(VNNI_FLAGS)})"
        return f"{self.weight_bits}-bit weights (up to ±{self.max_weight}): the same integers on every x86-64 CPU, VNNI or not"


def kernels_from_weights(path: Path) -> CpuKernels:
    """Derive :class:`CpuKernels` from the int8 weights that feed the model's Conv/MatMul/Gemm nodes."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    consts = {init.name: init for init in graph.initializer}
    consumers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    largest = 0
    for node in graph.node:
        source = consts.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if source is None or source.data_type != onnx.TensorProto.INT8:
            continue
        if any(op in _INTEGER_KERNEL_OPS for op in consumers.get(node.output[0], [])):
            largest = max(largest, int(np.abs(numpy_helper.to_array(source).astype(np.int16)).max(initial=0)))
    needs = ("vnni",) if largest > SAFE_WEIGHT else ()
    return CpuKernels(weight_bits=7 if largest <= SAFE_WEIGHT else 8, max_weight=largest, needs=needs)


def record_cpu_kernels(path: Path) -> CpuKernels:
    """Write what ``path``'s weights need into its metadata (:data:`METADATA_KEY`) and return it."""
    import onnx

    kernels = kernels_from_weights(path)
    model = graph_proto(path)  # metadata only: the weights stay in their data file, if any
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=METADATA_KEY, value=json.dumps(asdict(kernels), sort_keys=True))
    onnx.save_model(model, str(path))
    return kernels


def kernels_of_model(path: Path) -> CpuKernels:
    """What the CPU INT8 model at ``path`` needs: its recorded metadata, else derived from its weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                data = json.loads(prop.value)
                return CpuKernels(int(data["weight_bits"]), int(data["max_weight"]), tuple(data["needs"]))
            except (ValueError, KeyError, TypeError):
                break
    return kernels_from_weights(path)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as Linux names them (``flags`` on x86, ``Features`` on Arm); empty where unknown."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def has_vnni(flags: Iterable[str]) -> bool:
    return bool(set(flags) & set(VNNI_FLAGS))


def describe_cpu(flags: Iterable[str], x86: bool = True) -> str:
    """One phrase: the integer-kernel facts of a CPU (``x86-64 with VNNI (avx512_vnni)``, ``x86-64 without VNNI (avx2)``)."""
    flags = set(flags)
    if not x86:
        return f"{platform.machine()} (no x86 16-bit saturation)"
    vnni = sorted(flags & set(VNNI_FLAGS))
    if vnni:
        return f"x86-64 with VNNI ({', '.join(vnni)})"
    widest = next((f for f in ("avx512bw", "avx2", "sse4_1") if f in flags), "unknown ISA")
    return f"x86-64 without VNNI ({widest})"


PROBE_K = 64  # u8 255 × s8 127 over 64 terms: 2,072,640 exactly, 1,048,544 where pair sums clip at 32,767


@functools.lru_cache(maxsize=1)
def saturating_kernels() -> int | None:
    """What ONNX Runtime's own u8×s8 kernel gives here for 255 × 127 over :data:`PROBE_K` terms, when that is not the
    exact 2,072,640 (the 16-bit saturation of x86 without VNNI); None where it computes exactly. Measured, not read
    from ``/proc/cpuinfo``: the kernels follow CPUID, which an emulator (``qemu-x86_64 -cpu Haswell``) or a VM's CPU
    model can set unlike the host's flags."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weights = np.full((PROBE_K, 1), 127, np.int8)
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "probe",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, PROBE_K])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])], [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = int(session.run(None, {"a": np.full((1, PROBE_K), 255, np.uint8)})[0][0, 0])
    return None if got == 255 * 127 * PROBE_K else got


def check_runs_here(models: dict[str, Path], flags: Iterable[str] | None = None, *, x86: bool | None = None) -> None:
    """Raise PipelineError (one line) naming every CPU INT8 model of ``models`` (Triton name → model.onnx) whose
    weights need VNNI where this CPU's integer kernels saturate (measured: :func:`saturating_kernels`; with ``flags``
    given, judged from them instead); on non-x86 CPUs nothing is refused."""
    if not (is_x86() if x86 is None else x86):
        return
    if flags is None:
        clipped = saturating_kernels()
        if clipped is None:
            return
        flags = set(cpu_flags()) - set(VNNI_FLAGS)  # whatever /proc/cpuinfo says, the kernels here do not use VNNI
        measured = f"; measured: 255 × 127 over {PROBE_K} terms gave {clipped:,}, not {255 * 127 * PROBE_K:,}"
    else:
        flags, measured = set(flags), ""
        if has_vnni(flags):
            return
    refused = [name for name, path in sorted(models.items()) if kernels_of_model(path).needs]
    if refused:
        raise PipelineError(
            f"{', '.join(refused)}: 8-bit weights whose u8×s8 pair sums overflow the 16-bit lanes of this CPU, which lacks VNNI "
            f"({' / '.join(VNNI_FLAGS)}; it is {describe_cpu(flags)}{measured}): served here it would not compute what its gate judged",
            "rebuild it with this version of the pipeline (CPU INT8 weights are 7-bit, right on every x86-64 CPU), "
            "or serve it on a CPU with VNNI",
        )
