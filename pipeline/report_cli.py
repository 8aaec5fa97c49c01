"""`python -m pipeline report`: one self-contained HTML page of builds, load tests and tune runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` command."""
    p = subparsers.add_parser(
        "report",
        help="write one self-contained HTML page (index.html) of the builds, the newest load test and tune run",
        description=(
            "Gathers every build under --workdir (stages and times, parity, accuracy gates, served verification), "
            "the newest load test under --reports (points, Triton metrics, plots) and the newest tune run "
            "(tune.json, trials.csv, plots) into one index.html. Images are embedded and styles inline: the page "
            "makes no network request. `build` and `loadtest` refresh it and print its path."
        ),
        epilog="example:\n  python -m pipeline report                     # build/ and reports/ → reports/index.html\n"
        "  python -m pipeline report --workdir out/build --reports out/reports --output /tmp/report.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workdir", type=Path, default=Path("build"), help="build workdir with <name>/manifest.json (default: %(default)s)")
    p.add_argument("--reports", type=Path, default=Path("reports"),
                   help="load-test (<timestamp>/results.json) and tune (tune-<timestamp>/tune.json) reports (default: %(default)s)")
    p.add_argument("--output", type=Path, help="the page to write (default: <reports>/index.html)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the page and print its path."""
    from pipeline.console import console
    from pipeline.htmlreport import write_html_report

    path = write_html_report(args.workdir, args.reports, args.output)
    console().print(f"report: {path}")
    return 0
