"""INT8 ONNX variant with explicit Q/DQ (QuantizeLinear/DequantizeLinear), calibrated on real data.

The graph is what TensorRT's explicit quantization wants: symmetric int8 everywhere (zero
point 0), weights stored as int8 initializers with a per-output-channel DequantizeLinear (a
quarter of the FP32 file), biases left in float, Q/DQ on the *inputs* of Conv/ConvTranspose/
Gemm/MatMul (ONNX Runtime's QDQ quantizer), then placed where TensorRT fuses
(:mod:`pipeline.stages.qdq_placement`: both inputs of residual Adds, AveragePool inputs, one
scale across Concat inputs). Graph outputs and the final Softmax stay float.

Calibration runs one batch at a time, batches sized to a memory budget
(:mod:`pipeline.backend.budget`): each batch's activations are reduced to ranges (minmax) or added to
per-tensor histograms (entropy, percentile) before the next batch is read. The ranges are handed
to ``quantize_static`` through its calibration cache file.
"""

from __future__ import annotations

import difflib
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.backend.budget import DEFAULT_MAX_MEMORY_GIB, batch_for_budget, memory_estimate
from pipeline.core.atomic import clear_leftovers
from pipeline.core.errors import PipelineError, require
from pipeline.core.onnx_files import has_external_data, move_onnx, remove_onnx, save_onnx
from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.calibration import CalibrationData
from pipeline.stages.gather_tables import DEFAULT_TABLE_MIN_MIB, tables_for_tensorrt, tables_quantized
from pipeline.stages.int8_calibrate import QuantRecipe, calibrate, calibration_batch, drop_unused_opsets, ort_method, ort_prints_to_log, prepared_model
from pipeline.stages.qdq_placement import CALIBRATED_OP_TYPES, place_qdq

log = logging.getLogger(__name__)

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
QUANTIZED_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
MAX_CALIBRATION_BATCH = 64  # beyond this a bigger batch is no faster on CPU
def _finish_for_tensorrt(path: Path, cache: Path) -> None:
    _place_for_tensorrt(path, cache)
    check_qdq_int8_symmetric(path)


TENSORRT_RECIPE = QuantRecipe(
    label="INT8",
    symmetric=True,
    calibrated_op_types=CALIBRATED_OP_TYPES,
    op_types_to_quantize=QUANTIZED_OP_TYPES,
    activation_type="QInt8",
    extra_options={
        "ActivationSymmetric": True,
        "WeightSymmetric": True,
        # TensorRT wants float biases; it folds them into the int8 layer itself.
        "QuantizeBias": False,
        # Q/DQ on layer inputs only: TensorRT fuses DQ→Conv/Gemm/MatMul and chooses the
        # output precision itself; quantized outputs would force extra reformatting.
        "OpTypesToExcludeOutputQuantization": list(QUANTIZED_OP_TYPES),
        # Weights stored as int8 initializers → DequantizeLinear (per channel, zero point 0):
        # a quarter of the FP32 file, and the dequantized values are exactly those of a
        # float weight → Q → DQ pair (ORT rounds half to even, as QuantizeLinear does).
        # TensorRT parses both forms.
        "AddQDQPairToWeight": False,
    },
    finish=_finish_for_tensorrt,
)


def qdq_onnx_from_onnx(
    src: Path,
    dst: Path,
    calibration: CalibrationData,
    *,
    method: str = "minmax",
    percentile: float = 99.999,
    batch_size: int | None = None,
    max_memory_gib: float = DEFAULT_MAX_MEMORY_GIB,
    keep_nodes: Sequence[str] = (),
    table_min_mib: float = DEFAULT_TABLE_MIN_MIB,
) -> Path:
    """Write an INT8 Q/DQ variant of the FP32 ONNX model ``src`` to ``dst`` and return ``dst``.

    ``method`` picks how activation ranges are calibrated: ``minmax`` (largest magnitude seen),
    ``entropy`` (threshold minimising KL divergence, as TensorRT's entropy calibrator) or
    ``percentile`` (``percentile`` of magnitudes, clipping outliers). Calibration batches are
    sized so the estimated memory (weights plus every activation of a batch, see
    :mod:`pipeline.backend.budget`) stays within ``max_memory_gib``, at most
    :data:`MAX_CALIBRATION_BATCH`; ``batch_size`` overrides that, and a model with a fixed batch
    dim uses its own. ``keep_nodes`` (names of weighted nodes of ``src``; items may be
    comma-separated) stay float: no Q/DQ on their inputs. The result is checked with
    ``onnx.checker`` and :func:`check_qdq_int8_symmetric`. Gather tables of at least ``table_min_mib`` are
    quantized weights-only, per row (:mod:`pipeline.stages.gather_tables`).
    """
    return quantized_onnx_from_onnx(src, dst, calibration, TENSORRT_RECIPE, method=method, percentile=percentile,
                                    batch_size=batch_size, max_memory_gib=max_memory_gib, keep_nodes=keep_nodes, table_min_mib=table_min_mib)


