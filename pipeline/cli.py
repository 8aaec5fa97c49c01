"""The command line: `python -m pipeline {build,serve,verify,loadtest,mig-plan}`.

User errors (PipelineError) are printed as one line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.argtypes import number
from pipeline.errors import PipelineError

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits itself; keep it to one line and our exit code
        self.exit(EXIT_USER_ERROR, f"error: {message} — see '{self.prog} --help'\n")


def _register_build(sub: argparse._SubParsersAction) -> None:
    from pipeline.stages.calibration import PREPROCESS_MODES
    from pipeline.stages.int8 import CALIBRATION_METHODS
    from pipeline.stages.source import DEFAULT_MODEL

    p = sub.add_parser(
        "build",
        help="Keras model → ONNX (parity-checked) → FP16/INT8 → TensorRT → Triton repository",
        description=(
            "Build deployable variants of a Keras model. Stages: export a SavedModel, convert it to ONNX with "
            "tf2onnx and check it against TensorFlow on real samples (parity gate), make FP16/INT8 variants, "
            "build TensorRT engines where TensorRT and a GPU exist, gate accuracy with Polygraphy, publish a "
            "Triton model repository. Stages whose inputs and settings are unchanged are skipped."
        ),
        epilog=(
            "examples:\n"
            "  python -m pipeline build                          # bundled digits CNN, FP32\n"
            "  python -m pipeline build --int8                   # + INT8 (explicit Q/DQ) from calibration/digits\n"
            "  python -m pipeline build --model my.keras --fp16 --int8 --calibration data/calib.npz\n"
            "  python -m pipeline build --model pkg.models:make_model --shape tokens:1x16/8x64/32x128\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("model")
    src.add_argument("--model", default=DEFAULT_MODEL, metavar="PATH|MODULE:FUNC",
                     help="a .keras file, a SavedModel folder, or module:function returning a Keras model (default: the bundled digits CNN, %(default)s)")
    src.add_argument("--name", help="model name in the workdir and Triton (default: file stem, folder name, or module name)")
    src.add_argument("--eval-data", type=Path, metavar="NPZ", help="labeled evaluation data: one array per input name plus 'labels' (default: <calibration-root>/<name>/eval.npz)")
    out = p.add_argument_group("outputs")
    out.add_argument("--workdir", type=Path, default=Path("build"), help="build artifacts, manifest and reports (default: %(default)s)")
    out.add_argument("--repository", type=Path, default=Path("model_repository"), help="Triton model repository to publish to (default: %(default)s)")
    out.add_argument("--version-policy", choices=("new", "replace"), default="new", help="add a new numbered version, or replace the pipeline's versions (default: %(default)s)")
    out.add_argument("--triton-image", metavar="IMAGE", help="NGC tritonserver image for the deploy bundle (default: nvcr.io/nvidia/tritonserver:24.10-py3, Triton 2.51 as served here)")
    out.add_argument("--mig", metavar="GPU[:LAYOUT]", help="add per-MIG-profile configs and a launch bundle, e.g. H200-141GB or A100-80GB:3x2g.20gb,1x1g.10gb (see mig-plan)")
    conv = p.add_argument_group("conversion")
    conv.add_argument("--opset", type=int, default=17, help="ONNX opset, 17 or newer (default: %(default)s)")
    conv.add_argument("--max-batch", type=int, default=64, help="largest batch the deployment serves (default: %(default)s)")
    conv.add_argument("--parity-atol", type=number, default=1e-4, help="max abs difference ONNX vs TensorFlow per output (default: %(default)g)")
    conv.add_argument("--parity-rtol", type=number, default=0.0, help="alternatively, max relative difference (default: off)")
    prec = p.add_argument_group("precision (the precision lives in the ONNX graph; engines are strongly typed)")
    prec.add_argument("--fp16", action="store_true", help="add an FP16 ONNX variant (FP32 inputs/outputs; Softmax and other sensitive ops kept FP32)")
    prec.add_argument("--int8", action="store_true", help="add an INT8 variant: explicit Q/DQ, symmetric int8, zero point 0, per-channel weights")
    prec.add_argument("--calibration", type=Path, metavar="PATH",
                      help="INT8 calibration data: an .npz (one array per input), a folder with calib.npz or <input>.npy files, "
                           "or a folder of JPEG/PNG images (default: <calibration-root>/<name>/)")
    prec.add_argument("--calibration-root", type=Path, default=Path("calibration"), help="where per-model data folders live (default: %(default)s)")
    prec.add_argument("--calibration-method", choices=CALIBRATION_METHODS, default="minmax",
                      help="how activation ranges are chosen (default: %(default)s; see README for the measurements behind it)")
    prec.add_argument("--preprocess", choices=PREPROCESS_MODES, default="unit",
                      help="image calibration only: unit = 0..1, symmetric = -1..1, imagenet = RGB mean/std, raw = 0..255 (default: %(default)s)")
    eng = p.add_argument_group("TensorRT engines (need the 'tensorrt' extra and an NVIDIA GPU; skipped with one line otherwise)")
    eng.add_argument("--shape", action="append", default=[], metavar="INPUT:MIN/OPT/MAX",
                     help="dynamic-shape profile of an input, dims joined by x, e.g. image:1x8x8x1/64x8x8x1/64x8x8x1; "
                          "repeat for more inputs; naming an input again starts the next profile (default: batch 1/max/max)")
    eng.add_argument("--no-engine", dest="engine", action="store_false", help="do not build TensorRT engines even where possible")
    eng.add_argument("--optimization-level", type=int, default=3, choices=range(6), metavar="0-5", help="TensorRT builder optimization level (default: %(default)s)")
    gate = p.add_argument_group("accuracy gates (against FP32 ONNX on the labeled evaluation data)")
    gate.add_argument("--fp16-max-drop", type=number, default=0.2, help="max top-1 accuracy drop of FP16 (and FP32 engines), in points (default: %(default)g)")
    gate.add_argument("--fp16-atol", type=number, default=1e-2, help="max abs error of FP16 outputs (default: %(default)g)")
    gate.add_argument("--int8-max-drop", type=number, default=1.0, help="max top-1 accuracy drop of INT8, in points (default: %(default)g)")
    served = p.add_argument_group("served check")
    served.add_argument("--verify-served", action="store_true", help="after publishing, start the embedded tritonserver and run `verify` on the new variants")
    served.add_argument("--verify-url", metavar="HOST:PORT", help="after publishing, verify through this running Triton (HTTP) instead")
    p.set_defaults(handler=_run_build)


def _run_build(args: argparse.Namespace) -> int:
    from pipeline.build import build
    from pipeline.config import BuildConfig, Gates

    cfg = BuildConfig(
        model=args.model,
        name=args.name,
        workdir=args.workdir,
        repository=args.repository,
        calibration_root=args.calibration_root,
        eval_data=args.eval_data,
        opset=args.opset,
        max_batch=args.max_batch,
        fp16=args.fp16,
        int8=args.int8,
        calibration=args.calibration,
        calibration_method=args.calibration_method,
        preprocess=args.preprocess,
        shapes=tuple(args.shape),
        engine=args.engine,
        optimization_level=args.optimization_level,
        version_policy=args.version_policy,
        mig=args.mig,
        triton_image=args.triton_image,
        verify_served=args.verify_served,
        verify_url=args.verify_url,
        gates=Gates(
            parity_atol=args.parity_atol,
            parity_rtol=args.parity_rtol,
            fp16_max_drop=args.fp16_max_drop,
            fp16_atol=args.fp16_atol,
            int8_max_drop=args.int8_max_drop,
        ),
        command="python -m pipeline " + shlex.join(args.argv),
    )
    result = build(cfg)
    from pipeline.report import print_build_summary

    print_build_summary(result)
    return 0


def make_parser() -> argparse.ArgumentParser:
    """The full parser, with every command registered."""
    parser = _Parser(prog="python -m pipeline", description="Deploy Keras models to TensorRT and Triton Inference Server.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    _register_build(sub)
    from pipeline.loadtest.cli import register as register_loadtest
    from pipeline.mig.cli import register as register_mig_plan
    from pipeline.triton.deploy import register as register_deploy
    from pipeline.triton.serve_cli import register as register_serve
    from pipeline.triton.verify_cli import register as register_verify

    register_serve(sub)
    register_verify(sub)
    register_deploy(sub)
    register_loadtest(sub)
    register_mig_plan(sub)
    from pipeline.tune.cli import register as register_tune; register_tune(sub)  # noqa: E702 (one line: tune's registration)
    return parser


def _setup_logging(verbose: bool) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, show_time=True, markup=False, rich_tracebacks=False)],
    )
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.INFO if verbose else G_LOGGER.WARNING
    for noisy in ("tensorflow", "absl", "tf2onnx", "h5py", "matplotlib", "PIL", "urllib3", "polygraphy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    args.argv = argv
    _setup_logging(args.verbose)
    try:
        return int(args.handler(args))
    except PipelineError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
