"""INT8 calibration, shared by the TensorRT (pipeline.stages.int8) and the CPU (pipeline.stages.int8_cpu)
variants: ORT's pre-quantization pass, and activation ranges collected one batch at a time into ORT's
calibration cache (what :func:`pipeline.stages.int8.quantized_onnx_from_onnx` quantizes with).
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import require
from pipeline.core.onnx_files import copy_onnx, data_name, graph_proto, has_external_data
from pipeline.core.pausepoints import pause_point
from pipeline.core.progress import progress
from pipeline.data.tensors import ModelSignature
from pipeline.stages.calibration import CalibrationData

log = logging.getLogger(__name__)

# quantize_static cannot set histogram sizes and ORT's entropy default (128 bins, 128 quantized
# bins) leaves a single candidate threshold; use TensorRT's legacy entropy calibrator sizes.
HISTOGRAM_BINS = 2048
ENTROPY_QUANTIZED_BINS = 128


@dataclass(frozen=True)
class QuantRecipe:
    """What one INT8 variant asks of the shared calibrate-and-quantize flow (:func:`quantized_onnx_from_onnx`)."""

    label: str  # for log lines and progress: "INT8" (TensorRT's), "CPU INT8"
    symmetric: bool  # calibrate magnitudes (symmetric ranges) or low/high
    calibrated_op_types: tuple[str, ...]  # nodes whose tensors the calibrator records; () = every float tensor
    op_types_to_quantize: tuple[str, ...] | None  # None: every op type ORT's quantizer knows, less float_op_types
    activation_type: str  # onnxruntime.quantization.QuantType member name: "QInt8" or "QUInt8"
    extra_options: Mapping[str, object]
    finish: Callable[[Path, Path], None]  # (quantized model, calibration cache): rewrite it in place, check it
    float_op_types: tuple[str, ...] = ()
    # nodes of the prepared model that stay float whatever the caller keeps (e.g. the layers computing graph outputs)
    float_nodes: Callable[[Path], set[str]] = lambda _model: set()
    # 7: weights in [-64, 64] (ORT's reduce_range), so u8×s8 pair sums fit x86's saturating 16-bit lanes without VNNI
    weight_bits: int = 8

    def quantized_op_types(self) -> list[str]:
        """``op_types_to_quantize`` for ORT's ``quantize_static``."""
        if self.op_types_to_quantize is not None:
            return list(self.op_types_to_quantize)
        from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

        return sorted((set(QLinearOpsRegistry) | set(QDQRegistry)) - set(self.float_op_types))


def calibration_batch(signature: ModelSignature, requested: int, num_samples: int) -> tuple[int, bool]:
    """Batch size for calibration, and whether a short last batch must be dropped."""
    require(requested >= 1, f"batch size must be at least 1, got {requested}", "pass a positive batch size")
    fixed = {spec.shape[0] for spec in signature.inputs if spec.shape and isinstance(spec.shape[0], int) and spec.shape[0] > 0}
    if not fixed:
        return min(requested, num_samples), False
    require(len(fixed) == 1, f"the model's inputs have different fixed batch sizes {sorted(fixed)}", "export the model with one batch axis")
    size = fixed.pop()
    require(
        num_samples >= size,
        f"the model has a fixed batch of {size}, but there are only {num_samples} calibration samples",
        f"provide at least {size} samples",
    )
    return size, True


def prepared_model(src: Path, out: Path) -> Path:
    """ORT's pre-quantization pass (shape inference, basic graph optimizations such as folding
    BatchNorm into Conv, so the folded weights are what gets quantized); the original model if
    the pass cannot handle it."""
    from onnxruntime.quantization import quant_pre_process

    # ONNX shape inference only: ORT's symbolic pass runs only where sympy happens to be installed (moto's cfn-lint
    # brings it), so the prepared graph, and every quantized model, would depend on the environment; where it
    # cannot infer a graph it also writes sym_shape_infer_temp.onnx into the current directory.
    external = has_external_data(src)  # then the prepared model keeps its weights in <out>.data too
    try:
        with ort_prints_to_log(), temporaries_in(out.parent):
            quant_pre_process(str(src), str(out), skip_symbolic_shape=True, save_as_external_data=external, all_tensors_to_one_file=True,
                              external_data_location=data_name(out))
        return out
    except Exception as exc:  # noqa: BLE001 - shape inference gives up on some graphs; quantizing still works
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # a full disk fails the copy below too: say so, not that pre-processing gave up
        log.warning("ONNX Runtime pre-processing failed (%s); quantizing the model as exported", str(exc).splitlines()[0])
        copy_onnx(src, out)
        return out


