"""Where the commands write their reports: under the workdir the user gave, or the folder they named.

* ``--workdir W`` (default ``build``): the builds, ``W/verify.json``, the server logs ``W/triton/``, and
  the reports folder ``W/reports/`` holding ``index.html`` (the HTML page of everything under ``W``) and
  one folder per run (``<timestamp>/`` for a load test, ``tune-<timestamp>/`` for a tune run).
* ``--report-dir X`` on every command that writes a report: *this* run's report goes to ``X``, the
  page ``X/index.html`` included (it shows this run and the builds of the workdir).

So a command never writes into the current directory unless the workdir or the report folder is there.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from pathlib import Path

REPORTS = "reports"
# (workdir, page folder) → the refreshed page (None: nothing to show). The command line (pipeline.cli) passes
# pipeline.reports.html's to verify, loadtest and tune when it registers them; registered without it, they write no page.
PageRefresher = Callable[[Path, Path], "Path | None"]
REPORT_DIR_HELP = "this run's reports and the HTML page index.html (default: <workdir>/reports/{run}, the page in <workdir>/reports)"


def reports_root(workdir: Path) -> Path:
    """The reports folder of ``workdir``: its ``index.html`` and the run folders."""
    return Path(workdir) / REPORTS


def run_report_dirs(report_dir: Path | None, workdir: Path, prefix: str = "") -> tuple[Path, Path]:
    """(this run's folder, the folder of the page): both ``report_dir`` when given, else
    ``<workdir>/reports/<prefix><timestamp>`` and ``<workdir>/reports``."""
    if report_dir is not None:
        return Path(report_dir), Path(report_dir)
    root = reports_root(workdir)
    return root / f"{prefix}{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}", root


def page_dir(report_dir: Path | None, workdir: Path) -> Path:
    """The folder of the page of a command that writes no run folder (build, verify)."""
    return Path(report_dir) if report_dir is not None else reports_root(workdir)
