"""One variant's outputs judged on arrays, the way the build judges them (compare → taskstats → judging): the
helper the gate tests share."""

from __future__ import annotations

import numpy as np

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.gates import Gates, Tolerance, tolerance_for
from pipeline.accuracy.judging import VariantResult, judge_comparison
from pipeline.accuracy.outputkinds import OutputKind

INT8 = tolerance_for("int8", Gates(int8_atol=None))  # 1-point drop limit at 95% (the defaults), no max abs error


def judge(kind: OutputKind, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None = None, batch: int = 100,
          tolerance: Tolerance = INT8) -> VariantResult:
    """The INT8 ONNX variant's verdict on one output: ``ref`` FP32's and ``out`` its outputs, ``target`` the labels,
    fed ``batch`` samples at a time."""
    comparison = new_comparison("int8-onnx", {kind.name: kind}, tolerance.threshold)
    for i in range(0, len(ref), batch):
        comparison.add({kind.name: ref[i : i + batch]}, {kind.name: out[i : i + batch]},
                       {} if target is None else {kind.name: target[i : i + batch]})  # fmt: skip
    return judge_comparison("int8-onnx", "int8", "onnx", comparison, tolerance, {kind.name: kind})