@contextlib.contextmanager
def temporaries_in(folder: Path) -> Iterator[None]:
    """Python's temporary files (``tempfile.tempdir``, its documented default) in ``folder`` for the block: ONNX
    Runtime's pre-processing writes a whole copy of the model there, which belongs on the workspace's disk, not in a
    /tmp that may be small or held in memory."""
    before = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = before


def drop_unused_opsets(path: Path) -> None:
    """ORT's optimizer declares its private domains (com.microsoft, ...) whether used or not;
    keep only the domains the graph uses, so other runtimes see a plain ONNX model."""
    import onnx

    model = graph_proto(path)  # the weights stay in their data file: only the graph file changes
    used = {node.domain for node in model.graph.node} | {""}
    kept = [opset for opset in model.opset_import if opset.domain in used or opset.domain == "ai.onnx"]
    if len(kept) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(kept)
        onnx.save_model(model, str(path))


def ort_method(method: str):
    from onnxruntime.quantization import CalibrationMethod

    return {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[method]


def calibrate(
    model: Path,
    data: CalibrationData,
    recipe: QuantRecipe,
    method: str,
    percentile: float,
    batch_size: int,
    drop_last: bool,
    tmp: Path,
    cache: Path,
) -> None:
    """Collect activation ranges one batch at a time and save them as ORT's calibration cache."""
    from onnxruntime.quantization import save_tensors_data

    calibrator = _lean_calibrator(model, recipe, method, percentile, tmp / "augmented.onnx")
    total = data.num_batches(batch_size, drop_last=drop_last)
    started = time.perf_counter()
    with progress(f"{recipe.label} calibration ({method})", total, unit="batches") as bar:
        for index, feed in enumerate(bar.track(data.batches(batch_size, drop_last=drop_last))):
            # One batch per collect_data call: minmax reduces it to ranges and histogram methods add
            # it to their histograms before returning, so activations of one batch at most are held.
            with ort_prints_to_log():
                calibrator.collect_data(_OneBatch(feed))
            count = len(next(iter(feed.values())))
            log.debug("calibration batch %d/%d (%d samples, %.1f s)", index + 1, total, count, time.perf_counter() - started)
            pause_point("int8.calibration-batch")
    with ort_prints_to_log():
        ranges = calibrator.compute_data()
    save_tensors_data(ranges, cache)
    del calibrator  # drops the augmented session before its folder is deleted


def _lean_calibrator(model: Path, recipe: QuantRecipe, method: str, percentile: float, augmented: Path):
    """ORT's calibrator for ``method`` (as ``create_calibrator`` builds it), whose session does not
    plan a memory pattern: ORT would otherwise allocate the planned block on the second batch
    while the arena still holds the first batch's buffers, doubling peak memory (3.0 GB instead
    of 1.5 GB for ResNet50 at 13 samples per batch)."""
    from onnxruntime.quantization.calibrate import MinMaxCalibrater, PercentileCalibrater
    from onnxruntime.quantization.calibrate import EntropyCalibrater

    common = {"op_types_to_calibrate": list(recipe.calibrated_op_types), "augmented_model_path": str(augmented), "symmetric": recipe.symmetric,
              "use_external_data_format": has_external_data(model)}
    if method == "minmax":
        calibrator = _lean(MinMaxCalibrater)(str(model), **common)
    elif method == "entropy":
        calibrator = _lean(EntropyCalibrater)(str(model), **common, num_bins=HISTOGRAM_BINS, num_quantized_bins=ENTROPY_QUANTIZED_BINS)
    else:
        calibrator = _lean(PercentileCalibrater)(str(model), **common, num_bins=HISTOGRAM_BINS, percentile=percentile)
    calibrator.augment_graph()
    calibrator.create_inference_session()
    return calibrator


def _lean(base: type) -> type:
    """``base`` with a session that has graph optimizations (as ORT's calibrators) and memory patterns off."""

    class Lean(base):  # type: ignore[misc, valid-type]
        def create_inference_session(self) -> None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.enable_mem_pattern = False
            self.infer_session = ort.InferenceSession(self.augmented_model_path, sess_options=options, providers=self.execution_providers)

    Lean.__name__ = f"Lean{base.__name__}"
    return Lean


class _OneBatch:
    """A CalibrationDataReader (duck-typed: ORT only calls get_next) that yields one feed dict."""

    def __init__(self, feed: dict[str, np.ndarray]) -> None:
        self._feed: dict[str, np.ndarray] | None = feed

    def get_next(self) -> dict[str, np.ndarray] | None:
        feed, self._feed = self._feed, None
        return feed


@contextlib.contextmanager
def ort_prints_to_log():
    """ORT's calibrators print progress to stdout; route it to this module's debug log instead."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        for line in buffer.getvalue().splitlines():
            if line.strip():
                log.debug("onnxruntime: %s", line.strip())
