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
            "Gathers every build under --workdir (each variant's accuracy, model size and latency with a chart, the Triton models "
            "published, stages and times, parity, accuracy gates, served verification, "
            "and <workdir>/verify.json), the newest load test under --report-dir (points, Triton metrics, plots) and the newest tune run "
            "(tune.json, trials.csv, plots) into one index.html. Images are embedded and styles inline: the page "
            "makes no network request. `build`, `loadtest` and `tune` refresh it and print its path."
        ),
        epilog="example:\n  python -m pipeline report                     # build/ and build/reports/ → build/reports/index.html\n"
        "  python -m pipeline report --workdir out/build --report-dir out/reports --output /tmp/report.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workdir", type=Path, default=Path("build"),
                   help="build workdir with <name>/manifest.json and verify.json (default: %(default)s)")
    p.add_argument("--report-dir", "--reports", dest="reports", type=Path,
                   help="the reports folder: load tests (<timestamp>/results.json), tune runs (tune-<timestamp>/tune.json), "
                        "or one run's folder (default: <workdir>/reports)")
    p.add_argument("--output", type=Path, help="the page to write (default: <report-dir>/index.html)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the page and print its path."""
    from pipeline.core.console import console
    from pipeline.reports.html import write_html_report

    from pipeline.reports.dirs import page_dir

    path = write_html_report(args.workdir, page_dir(args.reports, args.workdir), args.output)
    console().print(f"report: {path}")
    return 0
