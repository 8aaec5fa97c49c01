"""The command line: `python -m pipeline {build,serve,verify,deploy,loadtest,mig-plan,inspect,report,tune}`.

User errors (PipelineError) print one line and exit 2, failed checks (CheckFailed) exit 1, Ctrl-C exits 130; no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pipeline.core.errors import EXIT_INTERRUPTED, PipelineError, path_error

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits itself; keep it to one line and our exit code
        self.exit(EXIT_USER_ERROR, f"error: {message} — see '{self.prog} --help'\n")


def make_parser() -> argparse.ArgumentParser:
    """The full parser, with every command registered."""
    parser = _Parser(prog="python -m pipeline", description="Deploy Keras models to TensorRT and Triton Inference Server.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    from pipeline.commands.build import register as register_build
    from pipeline.commands.configfile import add_config_options
    from pipeline.commands.deploy import register as register_deploy
    from pipeline.commands.inspect import register as register_inspect
    from pipeline.commands.loadtest import register as register_loadtest
    from pipeline.commands.mig_plan import register as register_mig_plan
    from pipeline.commands.report import register as register_report
    from pipeline.commands.serve import register as register_serve
    from pipeline.commands.verify import register as register_verify

    register_build(sub)
    register_serve(sub)
    register_verify(sub, refresh_page)
    register_deploy(sub)
    register_loadtest(sub, refresh_page)
    register_mig_plan(sub)
    register_inspect(sub)
    register_report(sub)
    from pipeline.commands.tune import register as register_tune

    register_tune(sub, refresh_page)
    add_config_options(sub)  # --config FILE and --print-config on every command (register commands above this line)
    return parser


def refresh_page(workdir: Path, folder: Path) -> Path | None:
    """The HTML page of ``workdir`` in ``folder``, refreshed after a command that wrote a report: the
    command line passes it to ``verify``, ``loadtest`` and ``tune`` when it registers them (a program that
    registers them without it gets no page)."""
    from pipeline.reports.html import refresh_html_report

    return refresh_html_report(workdir, folder)


def _setup_logging(verbose: bool, command: str | None = None) -> None:
    from rich.logging import RichHandler

    from pipeline.core.console import err_console
    from pipeline.core.logs import quiet_environment, quiet_libraries

    quiet_environment(verbose)  # read by the C++ libraries at import: before any import
    console = err_console()
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False, show_time=True, markup=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:  # a pipe or a CI log: whole lines, no wrapping, the level only where it matters
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_PlainFormatter())
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    quiet_libraries(verbose)
    if command == "build" and not verbose and not console.is_terminal:
        # Piped, a build says what each stage did (one line each, and one per long step) and prints its
        # tables; the details stay behind -v. Warnings (e.g. TensorRT missing) always show.
        logging.getLogger("pipeline").setLevel(logging.WARNING)
        for keep in ("pipeline.core.stagecache", "pipeline.core.progress", "pipeline.commands.build", "pipeline.stages.shapes", "pipeline.accuracy.outputkinds"):  # shapes: the profiles and the --shape that reproduces them
            logging.getLogger(keep).setLevel(logging.INFO)


class _PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno == logging.INFO else f"{record.levelname}: {message}"


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    from pipeline.commands import configfile

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    try:
        configfile.load_config_defaults(_commands(parser), argv)  # the file's values become defaults; flags override
    except PipelineError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    args = parser.parse_args(argv)
    configfile.finish(parser, args, argv)
    args.argv = argv
    if getattr(args, "print_config", False):
        sys.stdout.write(configfile.effective_config(parser, args))
        return 0
    _setup_logging(args.verbose, args.command)
    try:
        return int(args.handler(args))
    except PipelineError as exc:  # CheckFailed: 1 (a measured check said no); any other: 2 (usage or input)
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    except OSError as exc:
        if exc.filename is None:  # not about a path: a bug, keep its traceback
            raise
        error = path_error(exc)
        sys.stderr.write(f"error: {error}\n")
        return error.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
