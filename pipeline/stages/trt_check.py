"""Will TensorRT parse and build each GPU variant? Checked with a real builder where TensorRT cannot run.

:func:`trt_check_from_onnx` builds every GPU-bound ONNX variant (fp32, fp16, int8 Q/DQ; never the
CPU-only uint8 variants) through TensorRT-RTX (:class:`~pipeline.backend.trt_rtx.RtxTensorRT`),
ahead of time for a named compute capability, with the engine stage's own settings
(:class:`~pipeline.stages.engine.EngineSettings`: the same optimization profiles, optimization level,
workspace, TF32 and hardware compatibility) and the same code (:func:`~pipeline.backend.trt_compile.compile_plan`).
The plans are dropped: TensorRT-RTX plans are not what Triton's TensorRT backend loads.

The report (``trt_check.json``, and the build manifest's ``results``): per variant whether it
built, the network's layer count, the build's seconds and plan size, or each node the parser
refused as one line (node, op, the parser's words). :func:`parser_problems` adds the
version-gated hand-written rules; where neither TensorRT nor TensorRT-RTX is installed the build
falls back to all the hand-written operator rules of :mod:`pipeline.backend.trt_support`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from pipeline.backend.trt_compile import ParseFailed
from pipeline.backend.trt_rtx import RtxTensorRT, rtx_version
from pipeline.core.atomic import write_text_atomic
from pipeline.core.errors import PipelineError
from pipeline.stages.engine import EngineSettings, engine_request

log = logging.getLogger(__name__)

CHECKER = "TensorRT-RTX"
CHECK_FILE = "trt_check.json"  # in the model's workspace


def trt_check_from_onnx(onnx_paths: list[Path], dst: Path, *, engines: tuple[EngineSettings, ...], compute_capability: str) -> dict[str, Any]:
    """Build each of ``onnx_paths`` (its settings the same index of ``engines``) with TensorRT-RTX for
    ``compute_capability``; write the report to ``dst`` and return it (see the module docstring)."""
    if len(onnx_paths) != len(engines):
        raise PipelineError(f"{len(onnx_paths)} ONNX models but {len(engines)} engine settings", "pass one EngineSettings per model")
    tensorrt = RtxTensorRT(compute_capability)
    variants: dict[str, dict[str, Any]] = {}
    for path, settings in zip(onnx_paths, engines):
        started = time.perf_counter()
        entry: dict[str, Any]
        try:
            built = tensorrt.build(engine_request(Path(path), settings, timing_cache=None))
        except ParseFailed as exc:
            entry = {"built": False, "errors": [f.line() for f in exc.failures] or [exc.problem]}
        except PipelineError as exc:
            entry = {"built": False, "errors": [exc.problem]}
        else:
            entry = {"built": True, "layers": built.facts.layers, "plan_bytes": len(built.plan), "errors": []}
        entry["seconds"] = round(time.perf_counter() - started, 3)
        entry["onnx"] = str(path)
        variants[settings.precision] = entry
        if entry["built"]:
            log.info("TensorRT-RTX built the %s graph: %d layers in %.1f s", settings.precision, entry["layers"], entry["seconds"])
        for line in entry["errors"]:
            log.warning("TensorRT-RTX could not build the %s graph: %s", settings.precision, line)
    report = {"checker": f"{CHECKER} {rtx_version()}", "compute_capability": compute_capability, "variants": variants}
    write_text_atomic(Path(dst), json.dumps(report, indent=2) + "\n")
    return report


def read_trt_check(path: Path) -> dict[str, Any]:
    """A report :func:`trt_check_from_onnx` wrote."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def problems_of(report: dict[str, Any]) -> dict[str, list[str]]:
    """``{variant: [one line per problem]}`` of a report (empty lists: built)."""
    return {variant: list(entry["errors"]) for variant, entry in report["variants"].items()}


def parser_problems(report: dict[str, Any] | None, onnx_of: dict[str, Path]) -> tuple[dict[str, list[str]], str]:
    """``{variant: [one line per problem]}`` and which check found them. With a TensorRT-RTX ``report``: its refusals and
    the version-gated hand-written rules (ops and types onnx-tensorrt added after the oldest TensorRT the engine stage
    builds with, which TensorRT-RTX's newer parser takes); without one (None), all the hand-written rules
    (:func:`pipeline.backend.trt_support.warn_unparsable`) on ``onnx_of`` (``{variant: ONNX path}``)."""
    from pipeline.backend.trt_support import support_data, warn_unparsable, warn_version_gated

    if report is None:
        log.info("checking the GPU variants against the hand-written ONNX parser rules (TensorRT-RTX is not installed)")
        return warn_unparsable(onnx_of), f"hand-written rules for TensorRT {support_data()['default_target']} (pipeline/backend/trt_support.py)"
    gated = warn_version_gated(onnx_of)
    problems = {variant: lines + gated.get(variant, []) for variant, lines in problems_of(report).items()}
    return problems, f"{report['checker']} (compute capability {report['compute_capability']})"


def refusal(problems: dict[str, list[str]], checker: str) -> None:
    """PipelineError naming the first refused variant and its first problem (``--require-tensorrt``); nothing when none is."""
    refused = [(variant, lines) for variant, lines in problems.items() if lines]
    if refused:
        variant, lines = refused[0]
        raise PipelineError(f"the {variant} graph does not build with TensorRT ({checker}): {lines[0]}",
                            "change the model (see docs/tensorrt.md), or leave out --require-tensorrt to serve its ONNX variant "
                            "with ONNX Runtime")