def quantized_onnx_from_onnx(
    src: Path,
    dst: Path,
    calibration: CalibrationData,
    recipe: QuantRecipe,
    *,
    method: str,
    percentile: float,
    batch_size: int | None,
    max_memory_gib: float,
    keep_nodes: Sequence[str],
    table_min_mib: float = DEFAULT_TABLE_MIN_MIB,
) -> Path:
    """Calibrate ``src`` on ``calibration`` and quantize it with ORT's QDQ quantizer as ``recipe`` says;
    write ``dst`` atomically (the arguments are those of :func:`qdq_onnx_from_onnx`)."""
    dst = Path(dst)
    with Calibrated(src, dst, calibration, recipe, method=method, percentile=percentile, batch_size=batch_size,
                    max_memory_gib=max_memory_gib, table_min_mib=table_min_mib) as calibrated:
        kept = calibrated.checked_keep_nodes(keep_nodes)
        move_onnx(calibrated.quantize(kept), dst)
    log_kept(recipe.label, kept)
    log.info("wrote %s model %s (%s calibration, %d samples)", recipe.label, dst, method, calibration.num_samples)
    return dst


def log_kept(label: str, kept: set[str]) -> None:
    if kept:  # what runs in float matters for speed: say it where the user sees it
        log.warning("%s: %d layer(s) kept in float (%s): %s", label, len(kept), KEEP_NODES_FLAG, ", ".join(sorted(kept)))


