"""The accuracy tolerances: one typed source of their options and defaults (:class:`Gates`), and what
one variant is held to (:class:`Tolerance`, picked by precision).

How a figure is measured is pipeline.accuracy.taskstats, its confidence bounds pipeline.accuracy.bounds,
and how it is judged against these limits pipeline.accuracy.judging; the build's accuracy stage and ``verify`` (served
accuracy) use the same three. ``--fp16-max-drop`` and ``--int8-max-drop`` limit every labeled task
metric in points (top-1 or decision accuracy, R², mean IoU) and, without labels, the share of
decisions that change. Non-finite values (NaN, ±Inf) where FP32 has finite ones fail every gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.core.options import in_range, non_negative, option

GATE_GROUP = "accuracy gates (each variant against FP32 ONNX on the evaluation data)"


def fp16_max_drop_option() -> Any:
    """``--fp16-max-drop`` (shared by build and verify)."""
    return option(1.0, "max drop of FP16 (and FP32 engines) vs FP32, in points: top-1/decision accuracy, R² or mean IoU with labels, "
                       "changed decisions without; judged with its confidence bounds",
                  check=non_negative, group=GATE_GROUP)


def int8_max_drop_option() -> Any:
    """``--int8-max-drop`` (shared by build and verify)."""
    return option(1.0, "max drop of INT8 vs FP32, in points (as --fp16-max-drop), judged with its confidence bounds", check=non_negative, group=GATE_GROUP)


def confidence_option() -> Any:
    """``--gate-confidence`` (shared by build and verify)."""
    return option(0.95, "confidence of the accuracy-drop bounds", check=in_range(0.5, 0.999), group=GATE_GROUP)


def accuracy_share(text: str) -> float:
    """``99%``, ``99.9%`` or ``0.99``: a share of FP32's task metric, above 0 and at most 1 (PipelineError otherwise)."""
    from pipeline.core.errors import PipelineError

    stripped = text.strip()
    try:
        share = round(float(stripped[:-1]) / 100, 12) if stripped.endswith("%") else float(stripped)  # 99.9% is 0.999, not 0.99900…01
    except ValueError:
        share = float("nan")
    if not 0 < share <= 1:
        raise PipelineError(f"accuracy target '{text}' is not a share of FP32's metric", "pass e.g. 99% or 99.9% (MLPerf's two targets), or 0.99")
    return share


def accuracy_target_option() -> Any:
    """``--accuracy-target`` (verify and ``loadtest --mode accuracy``): MLPerf's rule, beside the point-drop gates."""
    return option(None, "MLPerf's accuracy rule, e.g. 99% or 99.9%: each variant's task metric against the labels (top-1 accuracy, R², "
                        "mean IoU) at least this share of served FP32's; a point figure, reported beside the drop gates, failing below it",
                  parse=accuracy_share, metavar="SHARE", group=GATE_GROUP)


