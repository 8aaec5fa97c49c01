"""tf2onnx's SavedModel conversion, phase by phase, freeing each intermediate as soon as it is used.

``python -m tf2onnx.convert --saved-model`` holds every intermediate until the end: the loaded
SavedModel while grappler optimizes the frozen graph, the frozen GraphDef and the TensorFlow graph
while the ONNX optimizers run, and a deep copy of the whole ONNX graph (weights included) per
optimizer pass that only the cyclic garbage collector frees — 4.7 GB for ResNet50's 98 MB of
weights. This driver calls the same tf2onnx pieces in the same order with the same arguments
(``tf_loader`` freezing and grappler, ``process_tf_graph``, ``optimizer.optimize_graph``,
``make_model``), so the ONNX model is the same, but drops each piece when the next phase no longer
needs it, collects garbage between optimizer passes and returns freed memory to the system.

    python -m pipeline.stages.tf2onnx_run --saved-model DIR --signature_def serving_default --opset 17 --output model.onnx

A SavedModel whose signature captures non-variable resources (lookup tables) goes through
tf2onnx's own loader (``tf_loader.from_saved_model``), which restores those tables.

Weights over :data:`~pipeline.core.onnx_files.EXTERNAL_OVER` take tf2onnx's ``--large_model`` path: frozen
without the protobuf size check, the large constants lifted out of the GraphDef before TensorFlow imports it,
no grappler (it serializes the graph) — and the weights written to ``<output>.data`` beside the ONNX graph
(not tf2onnx's zip), as ONNX's external data. ``--external-data`` writes a data file at any size.

TensorFlow ops tf2onnx has no handler for get one from :mod:`pipeline.stages.tf_ops` (exact GELU's
``Erfc``), registered on import. Ops still left unconverted are named on one stderr line
(``tf_ops.UNSUPPORTED_MARK``) with the lowest opset that would convert each; then no model is
written and the exit status is 1.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import os
from collections import OrderedDict
from typing import Any, Callable

from pipeline.core.pausepoints import pause_point

log = logging.getLogger("pipeline.tf2onnx_run")

# Starts the stderr line naming the ops left unconverted, followed by JSON:
# {"newest_opset": N, "ops": {op: the lowest opset that converts it, or null}}; onnx_export.py reads it.
UNSUPPORTED_MARK = "pipeline.tf2onnx_run unsupported ops: "

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _use_mmap_for_large_blocks() -> None:
    # glibc raises its mmap threshold after each large free, so weight-sized buffers soon come from the
    # heap and stay mapped after they are freed; a fixed threshold returns every one of them at once.
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):  # not glibc
        pass


def _release() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _names(func: Any, tf: Any) -> tuple[list[str], list[str], dict[str, str]]:
    """Input and output tensor names and their renames, as ``tf_loader._from_saved_model_v2`` derives them."""
    captured = {t.name for t in func.graph.function_captures.by_val_internal.values()}
    inputs = [t.name for t in func.inputs if t.dtype != tf.dtypes.resource and t.name not in captured]
    renames: dict[str, str] = {}
    if func.structured_input_signature is not None:
        structured = [t.name for t in tf.nest.flatten(func.structured_input_signature) if isinstance(t, tf.TensorSpec)]
        renames.update(zip(inputs, structured))
    outputs = [t.name for t in func.outputs if t.dtype != tf.dtypes.resource]
    if isinstance(func.structured_outputs, dict):
        renames.update(zip(outputs, sorted(func.structured_outputs)))
    return inputs, outputs, renames


def _needs_full_loader(func: Any, tf: Any) -> bool:
    """True when the signature captures resources that are not variables (tables): tf_loader restores those."""
    variables = {id(v.handle) for v in func.graph.variables}
    return any(t.dtype == tf.resource and id(t) not in variables for t in func.captured_inputs)


def _variable_bytes(func: Any) -> int:
    return sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in func.graph.variables)


def frozen_graph(saved: str, signature: str) -> tuple[Any, list[str], list[str], dict, dict[str, str], dict[str, bytes] | None]:
    """(frozen GraphDef, inputs, outputs, initialized tables, renames, large constants) of ``signature``, with the
    loaded SavedModel freed as soon as it is frozen. Grappler optimizes the GraphDef, except for weights over
    EXTERNAL_OVER: then the large constants' bytes are lifted out of it (the last item, None otherwise)."""
    import tensorflow as tf
    from tf2onnx import tf_loader
    from tf2onnx.tf_utils import compress_graph_def

    from pipeline.core.onnx_files import EXTERNAL_OVER

    with tf.device("/cpu:0"):
        imported = tf.saved_model.load(saved, tags=["serve"])
        if signature not in imported.signatures:
            raise ValueError(f"Specified signature not in model {signature}")
        func = imported.signatures[signature]
        inputs, outputs, renames = _names(func, tf)
        log.info("Output names: %r", sorted(func.structured_outputs) if isinstance(func.structured_outputs, dict) else outputs)
        if _needs_full_loader(func, tf):
            del func, imported
            graph_def, inputs, outputs, tables, renames = tf_loader.from_saved_model(
                saved, None, None, ["serve"], [signature], None, False, return_initialized_tables=True, return_tensors_to_rename=True)
            return graph_def, inputs, outputs, tables, renames, None
        if _variable_bytes(func) > EXTERNAL_OVER:  # tf2onnx's --large_model: a GraphDef cannot hold them
            graph_def = tf_loader.convert_variables_to_constants_large_model(func)
            del func, imported
            _release()
            graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
            lifted = compress_graph_def(graph_def)
            _release()
            return graph_def, inputs, outputs, {}, renames, lifted
        frozen = tf_loader.convert_variables_to_constants_v2(func, lower_control_flow=False, aggressive_inlining=True)
        graph_def = frozen.graph.as_graph_def(add_shapes=True)
        del frozen, func, imported
        _release()
        graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
        with tf.Graph().as_default():
            meta_graph = tf.compat.v1.train.export_meta_graph(graph_def=graph_def)
        del graph_def  # grappler gets the MetaGraphDef; the GraphDef inside it is the only copy left
        return _grappler(meta_graph, inputs, outputs), inputs, outputs, {}, renames, None