class Calibrated:
    """A model calibrated once, quantized as often as asked with different nodes kept float (the accuracy-aware
    fallback tries several): ORT's prepared model and the calibration cache live in a temporary folder beside ``dst``
    until the ``with`` block ends. Large Gather tables are quantized (weights only, per row) in the prepared model, before
    calibration: the calibrated model is then a quarter of their size."""

    def __init__(self, src: Path, dst: Path, calibration: CalibrationData, recipe: QuantRecipe, *, method: str, percentile: float,
                 batch_size: int | None, max_memory_gib: float, table_min_mib: float = DEFAULT_TABLE_MIN_MIB) -> None:
        import onnx

        self.src, self.dst, self.calibration, self.recipe = Path(src), Path(dst), calibration, recipe
        self.table_min_bytes = int(table_min_mib * 2**20)
        self.method, self.percentile, self.batch_size, self.max_memory_gib = method, percentile, batch_size, max_memory_gib
        require(self.src.is_file(), f"ONNX model '{src}' does not exist", "run the ONNX export stage first")
        require(
            method in CALIBRATION_METHODS,
            f"unknown calibration method '{method}'",
            f"use one of: {', '.join(CALIBRATION_METHODS)}",
        )
        require(0.0 < percentile <= 100.0, f"percentile must be in (0, 100], got {percentile}", "use e.g. 99.99 or 99.999")
        graph = onnx.load(str(src), load_external_data=False).graph
        layers = {node.op_type for node in graph.node}
        require(
            bool(layers & set(QUANTIZED_OP_TYPES)),
            f"'{src}' has no {'/'.join(QUANTIZED_OP_TYPES)} layers, so an INT8 variant would change nothing",
            "skip --int8 for this model",
        )
        self.signature = signature_from_onnx(self.src)
        expected = tuple(spec.name for spec in self.signature.inputs)
        require(
            set(calibration.input_names) == set(expected),
            f"the calibration data has inputs {list(calibration.input_names)}, the model '{src}' has {list(expected)}",
            "load the calibration data with this model's signature",
        )
        require(batch_size is None or batch_size >= 1, f"batch size must be at least 1, got {batch_size}", "pass a positive batch size")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._count = 0

    def __enter__(self) -> Calibrated:
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        clear_leftovers(self.dst)
        self._tmp = tempfile.TemporaryDirectory(prefix=f".{self.dst.name}.", dir=self.dst.parent)
        self.tmp = Path(self._tmp.name)
        try:
            # The tables first: ONNX Runtime's pre-processing, and each copy after it, then handle a quarter of their bytes.
            tabled = self.tmp / "tables.onnx"
            self.table_nodes = set(tables_quantized(self.src, tabled, self.table_min_bytes))
            self.prepared = prepared_model(tabled if self.table_nodes else self.src, self.tmp / "prepared.onnx")
            remove_onnx(tabled)
            self.cache = self.tmp / "calibration.json"
            self._calibrate()
        except BaseException:
            self._tmp.cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def _calibrate(self) -> None:
        batch_size = self.batch_size
        if batch_size is None:
            estimate = memory_estimate(self.prepared, self.calibration.largest_shapes())
            batch_size = batch_for_budget(estimate, self.max_memory_gib, max_batch=MAX_CALIBRATION_BATCH)
            log.info("calibration batches of %d samples for a %g GiB budget (%s)", batch_size, self.max_memory_gib, estimate.describe())
        batch, drop_last = calibration_batch(self.signature, batch_size, self.calibration.num_samples)
        started = time.perf_counter()
        calibrate(self.prepared, self.calibration, self.recipe, self.method, self.percentile, batch, drop_last, self.tmp, self.cache)
        log.info("%s: calibrated %s ranges in %.1f s", self.recipe.label, self.method, time.perf_counter() - started)

    def checked_keep_nodes(self, names: Sequence[str]) -> set[str]:
        """``names`` (``--int8-keep-nodes``) checked against the model (see :func:`_checked_keep_nodes`)."""
        return _checked_keep_nodes(self.prepared, names, self.src)

    def quantize(self, kept: set[str]) -> Path:
        """The model quantized with ``kept`` (names of the prepared model's nodes) left float: a checked file in the
        temporary folder (moved away by the caller, or deleted with the folder)."""
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        self._count += 1
        out = self.tmp / f"quantized-{self._count}.onnx"
        with ort_prints_to_log():
            quantize_static(
                str(self.prepared),
                str(out),
                None,  # ranges come from the calibration cache
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=self.recipe.quantized_op_types(),
                nodes_to_exclude=sorted(kept | self.table_nodes | self.recipe.float_nodes(self.prepared)),
                per_channel=True,
                reduce_range=self.recipe.weight_bits == 7,
                activation_type=QuantType[self.recipe.activation_type],
                weight_type=QuantType.QInt8,
                calibrate_method=ort_method(self.method),
                calibration_cache_path=str(self.cache),
                extra_options=dict(self.recipe.extra_options),
                use_external_data_format=has_external_data(self.prepared),
            )
        import onnx

        require(any(n.op_type == "QuantizeLinear" for n in onnx.load(str(out), load_external_data=False).graph.node),
                f"the {self.recipe.label} recipe finds nothing to quantize in '{self.src}' (what it would quantize computes a graph "
                "output or is kept float)", "leave this variant out" + (" (--no-int8-cpu)" if self.recipe.activation_type == "QUInt8" else ""))
        self.recipe.finish(out, self.cache)
        _checked_by_onnx(out, self.src)
        drop_unused_opsets(out)
        return out


def _checked_by_onnx(path: Path, src: Path) -> None:
    """``onnx.checker`` (full check) on a quantized model: one error line when it fails."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise PipelineError(
            f"the INT8 model made from '{src}' is invalid: {str(exc).splitlines()[0]}",
            "report this model; skip --int8 for it meanwhile",
        ) from None


KEEP_NODES_FLAG = "--int8-keep-nodes"
_PASS_THROUGH = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity")


def output_layers(model_path: Path) -> set[str]:
    """Names of the nodes that compute graph outputs: each output's producer and, through reshaping ops,
    the layer before it. Quantizing their outputs would round a regression head or an embedding to 8 bits."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    producers = {out: node for node in graph.node for out in node.output}
    found: set[str] = set()
    for output in graph.output:
        node = producers.get(output.name)
        while node is not None and node.name not in found:
            found.add(node.name)
            node = producers.get(node.input[0]) if node.op_type in _PASS_THROUGH and node.input else None
    return found


