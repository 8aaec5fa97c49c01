"""`python -m pipeline verify`: evaluation accuracy through Triton, beside the in-process numbers."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.accuracy.gates import Gates, accuracy_target_option, confidence_option, fp16_max_drop_option, int8_max_drop_option
from pipeline.core.console import console
from pipeline.core.objectstore import S3Url
from pipeline.core.options import (
    add_options,
    calibration_root_option,
    checked_config,
    eval_data_option,
    in_range,
    non_negative,
    option,
    repository_option,
)
from pipeline.core.tables import to_rich
from pipeline.reports.build_tables import served_data
from pipeline.reports.dirs import PageRefresher, page_dir
from pipeline.triton.served_gate import SERVED_ATOL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyConfig:
    """Every ``verify`` option."""

    repository: Path | S3Url = repository_option()
    url: str | None = option(None, "HTTP endpoint of a running Triton (host:port); default: start the embedded server", metavar="HOST:PORT")
    models: tuple[str, ...] = option((), "only these Triton models (repeatable; default: every pipeline variant)", flag="--model", metavar="NAME")
    eval_data: Path | None = eval_data_option()
    data: Path | None = option(None, "raw inputs for the raw-input ensembles (build --raw-inputs): a folder of JPEG/PNG files (one "
                                     "sub-folder per class for labels) or a CSV of sentences (text,label), judged as the build's raw-input "
                                     "gate and answered with class names", metavar="FOLDER|CSV")
    calibration_root: Path = calibration_root_option()
    batch_size: int = option(32, "samples per request", check=in_range(1, 1 << 20), fix="pass a positive batch size")
    atol: float = option(SERVED_ATOL, "max abs difference served vs in-process (FP16 variants: the looser of this and the build's "
                               "--fp16-atol: FP16 served on a GPU differs from it run on this CPU at FP16's precision)", check=non_negative)
    fp16_max_drop: float = fp16_max_drop_option()
    int8_max_drop: float = int8_max_drop_option()
    gate_confidence: float = confidence_option()
    accuracy_target: float | None = accuracy_target_option()
    workdir: Path = option(Path("build"), "where the JSON report and the reports folder go", metavar="DIR")
    report: Path | None = option(None, "JSON report (default: <workdir>/verify.json, which the HTML page shows)")
    report_dir: Path | None = option(None, "where the HTML page index.html goes (default: <workdir>/reports)", metavar="DIR")

    def gates(self) -> Gates:
        """The build's gate type with this command's limits."""
        return Gates(fp16_max_drop=self.fp16_max_drop, int8_max_drop=self.int8_max_drop, gate_confidence=self.gate_confidence)


def register(subparsers: argparse._SubParsersAction, refresh_page: PageRefresher | None = None) -> None:
    """Add the ``verify`` command; ``refresh_page`` updates the HTML page after it (None: no page)."""
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
        "  python -m pipeline verify --url 127.0.0.1:8000 --model digits_int8 --eval-data data/eval.npz\n"
        "  python -m pipeline verify --data photos/           # raw files through the raw-input ensembles",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, VerifyConfig)
    p.set_defaults(handler=run, refresh_page=refresh_page)


def run(args: argparse.Namespace) -> int:
    """Verify every served variant; raise PipelineError naming the failures."""
    from pipeline.data.artifacts import parse_variant
    from pipeline.triton.verify import verify_repository

    cfg = checked_config(VerifyConfig, args)
    if cfg.data is not None:
        return _run_raw(cfg, args)
    given = {}
    if cfg.eval_data is not None:
        from pipeline.core.errors import require

        require(cfg.eval_data.is_file(), f"evaluation data '{cfg.eval_data}' does not exist", "pass an .npz with one array per input (and labels)")
        from pipeline.triton.repository import read_repository
        from pipeline.triton.s3repository import readable

        with readable(cfg.repository, model_files=False) as local:
            bases = {(parse_variant(m) or (m, ""))[0] for m in (cfg.models or read_repository(local))}
        given = {base: cfg.eval_data for base in bases}
    verify_repository(
        cfg.repository,
        url=cfg.url,
        models=cfg.models,
        calibration_root=cfg.calibration_root,
        eval_data=given,
        batch_size=cfg.batch_size,
        atol=cfg.atol,
        gates=cfg.gates(),
        report_path=cfg.report or cfg.workdir / "verify.json",
        workdir=cfg.workdir,
        show=lambda rows: console().print(to_rich(served_data(rows))),
        accuracy_target=cfg.accuracy_target,
    )
    page = args.refresh_page(cfg.workdir, page_dir(cfg.report_dir, cfg.workdir)) if args.refresh_page else None
    if page:
        console().print(f"report: {page}")
    return 0


def _run_raw(cfg: VerifyConfig, args: argparse.Namespace) -> int:
    """``verify --data FOLDER``: the raw files through every raw-input ensemble; CheckFailed naming the first failure."""
    import json

    from pipeline.core.atomic import write_text_atomic
    from pipeline.core.errors import CheckFailed
    from pipeline.reports.build_tables import raw_answers_data
    from pipeline.triton.raw_gate import verify_raw

    assert cfg.data is not None
    from pipeline.core.errors import require
    from pipeline.data.raw_files import is_image_folder, is_text_file

    require(is_image_folder(cfg.data) or is_text_file(cfg.data), f"--data {cfg.data} is neither a folder of JPEG/PNG files nor a "
            ".csv/.txt file of sentences", "pass a folder of images (one sub-folder per class) or a CSV with a text,label header")
    reports = verify_raw(cfg.repository, cfg.data, url=cfg.url, workdir=cfg.workdir, gates=cfg.gates(), models=cfg.models)
    for report in reports:
        for table in raw_answers_data(report):
            console().print(to_rich(table))
    path = cfg.report or cfg.workdir / "verify_raw.json"
    write_text_atomic(path, json.dumps(reports, indent=2, default=str) + "\n")
    console().print(f"report: {path}")
    failed = [r for r in reports if r["failures"]]
    if failed:
        raise CheckFailed(f"raw files through '{failed[0]['model']}': {failed[0]['failures'][0]}",
                          "check the preprocessing against training; the build's --raw-inputs gate says the same on its data")
    return 0