def _grappler(meta_graph: Any, inputs: list[str], outputs: list[str]) -> Any:
    """``tf_loader.tf_optimize_grappler``'s optimization of ``meta_graph`` (same configuration)."""
    import tensorflow as tf
    from packaging.version import Version
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    config.graph_options.infer_shapes = True
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers[:] = ["constfold", "function", "dependency"]
    if Version(tf.__version__) >= Version("2.5"):
        rewrite.experimental_disable_folding_quantization_emulation = True
    fetch = meta_graph_pb2.CollectionDef()
    fetch.node_list.value.extend(inputs + outputs)
    meta_graph.collection_def["train_op"].CopyFrom(fetch)
    held = [meta_graph]
    del meta_graph
    # OptimizeGraph serializes its argument and drops it: only the serialized copy lives while grappler runs.
    return tf_optimizer.OptimizeGraph(config, held.pop())


def _collecting(factory: Callable[[], Any]) -> Callable[[], Any]:
    # optimize_graph deep-copies the graph before every pass; the graph it replaced is only reachable
    # through reference cycles, so collect it before the next pass makes another copy.
    def make() -> Any:
        _release()
        return factory()

    return make


class UnsupportedOps(Exception):
    """TensorFlow ops tf2onnx left unconverted (their types, in graph order)."""

    def __init__(self, ops: list[str]) -> None:
        super().__init__(", ".join(sorted(set(ops))))
        self.ops = ops


