"""Memory budgets: how many samples a batch may hold so that running a model stays within a limit.

The estimate comes from the ONNX graph alone (no inference): ONNX shape inference is run with
the batch set to 1 and to 2, every float/int activation (node output) is sized, and the
difference is what one more sample costs. Summing *every* activation is deliberately
conservative: ONNX Runtime frees a tensor after its last consumer, but calibration methods that
histogram activations (entropy, percentile) hold all of them for a batch, and the arena keeps its
high-water mark. Activations whose size shape inference cannot tell (data-dependent shapes) are
counted at the median size of the known ones.

``batch_for_budget`` turns that into a batch size::

    batch = (budget - BASE_BYTES - WEIGHT_COPIES × weights - fixed activations) / per-sample bytes

clamped to ``[1, max_batch]``. ``BASE_BYTES`` is the interpreter, NumPy and ONNX Runtime
(measured at about 300 MiB resident, rounded up); weights are counted twice (the ONNX model
proto and the session's copy).

A model whose weights alone overflow the budget cannot keep it, whatever the batch: the build says
so once, before its stages run (:func:`memory_need`), and batches are then sized to
:data:`ACTIVATION_ALLOWANCE` beyond the weights — the build's measured rule is that each stage
peaks at most ``3 × weights + 1.5 GiB``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError, require

log = logging.getLogger(__name__)

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_MAX_MEMORY_GIB = 2.0
BASE_BYTES = 512 * MIB
WEIGHT_COPIES = 2
STAGE_WEIGHT_COPIES, STAGE_SLACK = 3, 1536 * MIB  # a stage's peak: at most 3 × the FP32 weights + 1.5 GiB (scripts/bench_build.py)
ACTIVATION_ALLOWANCE = 512 * MIB  # per batch, where the weights leave no room in the budget


def memory_need(weight_bytes: int, max_memory_gib: float) -> str | None:
    """One line saying that ``weight_bytes`` of weights cannot keep the ``--max-memory-gib`` budget and what a
    stage will take instead (3 × weights + 1.5 GiB); None when they fit."""
    need = STAGE_WEIGHT_COPIES * weight_bytes + STAGE_SLACK
    if need <= max_memory_gib * GIB:
        return None
    return (f"the model's {weight_bytes / MIB:,.0f} MiB of weights cannot keep --max-memory-gib {max_memory_gib:g}: stages will peak at up "
            f"to {need / GIB:.1f} GiB (3 × weights + 1.5 GiB), batches sized to {ACTIVATION_ALLOWANCE // MIB} MiB of activations beyond "
            f"the weights; give the machine that much (and --max-memory-gib {need / GIB:.1f} to say so)")


@dataclass(frozen=True)
class MemoryEstimate:
    """What running a model costs: weights, activations independent of the batch, and per sample."""

    weight_bytes: int
    fixed_activation_bytes: int
    bytes_per_sample: int
    unknown_tensors: int  # activations whose size shape inference could not tell (counted at the median)

    def describe(self) -> str:
        unknown = f", {self.unknown_tensors} activation(s) of unknown size estimated" if self.unknown_tensors else ""
        return f"weights {self.weight_bytes / MIB:.0f} MiB, activations {self.bytes_per_sample / MIB:.1f} MiB per sample{unknown}"


def memory_estimate(model: Path, per_sample_shapes: Mapping[str, tuple[int, ...]] | None = None) -> MemoryEstimate:
    """Estimate the memory of running the ONNX model at ``model``.

    ``per_sample_shapes`` gives, for inputs with dynamic non-batch axes, the per-sample shape (no
    batch axis) to size them with, e.g. ``{"tokens": (128,)}``; such axes not given count as 1,
    which underestimates, so callers pass the largest size they will feed.
    """
    from pipeline.data.tensors import load_onnx

    proto = load_onnx(Path(model), external_data=False)
    weights = sum(_tensor_bytes(init) for init in proto.graph.initializer)
    weights += _external_bytes(proto, Path(model).parent)
    one, unknown_one = _activation_bytes(proto, 1, per_sample_shapes or {})
    two, unknown_two = _activation_bytes(proto, 2, per_sample_shapes or {})
    per_sample = max(two - one, 0)
    fixed = max(one - per_sample, 0)
    estimate = MemoryEstimate(weights, fixed, per_sample, max(unknown_one, unknown_two))
    log.debug("memory estimate for %s: %s", model, estimate.describe())
    return estimate


def batch_for_budget(estimate: MemoryEstimate, max_memory_gib: float, *, max_batch: int | None = None, runners: int = 1) -> int:
    """The largest batch whose estimated memory stays within ``max_memory_gib`` (at least 1, at
    most ``max_batch``) when ``runners`` models of this size each hold a batch in one process (the
    process itself is paid once). A model that does not fit even at batch 1 gets 1 and a warning."""
    require(
        max_memory_gib == max_memory_gib and max_memory_gib > 0,  # rejects NaN too
        f"the memory budget must be a positive number of GiB, got {max_memory_gib}",
        f"pass e.g. --max-memory-gib {DEFAULT_MAX_MEMORY_GIB:g}",
    )
    require(max_batch is None or max_batch >= 1, f"max_batch must be at least 1, got {max_batch}")
    budget = int(max_memory_gib * GIB)
    require(runners >= 1, f"runners must be at least 1, got {runners}")
    room = budget - BASE_BYTES - runners * (WEIGHT_COPIES * estimate.weight_bytes + estimate.fixed_activation_bytes)
    per_sample = max(runners * estimate.bytes_per_sample, 1)
    batch = room // per_sample if room > 0 else 0
    if batch < 1 and BASE_BYTES + runners * WEIGHT_COPIES * estimate.weight_bytes > budget:
        # the weights alone overflow it (said once, before the build's stages: memory_need): batches get an allowance beyond them
        batch = max(1, ACTIVATION_ALLOWANCE // per_sample)
        log.info("weights %s MiB × %d models overflow --max-memory-gib %g: batches of %d (%d MiB of activations)",
                 f"{estimate.weight_bytes / MIB:,.0f}", runners, max_memory_gib, batch, ACTIVATION_ALLOWANCE // MIB)
    elif batch < 1:
        log.warning(
            "the model needs more than --max-memory-gib %g even one sample at a time (%s%s); running one sample per batch",
            max_memory_gib,
            estimate.describe(),
            f", {runners} models at once" if runners > 1 else "",
        )
        batch = 1
    return int(min(batch, max_batch)) if max_batch is not None else int(batch)


def _tensor_bytes(tensor) -> int:
    import numpy as np

    if tensor.data_location == tensor.EXTERNAL:
        return 0  # counted from the external files
    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    return count * _itemsize(tensor.data_type)


def _itemsize(elem_type: int) -> int:
    import numpy as np
    from onnx import helper

    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return 4


def _external_bytes(proto, folder: Path) -> int:
    locations = {
        entry.value
        for init in proto.graph.initializer
        if init.data_location == init.EXTERNAL
        for entry in init.external_data
        if entry.key == "location"
    }
    return sum((folder / loc).stat().st_size for loc in locations if (folder / loc).is_file())


def _activation_bytes(proto, batch: int, per_sample: Mapping[str, tuple[int, ...]]) -> tuple[int, int]:
    """Sum of node-output sizes (top-level graph) with every input's batch axis set to ``batch``;
    and how many outputs had to be estimated."""
    import statistics

    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    del model.graph.initializer[:]  # shapes do not need weight values; keep the copy small
    model.graph.initializer.extend(_shape_only_initializers(proto))
    initializers = {i.name for i in proto.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        given = per_sample.get(value.name)
        if given is not None and len(given) != len(dims) - 1:
            raise PipelineError(
                f"the per-sample shape {tuple(given)} for input '{value.name}' has {len(given)} dims, the model input has {len(dims) - 1} besides the batch",
                "give the shape of one sample, without the batch axis",
            )
        named = [axis for axis, dim in enumerate(dims) if dim.dim_param == "batch"]
        batch_axis = named[0] if named else 0
        rest = iter(given) if given is not None else None
        for axis, dim in enumerate(dims):
            fixed = dim.HasField("dim_value") and dim.dim_value > 0
            if axis == batch_axis:
                if not fixed:
                    dim.dim_value = batch
                continue
            size = next(rest) if rest is not None else None
            if size is not None:
                dim.dim_value = int(size)
            elif not fixed:
                dim.dim_value = 1
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; an estimate must not fail the build
        log.debug("shape inference failed for the memory estimate (%s); sizing from the inputs only", exc)
        inferred = model
    sizes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        ttype = value.type.tensor_type
        if ttype.shape.dim and all(d.HasField("dim_value") for d in ttype.shape.dim):
            count = 1
            for d in ttype.shape.dim:
                count *= max(int(d.dim_value), 0)
            sizes[value.name] = count * _itemsize(ttype.elem_type)
    outputs = [o for node in inferred.graph.node for o in node.output if o]
    known = [sizes[o] for o in outputs if o in sizes]
    unknown = [o for o in outputs if o not in sizes]
    fill = int(statistics.median(known)) if known else 0
    inputs = 0
    for value in inferred.graph.input:
        if value.name not in initializers:
            count = 1
            for d in value.type.tensor_type.shape.dim:
                count *= max(int(d.dim_value), 1)
            inputs += count * _itemsize(value.type.tensor_type.elem_type)
    return sum(known) + fill * len(unknown) + inputs, len(unknown)


def _shape_only_initializers(proto) -> list:
    """Small initializers (shape and axis constants that shape inference reads) kept; big weights
    replaced by a value-less declaration of the same shape."""
    from onnx import TensorProto

    kept = []
    for init in proto.graph.initializer:
        if _tensor_bytes(init) <= 4096:
            kept.append(init)
        else:
            stub = TensorProto()
            stub.name = init.name
            stub.data_type = init.data_type
            stub.dims.extend(init.dims)
            stub.data_location = TensorProto.EXTERNAL  # no data: shape inference reads dims only
            entry = stub.external_data.add()
            entry.key, entry.value = "location", "unused"
            kept.append(stub)
    return kept
