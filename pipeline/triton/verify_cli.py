"""`python -m pipeline verify`: evaluation accuracy through Triton, beside the in-process numbers."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import time
from pathlib import Path

from pipeline.console import console
from rich.table import Table

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``verify`` command."""
    p = subparsers.add_parser(
        "verify",
        help="send the labeled evaluation set through Triton for every served variant; compare with in-process numbers",
        description=(
            "Starts the embedded tritonserver on the repository (or uses --url), sends every evaluation sample through "
            "each served ONNX variant, and compares the served outputs with the same model file run in process (INT8 "
            "with exact Q/DQ semantics, as TensorRT computes them). Fails when served outputs drift from in-process "
            "ones, or when a served variant's accuracy drops more than its gate below served FP32."
        ),
        epilog="example:\n  python -m pipeline verify                 # embedded server on model_repository/\n"
        "  python -m pipeline verify --url 127.0.0.1:8000 --model digits_int8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repository", type=Path, default=Path("model_repository"), help="Triton model repository (default: %(default)s)")
    p.add_argument("--url", help="HTTP endpoint of a running Triton (host:port); default: start the embedded server")
    p.add_argument("--model", action="append", default=[], help="only these Triton models (repeatable; default: every pipeline variant)")
    p.add_argument("--calibration-root", type=Path, default=Path("calibration"), help="where <model>/eval.npz lives (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per request (default: %(default)s)")
    p.add_argument("--atol", type=float, default=1e-3, help="max abs difference served vs in-process (default: %(default)g)")
    p.add_argument("--fp16-max-drop", type=float, default=0.2, help="points of served accuracy FP16 may lose vs served FP32 (default: %(default)g)")
    p.add_argument("--int8-max-drop", type=float, default=1.0, help="points of served accuracy INT8 may lose vs served FP32 (default: %(default)g)")
    p.add_argument("--report", type=Path, default=Path("build") / "verify.json", help="JSON report (default: %(default)s)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Verify every served variant; raise PipelineError naming the failures."""
    from pipeline.evaldata import eval_data_from_npz
    from pipeline.stages.accuracy import classifier_output
    from pipeline.tensors import signature_from_onnx
    from pipeline.triton.repository import read_repository
    from pipeline.triton.server import TritonServer
    from pipeline.triton.verify import gate_against_fp32, parse_variant, results_as_json, verify_served_model

    if args.batch_size < 1:
        raise PipelineError(f"--batch-size {args.batch_size} must be at least 1", "pass a positive batch size")
    models = {}
    for name, model in sorted(read_repository(args.repository).items()):
        if args.model and name not in args.model:
            continue
        if model.config.platform != "onnxruntime_onnx" or parse_variant(name) is None:
            log.info("%s: not verified here (%s)", name, model.config.platform or model.config.backend)
            continue
        models[name] = model
    missing = sorted(set(args.model) - set(models))
    if missing or not models:
        raise PipelineError(f"no servable pipeline ONNX model named {missing or 'any'} in {args.repository}", "run `python -m pipeline build` or check --model")

    server = None if args.url else TritonServer(args.repository)
    results = []
    with server if server else contextlib.nullcontext():
        url = args.url or server.http_url  # type: ignore[union-attr]
        for name, model in models.items():
            base, _ = parse_variant(name)  # type: ignore[misc]
            version = max(model.versions)
            model_file = model.path / str(version) / (model.config.default_model_filename or "model.onnx")
            signature = signature_from_onnx(model_file)
            eval_path = args.calibration_root / base / "eval.npz"
            if not eval_path.exists():
                raise PipelineError(f"no evaluation data for '{base}' at {eval_path}", "pass --calibration-root with <model>/eval.npz")
            data = eval_data_from_npz(eval_path, signature)
            output = classifier_output(signature) or signature.outputs[0].name
            batch = min(args.batch_size, model.config.max_batch_size or args.batch_size)
            log.info("verifying %s v%d through %s (%d samples)", name, version, url, data.num_samples)
            results.append(verify_served_model(url, name, model_file, data, signature, output, batch_size=batch, atol=args.atol))
    gate_against_fp32(results, {"fp16": args.fp16_max_drop, "int8": args.int8_max_drop})

    report = {"url": args.url or "embedded", "repository": str(args.repository), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "models": results_as_json(results)}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    console().print(_table(report["models"]))
    failed = [r for r in results if r.failures]
    if failed:
        raise PipelineError(
            "served accuracy check failed: " + "; ".join(f"{r.model}: {', '.join(r.failures)}" for r in failed) + f" (report: {args.report})",
            "for INT8, make sure the server keeps Q/DQ (optimization graph level -1 in config.pbtxt)",
        )
    return 0


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


def _table(rows: list[dict]) -> Table:
    table = Table(title="accuracy through Triton vs in process")
    for column in ("model", "ver", "samples", "served", "in-process", "top-1 agree", "max abs diff", "check"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        table.add_row(
            r["model"], str(r["version"]), str(r["samples"]), _pct(r["served_accuracy"]), _pct(r["inprocess_accuracy"]),
            _pct(r["top1_agreement"]), f"{r['max_abs_diff']:.1e}", "[green]pass[/]" if r["passed"] else "[red]FAIL[/]",
        )
    return table
