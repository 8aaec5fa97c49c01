"""`python -m pipeline inspect MODEL`: what a model is and whether TensorRT's ONNX parser takes it."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import require
from pipeline.core.options import add_options, check_options, config_from_values, in_range, option, values_from_namespace
from pipeline.data.profiles import SHAPE_SYNTAX, well_formed


def _trt_versions() -> tuple[str, ...]:
    from pipeline.backend.trt_support import targets

    return targets()


@dataclass(frozen=True)
class InspectConfig:
    """Every ``inspect`` option (the model itself is the positional argument)."""

    shapes: tuple[str, ...] = option((), "a --shape as build takes it (INPUT:MIN/OPT/MAX); repeat for more inputs or profiles",
                                     flag="--shape", metavar="INPUT:MIN/OPT/MAX")
    max_batch: int = option(64, "largest batch the deployment serves (the profiles' batch axis)", check=in_range(1, 4096), fix="use a value from 1 to 4096")
    calibration: Path | None = option(None, "calibration arrays (.npz or .npy folder) whose sizes size the dynamic axes, as build does", metavar="PATH")
    eval_data: Path | None = option(None, "evaluation arrays (.npz or .npy folder) whose sizes size the dynamic axes, as build does", metavar="PATH")
    trt_versions: tuple[str, ...] = option((), "TensorRT version(s) whose ONNX parser the graph is checked against "
                                               "(default: 10.8, what build needs; 10.5 is what tritonserver:24.10 runs)", flag="--trt-version", metavar="VERSION")
    check_compute_capability: str = option("8.0", "where TensorRT-RTX is installed (and no --trt-version is given), build the graph "
                                                  "with it ahead of time for this compute capability, as build's check does",
                                           choices=("7.5", "8.0", "8.6", "8.9", "12.0", "12.1"), metavar="MAJOR.MINOR")
    opset: int = option(17, "ONNX opset for converting a Keras model / SavedModel (as build)", check=lambda v: None if v >= 17 else "is too old",
                        fix="use --opset 17 or newer")
    allow_lambda: bool = option(False, "load Lambda layers of a .keras or .h5 file (runs Python code stored in the file: only for files you trust)")
    show_layers: bool = option(False, "include Polygraphy's per-layer listing")
    json: bool = option(False, "print the report as JSON instead of text")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``inspect`` command."""
    p = subparsers.add_parser(
        "inspect",
        help="inputs/outputs, dynamic axes, profiles, op counts, Q/DQ nodes, and TensorRT ONNX-parser support of a model",
        description=(
            "Inspect a .keras file, a SavedModel folder, module:function, an ONNX file or a TensorRT plan: inputs and outputs "
            "with dtypes and dynamic axes, the optimization profiles a build would use (sized from --calibration/--eval-data "
            "like build), op-type counts, which nodes of a Q/DQ model are quantized, and whether TensorRT's ONNX parser "
            "(onnx-tensorrt's operator list; by default that of the TensorRT the engine stage needs, see --trt-version) "
            "takes every node. Keras models are converted as "
            "build converts them. Exit status 1 when the parser check finds problems."
        ),
        epilog=(
            "examples:\n"
            "  python -m pipeline inspect build/digits/model.int8.onnx\n"
            "  python -m pipeline inspect my_model.keras --eval-data data/eval.npz\n"
            "  python -m pipeline inspect model.onnx --trt-version 10.5 --trt-version 10.15 --json\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="a .keras file, a SavedModel folder, module:function, an .onnx file or a .plan")
    add_options(p, InspectConfig)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Inspect the model; print the report; 1 if TensorRT's parser would refuse part of it."""
    from pipeline.core.console import console
    from pipeline.inspect.report import inspection_from_model

    cfg = config_from_values(InspectConfig, values_from_namespace(InspectConfig, args))
    check_options(cfg)
    for text in cfg.shapes:
        require(well_formed(text), f"malformed --shape '{text}': expected {SHAPE_SYNTAX}", "write e.g. --shape image:1x8x8x1/32x8x8x1/64x8x8x1")
    bad = [v for v in cfg.trt_versions if v not in _trt_versions()]
    require(not bad, f"no ONNX parser data for TensorRT {', '.join(bad)}", f"use --trt-version with one of: {', '.join(_trt_versions())}")
    for path in (cfg.calibration, cfg.eval_data):
        require(path is None or path.exists(), f"'{path}' does not exist", "pass an .npz file or a folder of .npy files")
    report = inspection_from_model(
        args.model, shapes=cfg.shapes, max_batch=cfg.max_batch, data=[p for p in (cfg.calibration, cfg.eval_data) if p is not None],
        targets=cfg.trt_versions,
        show_layers=cfg.show_layers, opset=cfg.opset, allow_lambda=cfg.allow_lambda, compute_capability=cfg.check_compute_capability,
    )
    out = console()
    if cfg.json:
        out.print_json(json.dumps(report.as_json()))
    else:
        for line in report_lines(report):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    return 1 if any(report.parser.values()) or report.tensorrt.get("errors") else 0


def report_lines(report) -> list[str]:  # type: ignore[no-untyped-def]
    """The text report, one string per line."""
    from pipeline.inspect.report import counts_line, quantized_summary

    lines = [f"{report.model} ({report.kind})"]
    if report.onnx and report.onnx != report.model:
        lines.append(f"  ONNX: {report.onnx}")
    if report.opset is not None:
        lines.append(f"  opset {report.opset}")
    lines += [f"  note: {n}" for n in report.notes]
    for title, tensors in (("inputs", report.inputs), ("outputs", report.outputs)):
        lines.append(f"{title}:")
        for t in tensors:
            shape = ", ".join(str(d) for d in t.get("shape", []))
            dynamic = t.get("dynamic_axes")
            lines.append(f"  {t.get('name')}: {t.get('dtype')} [{shape}]" + (f"  dynamic axes {dynamic}" if dynamic else ""))
    lines.append("optimization profiles of this plan:" if report.kind == "plan" else "optimization profiles a build would use:")
    lines += [f"  {i}: {p}" for i, p in enumerate(report.profiles)] or ["  (none)"]
    if report.op_counts:
        lines.append(f"ops ({sum(report.op_counts.values())} nodes): {counts_line(report.op_counts)}")
    if report.quantized:
        lines.append(f"quantized (Q/DQ) nodes: {counts_line(dict(quantized_summary(report.quantized)))}")
        for q in report.quantized:
            lines.append(f"  {q.op} '{q.node}': " + ", ".join(f"{name} {how}" for name, how in q.inputs.items()))
        if report.float_compute:
            lines.append(f"  left in float: {', '.join(report.float_compute)}")
    built = report.tensorrt
    if built:
        where = f"{built['checker']}, ahead of time for compute capability {built['compute_capability']}"
        if built.get("built"):
            lines.append(f"TensorRT build ({where}): built, {built['layers']} layers in {built['seconds']:.2f} s")
        else:
            lines.append(f"TensorRT build ({where}): refused")
            lines += [f"  {p}" for p in built.get("errors", [])]
    for target, problems in report.parser.items():
        rules = "version-gated rules" if built else "onnx-tensorrt operator list"
        if problems:
            lines.append(f"TensorRT {target} ONNX parser{' (version-gated rules)' if built else ''}: {len(problems)} problem(s)")
            lines += [f"  {p}" for p in problems]
        else:
            lines.append(f"TensorRT {target} ONNX parser: every node is supported ({rules})")
    if report.polygraphy:
        lines.append("Polygraphy:")
        lines += [f"  {line}" for line in report.polygraphy.splitlines()]
    return lines