@dataclass(frozen=True)
class Gates:
    """Every accuracy tolerance of a build (and of ``verify``). Drops are in points of top-1 accuracy."""

    parity_atol: float = option(1e-4, "ONNX vs TensorFlow: the absolute part of each value's tolerance (see --parity-rtol)", check=non_negative,
                                group="conversion")
    # Never 0 by default: TensorFlow (oneDNN) and ONNX Runtime sum float32 in different orders on each CPU kind (AVX2,
    # AVX-512 VNNI, AMX), a few 1e-7 of the value apart (3.5e-7 for outputs near 300 on AMX: past a 1e-4 atol).
    parity_rtol: float = option(1e-5, "ONNX vs TensorFlow: each value within --parity-atol + this × |TensorFlow's value|", check=non_negative,
                                group="conversion")
    # A mixed-precision model's TensorFlow result is float16: between 16 and 32 its values are 0.0156 apart, so no
    # float32 conversion can be held closer to it than that (a 100-logit CNN differed by 0.0108 at |logit| ≤ 30).
    parity_ulps: float = option(4.0, "ONNX vs TensorFlow for a model TensorFlow computes in float16 (mixed_float16): also this many "
                                     "float16 spacings at each sample's largest |value|", check=non_negative, group="conversion")
    fp16_max_drop: float = fp16_max_drop_option()
    fp16_atol: float | None = option(1e-2, "max abs error of FP16 outputs (regression outputs: see --fp16-max-rel-error)", check=non_negative, group=GATE_GROUP)
    tf32_atol: float = option(1e-2, "max abs error of FP32 TensorRT engines built with TF32 (the default; TF32 keeps FP16's 10-bit "
                                    "mantissa, so FP16's limit)", check=non_negative, group=GATE_GROUP)
    fp32_engine_atol: float = option(1e-3, "max abs error of FP32 TensorRT engines built with --no-tf32 (IEEE FP32 kernels: only the "
                                           "order of accumulation differs)", check=non_negative, group=GATE_GROUP)
    int8_max_drop: float = int8_max_drop_option()
    int8_atol: float | None = option(None, "max abs error of INT8 outputs other than regression (default: reported, not gated)", check=non_negative, group=GATE_GROUP)
    fp16_max_rel_error: float = option(0.02, "regression outputs without targets: max RMS change of FP16 over the FP32 output's "
                                             "standard deviation", check=non_negative, group=GATE_GROUP)
    int8_max_rel_error: float = option(0.1, "regression outputs without targets: max RMS change of INT8 over the FP32 output's "
                                            "standard deviation (0.1: a hundredth of its variance)", check=non_negative, group=GATE_GROUP)
    fp16_min_cosine: float = option(0.999, "embedding outputs: min mean cosine similarity of FP16 to FP32 per sample",
                                    check=in_range(-1, 1), group=GATE_GROUP)
    int8_min_cosine: float = option(0.99, "embedding outputs: min mean cosine similarity of INT8 to FP32 per sample",
                                    check=in_range(-1, 1), group=GATE_GROUP)
    fp16_min_cosine_low: float = option(0.995, "embedding outputs: min 5th-percentile cosine similarity of FP16 to FP32",
                                        check=in_range(-1, 1), group=GATE_GROUP)
    int8_min_cosine_low: float = option(0.95, "embedding outputs: min 5th-percentile cosine similarity of INT8 to FP32",
                                        check=in_range(-1, 1), group=GATE_GROUP)
    fp16_min_neighbour_agreement: float = option(0.98, "embedding outputs: min share of evaluation samples whose nearest neighbour "
                                                       "(among the evaluation set) stays the same with FP16", check=in_range(0, 1), group=GATE_GROUP)
    int8_min_neighbour_agreement: float = option(0.9, "embedding outputs: min share of evaluation samples whose nearest neighbour "
                                                      "stays the same with INT8", check=in_range(0, 1), group=GATE_GROUP)
    binary_threshold: float = option(0.5, "binary and multi-label outputs: the decision threshold on the probability "
                                          "(logit outputs are cut at its logit)", check=in_range(1e-6, 1 - 1e-6), group=GATE_GROUP)
    gate_confidence: float = confidence_option()


@dataclass(frozen=True)
class Tolerance:
    """What one variant is held to (picked from :class:`Gates` by precision); the field names are the
    ``limit_key`` of the figures they limit (pipeline.accuracy.taskstats.Figure)."""

    max_drop_points: float
    atol: float | None
    min_cosine: float
    confidence: float
    max_rel_error: float
    min_cosine_low: float
    min_neighbour_agreement: float
    threshold: float


def tolerance_for(precision: str, gates: Gates, *, engine: bool = False, tf32: bool = True) -> Tolerance:
    """INT8 has its own tolerance; FP16 and FP32 engines share FP16's, except the FP32 engine's max abs
    error: ``tf32_atol`` when it was built with TF32 (TensorRT's default), else ``fp32_engine_atol``."""
    p = "int8" if precision.startswith("int8") else "fp16"
    atol = getattr(gates, f"{p}_atol")
    if engine and precision == "fp32":
        atol = gates.tf32_atol if tf32 else gates.fp32_engine_atol
    return Tolerance(getattr(gates, f"{p}_max_drop"), atol, getattr(gates, f"{p}_min_cosine"), gates.gate_confidence,
                     getattr(gates, f"{p}_max_rel_error"), getattr(gates, f"{p}_min_cosine_low"), getattr(gates, f"{p}_min_neighbour_agreement"),
                     gates.binary_threshold)  # fmt: skip
