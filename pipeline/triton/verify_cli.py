"""`python -m pipeline verify`: evaluation accuracy through Triton, beside the in-process numbers."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pipeline.console import console
from pipeline.errors import PipelineError
from pipeline.report import served_table

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
    from pipeline.triton.verify import verify_repository

    if args.batch_size < 1:
        raise PipelineError(f"--batch-size {args.batch_size} must be at least 1", "pass a positive batch size")
    verify_repository(
        args.repository,
        url=args.url,
        models=args.model,
        calibration_root=args.calibration_root,
        batch_size=args.batch_size,
        atol=args.atol,
        max_drop={"fp16": args.fp16_max_drop, "int8": args.int8_max_drop},
        report_path=args.report,
        show=lambda rows: console().print(served_table(rows)),
    )
    return 0
