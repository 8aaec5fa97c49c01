"""``python -m pipeline build``: the command line generated from :class:`pipeline.build.config.BuildConfig`."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import time

from typing import TYPE_CHECKING

from pipeline.core.options import add_options, config_from_values, values_from_namespace

if TYPE_CHECKING:  # imported where used: importing this module does not load the config
    from pipeline.build.config import BuildConfig

DESCRIPTION = (
    "Build deployable variants of a Keras model. Stages: export a SavedModel, convert it to ONNX with "
    "tf2onnx and check it against TensorFlow on real samples (parity gate), make FP16/INT8 variants, "
    "build TensorRT engines where TensorRT and a GPU exist, gate accuracy with Polygraphy, publish a "
    "Triton model repository. Stages whose inputs and settings are unchanged are skipped."
)
EXAMPLES = (
    "examples:\n"
    "  python -m pipeline build                          # bundled digits CNN, FP32\n"
    "  python -m pipeline build --int8                   # + INT8 (explicit Q/DQ) from calibration/digits\n"
    "  python -m pipeline build --model my.keras --fp16 --int8 --calibration data/calib.npz\n"
    "  python -m pipeline build --model pkg.models:make_model --shape tokens:1x16/8x64/32x128\n"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``build`` with one flag per BuildConfig option."""
    from pipeline.build.config import BuildConfig

    p = subparsers.add_parser(
        "build",
        help="Keras model → ONNX (parity-checked) → FP16/INT8 → TensorRT → Triton repository",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, BuildConfig)
    p.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> BuildConfig:
    """The BuildConfig of a parsed command line, with the command recorded for reproduction."""
    from pipeline.build.config import BuildConfig

    cfg = config_from_values(BuildConfig, values_from_namespace(BuildConfig, args))
    return dataclasses.replace(cfg, command="python -m pipeline " + shlex.join(args.argv))


def run(args: argparse.Namespace) -> int:
    """Run the build and print its summary (``--fleet``: every model of the fleet file, pipeline/commands/fleet.py)."""
    cfg = config_from_args(args)
    if cfg.fleet is not None:
        from pipeline.commands.fleet import run_fleet

        cfg.validate()
        return run_fleet(cfg)
    from pipeline.core.errors import require

    require(cfg.k8s_job is None and cfg.fleet_index is None, "--k8s-job and --fleet-index need --fleet", "pass --fleet FILE")
    return run_build(cfg)


def run_build(cfg: BuildConfig) -> int:
    """Build ``cfg`` (e.g. a parsed command line with another ``tensorrt``) and print its summary; 0 on success."""
    from pipeline.build.orchestrator import build, workspace_of
    from pipeline.core.errors import PipelineError
    from pipeline.reports.dirs import page_dir
    from pipeline.reports.terminal import print_build_summary

    started = time.time()
    try:
        result = build(cfg)
    except PipelineError:
        # A build that failed late (a gate, the served check) still shows what it did before the error line.
        ws = workspace_of(cfg)
        if ws is not None and ws.manifest.is_file() and ws.manifest.stat().st_mtime >= started:
            print_build_summary(ws.root.name, ws.manifest, None, html_reports=page_dir(cfg.report_dir, cfg.workdir))
        raise
    print_build_summary(result.name, result.manifest, result.repository, html_reports=page_dir(cfg.report_dir, cfg.workdir))
    return 0
