"""Which data a build is evaluated on (parity and accuracy gates), and what is left to calibrate INT8 on.

Labeled evaluation data when there is some; else calibration samples as an unlabeled comparison
set (held out of calibration when INT8 is built, so no variant is judged on what it was calibrated
on); else seeded synthetic samples.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.accuracy.evaldata import EvalBucket, EvalData, eval_data_from_path, synthetic_eval_data
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import ModelSignature
from pipeline.stages.calibration import MIN_SAMPLES, CalibrationData, calibration_from_path

log = logging.getLogger(__name__)

SYNTHETIC_SAMPLES = 128
HOLDOUT_MIN = 300  # unlabeled held-out samples wanted: ≥ 268 (bounds.min_samples(1.0, 0.95)) lets a perfect result pass a 1-point limit


def eval_data_for(given: Path | None, calibration: Path, default: Path, signature: ModelSignature, calib: CalibrationData | None, *,
                  preprocess: str = "unit") -> tuple[EvalData, CalibrationData | None]:
    """The evaluation data of a build, and the calibration data left for INT8 (``calib``: what INT8
    would calibrate on, None without INT8).

    ``given`` (``--eval-data``), else ``default`` (``<calibration-root>/<name>/eval.npz``); without
    either, the calibration data (``calibration``, read with ``preprocess``) becomes an unlabeled
    comparison set: all of it without INT8, else a held-out part that INT8 does not calibrate on
    (half, at least HOLDOUT_MIN, leaving at least MIN_SAMPLES to calibrate on); seeded synthetic
    samples only when there is no data at all.
    """
    path = given or default
    if path.exists():
        return eval_data_from_path(path, signature), calib
    if given is not None:
        raise PipelineError(f"evaluation data '{path}' does not exist", "pass an .npz with one array per input (and labels) to --eval-data")
    if calib is None and calibration.exists():
        try:
            calib = calibration_from_path(calibration, signature, preprocess=preprocess, min_samples=1)
        except PipelineError:
            calib = None
        if calib is not None:
            held = _unlabeled(calib.holdout(calib.num_samples)[1], f"{calib.origin} (calibration data, unlabeled)", calib.fingerprint())
            log.warning("no labeled evaluation data (%s): parity and accuracy gates compare with FP32 on all %d calibration samples, "
                        "unlabeled", path, calib.num_samples)
            return held, None
    if calib is not None:
        holdout = min(calib.num_samples - MIN_SAMPLES, max(calib.num_samples // 2, HOLDOUT_MIN))
        if holdout > 0:
            rest, samples = calib.holdout(holdout)
            held = _unlabeled(samples, f"{calib.origin}: {holdout} of {calib.num_samples} samples held out of calibration, unlabeled",
                              f"{calib.fingerprint()}:holdout{holdout}")
            log.warning("no labeled evaluation data (%s): %d of %d calibration samples are held out (not calibrated on) as the unlabeled "
                        "comparison set; gates judge top-1 agreement with FP32", path, holdout, calib.num_samples)
            return held, rest
    data = synthetic_eval_data(signature, samples=SYNTHETIC_SAMPLES)
    log.warning("no evaluation or calibration data (%s): parity and gates run on %d synthetic samples (%s); give --eval-data for real numbers",
                path, SYNTHETIC_SAMPLES, data.source)
    return data, calib


def _unlabeled(samples: list[tuple[str, dict]], source: str, fingerprint: str) -> EvalData:
    return EvalData(tuple(EvalBucket(label, arrays) for label, arrays in samples), source, fingerprint)
