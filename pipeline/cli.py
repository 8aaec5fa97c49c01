"""The command line: `python -m pipeline {build,serve,verify,loadtest,mig-plan}`.

User errors (PipelineError) are printed as one line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.errors import PipelineError

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits itself; keep it to one line and our exit code
        self.exit(EXIT_USER_ERROR, f"error: {message} — see '{self.prog} --help'\n")


def make_parser() -> argparse.ArgumentParser:
    """The full parser, with every command registered."""
    parser = _Parser(prog="python -m pipeline", description="Deploy Keras models to TensorRT and Triton Inference Server.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    from pipeline.build_cli import register as register_build
    from pipeline.loadtest.cli import register as register_loadtest
    from pipeline.mig.cli import register as register_mig_plan
    from pipeline.triton.deploy_cli import register as register_deploy
    from pipeline.triton.serve_cli import register as register_serve
    from pipeline.triton.verify_cli import register as register_verify

    register_build(sub)
    register_serve(sub)
    register_verify(sub)
    register_deploy(sub)
    register_loadtest(sub)
    register_mig_plan(sub)
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