def _checked_keep_nodes(prepared: Path, names: Sequence[str], src: Path) -> set[str]:
    """The weighted nodes to keep float, named as in ``src`` or in ONNX Runtime's pre-processed
    model (which fuses a MatMul and its bias Add into a Gemm, and BatchNorm into Conv); an unknown
    name, or one that is not a weighted layer, is one error line."""
    import onnx

    wanted = [n.strip() for item in names for n in item.split(",") if n.strip()]
    if not wanted:
        return set()
    op_types = {node.name: node.op_type for node in onnx.load(str(prepared), load_external_data=False).graph.node}
    weighted = sorted(name for name, op in op_types.items() if op in QUANTIZED_OP_TYPES)
    original = {node.name: node.op_type for node in onnx.load(str(src), load_external_data=False).graph.node}
    for name in wanted:
        if name not in op_types:
            close = difflib.get_close_matches(name, weighted, n=1)
            fused = " (ONNX Runtime's pre-quantization pass fuses it into another node: a failed INT8 gate lists the fused names)" if name in original else ""
            raise PipelineError(
                f"{KEEP_NODES_FLAG} names node '{name}'" + (f" (did you mean '{close[0]}'?)" if close else "") + f" that '{src}' does not have{fused}",
                f"pass names of {'/'.join(QUANTIZED_OP_TYPES)} nodes (a failed INT8 gate lists the ones that add the most error)",
            )
        require(
            op_types[name] in QUANTIZED_OP_TYPES,
            f"{KEEP_NODES_FLAG} names '{name}', a {op_types[name]}: only {'/'.join(QUANTIZED_OP_TYPES)} layers are quantized",
            "name the weighted layer that consumes it instead",
        )
    return set(wanted)


def _place_for_tensorrt(path: Path, cache: Path) -> None:
    """Residual Adds, pooling and Concat inputs quantized as TensorRT fuses them (see qdq_placement); Gather tables in
    the form TensorRT takes (see gather_tables)."""
    import onnx
    from onnxruntime.quantization.calibrate import load_tensors_data

    ranges = {name: data.range_value for name, data in load_tensors_data(cache).items()}
    external = has_external_data(path)
    model = onnx.load(str(path))
    place_qdq(model, ranges)
    tables_for_tensorrt(model)
    save_onnx(model, path, external=external)


def check_qdq_int8_symmetric(path: Path) -> None:
    """Raise PipelineError unless the model has Q/DQ nodes and every one is int8 with zero point 0
    and positive finite scales (what TensorRT's explicit quantization accepts)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    path = Path(path)
    require(path.is_file(), f"ONNX model '{path}' does not exist")
    model = onnx.load(str(path))
    graph = model.graph
    consts = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producers = {out: node for node in graph.node for out in node.output}
    qdq = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    require(
        bool(qdq),
        f"'{path}' has no QuantizeLinear/DequantizeLinear nodes, so it is not an INT8 Q/DQ model",
        "quantize it with --int8 (qdq_onnx_from_onnx)",
    )

    problems: list[str] = []
    for node in qdq:
        label = f"{node.op_type} '{node.name or node.output[0]}'"
        scale = consts.get(node.input[1])
        if scale is None:
            problems.append(f"{label}: scale is not a constant")
        elif not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
            problems.append(f"{label}: scale is not positive and finite")
        zp_name = node.input[2] if len(node.input) > 2 else ""
        if zp_name:
            zp = consts.get(zp_name)
            if zp is None:
                problems.append(f"{label}: zero point is not a constant")
            elif zp.dtype != np.int8:
                problems.append(f"{label}: zero point is {zp.dtype}, not int8")
            elif np.any(zp != 0):
                problems.append(f"{label}: zero point is not 0 ({np.unique(zp)[:4].tolist()})")
        elif node.op_type == "QuantizeLinear":
            out_type = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
            if out_type != TensorProto.INT8:
                problems.append(f"{label}: no zero point, so it quantizes to uint8")
        else:  # DequantizeLinear without zero point: int8 only if its input is
            source = node.input[0]
            if source in consts and consts[source].dtype != np.int8:
                problems.append(f"{label}: input is {consts[source].dtype}, not int8")
            elif source not in consts and getattr(producers.get(source), "op_type", "") != "QuantizeLinear":
                problems.append(f"{label}: input type is unknown")
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise PipelineError(
            f"'{path}' is not symmetric int8 Q/DQ: {shown}",
            "quantize the FP32 model again with qdq_onnx_from_onnx (symmetric int8, zero point 0)",
        )
    log.debug("%s: %d Q/DQ nodes, all int8 with zero point 0", path, len(qdq))