class _Unmapped(logging.Handler):
    """Collects the op types tf2onnx logs as unsupported ("Tensorflow op [%s: %s] is not supported": node, op)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.ops: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Tensorflow op [") and isinstance(record.args, tuple) and len(record.args) == 2:
            self.ops.append(str(record.args[1]))


def onnx_model(graph_def: list, inputs: list[str], outputs: list[str], tables: dict, renames: dict[str, str], opset: int, name: str,
               lifted: dict[str, bytes] | None = None) -> tuple[Any, Any]:
    """tf2onnx's ONNX ModelProto of the frozen graph in the one-element list ``graph_def`` (emptied, to free
    it), and the storage of its external tensors (None unless ``lifted`` holds large constants' bytes);
    :class:`UnsupportedOps` when ops are left without a handler at ``opset``."""
    import tensorflow as tf
    from tf2onnx import constants, optimizer
    from tf2onnx.graph import ExternalTensorStorage
    from tf2onnx.tfonnx import process_tf_graph

    import pipeline.stages.tf_ops  # noqa: F401  (registers the handlers tf2onnx lacks)

    unmapped = _Unmapped()
    tf2onnx_log = logging.getLogger("tf2onnx.tfonnx")
    tf2onnx_log.addHandler(unmapped)
    try:
        with tf.device("/cpu:0"), tf.Graph().as_default() as tf_graph:
            tf.import_graph_def(graph_def.pop(), name="")
            graph = process_tf_graph(tf_graph, continue_on_error=False, target="", opset=opset, custom_op_handlers={}, extra_opset=[],
                                     input_names=inputs, output_names=outputs, tensors_to_rename=renames, initialized_tables=tables,
                                     const_node_values=lifted)
    finally:
        tf2onnx_log.removeHandler(unmapped)
    if unmapped.ops:
        raise UnsupportedOps(unmapped.ops)
    del tf_graph
    if lifted is not None:
        lifted.clear()  # process_tf_graph made its own arrays of them
    _release()
    with tf.device("/cpu:0"):
        default = "TRUE" if lifted is None else "FALSE"  # as tf2onnx: a large model's optimizer errors are not swallowed
        catch_errors = os.environ.get(constants.ENV_TF2ONNX_CATCH_ERRORS, default).upper() == "TRUE"
        passes = OrderedDict((key, _collecting(factory)) for key, factory in optimizer._get_optimizers().items())
        graph = optimizer.optimize_graph(graph, catch_errors, optimizers=passes)
        _release()
        storage = ExternalTensorStorage() if lifted is not None else None
        return graph.make_model(f"converted from {name}", external_tensor_storage=storage), storage


def save_with_storage(model: Any, storage: Any, output: str) -> None:
    """Save tf2onnx's ``model`` at ``output``; the tensors it keeps in ``storage`` (its ``--large_model`` form) go
    into ``<output>.data`` as ONNX external data, each at a 4 KiB-aligned offset, dropped from memory once written."""
    from pathlib import Path

    import onnx
    from onnx.external_data_helper import _get_all_tensors, set_external_data

    from pipeline.core.onnx_files import data_name

    data = Path(output).parent / data_name(output)
    with open(data, "wb") as fh:
        for tensor in _get_all_tensors(model):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            key = next(e.value for e in tensor.external_data if e.key == "location")
            blob = storage.name_to_tensor_data.pop(key)
            offset = -fh.tell() % 4096 + fh.tell()
            fh.seek(offset)
            fh.write(blob)
            del tensor.external_data[:]
            set_external_data(tensor, data.name, offset, len(blob))
            del blob
    onnx.save_model(model, output)


def main(argv: list[str] | None = None) -> int:
    """Convert ``--saved-model``'s ``--signature_def`` to ONNX at ``--output``; exit status 1 when ops are left unconverted."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.tf2onnx_run", description=__doc__.splitlines()[0])
    parser.add_argument("--saved-model", required=True)
    parser.add_argument("--signature_def", required=True)
    parser.add_argument("--opset", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--external-data", action="store_true", help="write the weights to <output>.data at any size")
    args = parser.parse_args(argv)
    pause_point("tf2onnx.convert")
    _use_mmap_for_large_blocks()

    from tf2onnx import logging as tf2onnx_logging

    from pipeline.core.onnx_files import save_onnx

    tf2onnx_logging.basicConfig(level=tf2onnx_logging.get_verbosity_level(None))
    graph_def, inputs, outputs, tables, renames, lifted = frozen_graph(args.saved_model, args.signature_def)
    held = [graph_def]
    del graph_def
    try:
        model, storage = onnx_model(held, inputs, outputs, tables, renames, args.opset, args.saved_model, lifted)
    except UnsupportedOps as exc:
        from pipeline.stages.tf_ops import NEWEST_OPSET, lowest_opsets

        log.error("%s%s", UNSUPPORTED_MARK, json.dumps({"newest_opset": NEWEST_OPSET, "ops": lowest_opsets(sorted(set(exc.ops)))}))
        return 1
    if storage is not None:
        save_with_storage(model, storage, args.output)
    else:
        save_onnx(model, args.output, external=True if args.external_data else None)
    log.info("Successfully converted TensorFlow model %s to ONNX at %s", args.saved_model, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
