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

Weights over :data:`~pipeline.core.onnx_files.GRAPHDEF_OVER` take tf2onnx's ``--large_model`` path: frozen
without the protobuf size check, the large constants lifted out of the GraphDef before TensorFlow imports it,
no grappler (it serializes the graph) — and the weights written to ``<output>.data`` beside the ONNX graph
(not tf2onnx's zip), as ONNX's external data. ``--external-data`` writes a data file at any size.

On every path, variables of :data:`WEIGHT_INPUT_BYTES` or more never enter grappler or tf2onnx: frozen out with
TensorFlow's own denylist, each is written to the data file a block of rows at a time, stays a Placeholder of its
type and shape (tf2onnx converts it to a graph input, and copies nothing), and that input becomes an initializer
pointing into the data file (written back into one file below EXTERNAL_OVER). tf2onnx's own large-model path holds
each of them several times over (its optimizer passes deep-copy the graph): 14.4 GB for a 2.1 GB embedding table,
where the export stage now peaks at 2.3 × the weights.

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

from pipeline.core.onnx_files import EXTERNAL_OVER, GRAPHDEF_OVER
from pipeline.core.pausepoints import pause_point

log = logging.getLogger("pipeline.tf2onnx_run")

# Starts the stderr line naming the ops left unconverted, followed by JSON:
# {"newest_opset": N, "ops": {op: the lowest opset that converts it, or null}}; onnx_export.py reads it.
UNSUPPORTED_MARK = "pipeline.tf2onnx_run unsupported ops: "

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
WEIGHT_INPUT_BYTES = 16 << 20  # on the large-model path, a constant this size is a graph input while tf2onnx converts


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


class Spilled:
    """The data file being written on the large-model path, and the tensors already in it (name → its
    ``(offset, length, ONNX type, shape)``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = open(path, "wb")  # noqa: SIM115 - written while the graph converts, closed by save_with_storage
        self.tensors: dict[str, tuple[int, int, int, list[int]]] = {}
        self.names: dict[str, str] = {}  # the initializer's name, where the placeholder's is not telling (a variable's path)

    def write(self, blob: bytes) -> tuple[int, int]:
        """Append ``blob`` at a 4 KiB-aligned offset; (offset, length)."""
        offset = -self.file.tell() % 4096 + self.file.tell()
        self.file.seek(offset)
        self.file.write(blob)
        return offset, len(blob)


def _spill_weights(graph_def: Any, lifted: dict[str, bytes], spilled: Spilled, spill_over: int) -> None:
    """Constants of ``spill_over`` bytes or more: their bytes to the data file, their Const nodes to Placeholders."""
    import tensorflow as tf
    from tf2onnx.tf_utils import map_tf_dtype

    for node in graph_def.node:
        if node.op != "Const" or len(lifted.get(node.name, b"")) < spill_over:
            continue
        tensor = node.attr["value"].tensor
        dtype, shape = tensor.dtype, tf.TensorShape(tensor.tensor_shape)
        offset, length = spilled.write(lifted.pop(node.name))
        spilled.tensors[f"{node.name}:0"] = (offset, length, map_tf_dtype(tf.dtypes.as_dtype(dtype)), shape.as_list())
        node.op = "Placeholder"
        node.attr.clear()
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(shape.as_proto())


def _frozen_without_large_variables(func: Any, spilled: Spilled, spill_over: int) -> Any:
    """``func`` frozen as tf2onnx's large-model path freezes it, except that variables of ``spill_over`` bytes or more
    are written to ``spilled``'s data file one at a time (each straight from the variable) and stay in the graph as
    Placeholders of their type and shape: TensorFlow's freezing would hold each as a NumPy copy, a TensorProto and
    bytes at once."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import _FunctionConverterDataInEager, _replace_variables_by_constants
    from tf2onnx.tf_utils import map_tf_dtype

    by_handle = {id(v.handle): v for v in func.graph.variables}
    large = {}
    for value, placeholder in func.graph.captures:
        variable = by_handle.get(id(value))
        if variable is not None and int(variable.shape.num_elements() or 0) * variable.dtype.size >= spill_over:
            large[placeholder.name.split(":")[0]] = variable
    converter = _FunctionConverterDataInEager(func=func, lower_control_flow=False, aggressive_inlining=True, variable_names_denylist=set(large))
    graph_def, _ = _replace_variables_by_constants(converter_data=converter)
    del converter
    for name, variable in large.items():
        shape = variable.shape.as_list()
        rows = max(1, (64 << 20) // max(1, int(variable.shape[1:].num_elements() or 1) * variable.dtype.size)) if shape else 1
        (offset, _), length = spilled.write(b""), 0
        for start in range(0, shape[0] if shape else 1, rows):  # a block of rows at a time: never a second copy of the variable
            block = variable[start:start + rows].numpy() if shape else variable.numpy()
            length += spilled.file.write(np.ascontiguousarray(block).data.cast("B"))
        spilled.tensors[f"{name}:0"] = (offset, length, map_tf_dtype(variable.dtype), shape)
        spilled.names[f"{name}:0"] = getattr(variable, "path", None) or variable.name.split(":")[0]
    carriers = dict(large)  # node name → the variable its resource output carries (inlined calls pass it on through Identity)
    changed = True
    while changed:
        changed = False
        for node in graph_def.node:
            if node.op == "Identity" and node.name not in carriers and node.attr["T"].type == tf.resource.as_datatype_enum \
                    and node.input[0].split(":")[0] in carriers:
                carriers[node.name] = carriers[node.input[0].split(":")[0]]
                node.attr["T"].type = carriers[node.name].dtype.as_datatype_enum
                changed = True
    for node in graph_def.node:
        source = node.input[0].split(":")[0] if node.input else ""
        if node.op == "Placeholder" and node.name in large:
            variable = large[node.name]
            node.attr.clear()
            node.attr["dtype"].type = variable.dtype.as_datatype_enum
            node.attr["shape"].shape.CopyFrom(variable.shape.as_proto())
        elif node.op == "ReadVariableOp" and source in carriers:
            dtype = node.attr["dtype"].type
            node.op = "Identity"
            node.attr.clear()
            node.attr["T"].type = dtype
        elif node.op == "ResourceGather" and source in carriers:
            _gather_from_placeholder(graph_def, node, tf)
    return graph_def


def _gather_from_placeholder(graph_def: Any, node: Any, tf: Any) -> None:
    """``node`` (a ResourceGather of a variable now a Placeholder) as the GatherV2 TensorFlow's freezing makes of it."""
    if node.attr["batch_dims"].i != 0:
        raise ValueError(f"ResourceGather {node.name} has batch_dims {node.attr['batch_dims'].i}; freezing needs 0")
    axis = graph_def.node.add(name=f"{node.name}/axis", op="Const")
    axis.attr["dtype"].type = node.attr["Tindices"].type
    axis.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0, dtype=tf.dtypes.as_dtype(node.attr["Tindices"].type)))
    dtype, tindices = node.attr["dtype"].type, node.attr["Tindices"].type
    node.op = "GatherV2"
    node.input[:] = [node.input[0], node.input[1], axis.name, *[i for i in node.input[2:] if i.startswith("^")]]
    node.attr.clear()
    node.attr["Tparams"].type = dtype
    node.attr["Tindices"].type = tindices
    node.attr["Taxis"].type = tindices
    node.attr["batch_dims"].i = 0


def frozen_graph(saved: str, signature: str, spilled: Spilled | None = None, large_over: int = 0,
                 spill_over: int = WEIGHT_INPUT_BYTES) -> tuple[Any, list[str], list[str], dict, dict[str, str], dict[str, bytes] | None]:
    """(frozen GraphDef, inputs, outputs, initialized tables, renames, large constants) of ``signature``, with the
    loaded SavedModel freed as soon as it is frozen. With ``spilled``, variables of ``spill_over`` bytes or more go to its
    data file and stay Placeholders (see the module docstring). Grappler optimizes the GraphDef, except for weights over
    ``large_over`` bytes: then the large constants' bytes are lifted out of it (the last item, None otherwise)."""
    import tensorflow as tf
    from tf2onnx import tf_loader
    from tf2onnx.tf_utils import compress_graph_def

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
        if spilled is not None and _variable_bytes(func) > large_over:  # tf2onnx's --large_model: a GraphDef cannot hold them
            graph_def = _frozen_without_large_variables(func, spilled, spill_over)
            del func, imported
            _release()
            graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
            lifted = compress_graph_def(graph_def)
            _spill_weights(graph_def, lifted, spilled, spill_over)
            _release()
            return graph_def, inputs + list(spilled.tensors), outputs, {}, renames, lifted
        if spilled is not None and any(int(v.shape.num_elements() or 0) * v.dtype.size >= spill_over for v in func.graph.variables):
            graph_def = _frozen_without_large_variables(func, spilled, spill_over)  # grappler and tf2onnx never hold them
            inputs = inputs + list(spilled.tensors)
        else:
            frozen = tf_loader.convert_variables_to_constants_v2(func, lower_control_flow=False, aggressive_inlining=True)
            graph_def = frozen.graph.as_graph_def(add_shapes=True)
            del frozen
        del func, imported
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


def _tensor_bytes(path: str) -> int:
    from pathlib import Path

    from pipeline.core.onnx_files import graph_proto, tensor_bytes

    return tensor_bytes(graph_proto(Path(path)))


def save_with_storage(model: Any, storage: Any, spilled: Spilled, output: str) -> None:
    """Save tf2onnx's ``model`` at ``output`` with its weights in ``spilled``'s data file: the tensors it keeps in
    ``storage`` (its ``--large_model`` form) appended, each dropped from memory once written; the graph inputs that
    stood for spilled tensors turned into initializers pointing at them."""
    import os

    import onnx
    from onnx.external_data_helper import _get_all_tensors

    name = os.path.basename(spilled.path)

    def point_at(tensor: Any, offset: int, length: int) -> None:
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        for key, value in (("location", name), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        tensor.data_location = onnx.TensorProto.EXTERNAL

    for tensor in _get_all_tensors(model) if storage is not None else ():
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        key = next(e.value for e in tensor.external_data if e.key == "location")
        point_at(tensor, *spilled.write(storage.name_to_tensor_data.pop(key)))
    spilled.file.close()
    os.chmod(spilled.path, 0o644)
    graph = model.graph
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output} | {v.name for v in graph.input}
    for value in [v for v in graph.input if v.name in spilled.tensors]:
        offset, length, onnx_type, shape = spilled.tensors[value.name]
        wanted = spilled.names.get(value.name, value.name)
        initializer = wanted if wanted not in taken else value.name
        taken.add(initializer)
        for node in graph.node:
            node.input[:] = [initializer if i == value.name else i for i in node.input]
        tensor = onnx.TensorProto(name=initializer, data_type=onnx_type, dims=shape)
        point_at(tensor, offset, length)
        graph.initializer.append(tensor)
        graph.input.remove(value)
    onnx.save_model(model, output)


def main(argv: list[str] | None = None) -> int:
    """Convert ``--saved-model``'s ``--signature_def`` to ONNX at ``--output``; exit status 1 when ops are left unconverted."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.tf2onnx_run", description=__doc__.splitlines()[0])
    parser.add_argument("--saved-model", required=True)
    parser.add_argument("--signature_def", required=True)
    parser.add_argument("--opset", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--external-data", action="store_true", help="write the weights to <output>.data at any size")
    # where the large-model path starts, and which constants it keeps out of tf2onnx (bytes): tests take it on small models
    parser.add_argument("--large-over", type=int, default=GRAPHDEF_OVER, help=argparse.SUPPRESS)
    parser.add_argument("--spill-over", type=int, default=WEIGHT_INPUT_BYTES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # oneDNN's kernels buy nothing here (constant folding of a few small tensors) and cost ~200 MB of resident memory
    # (ResNet50: 2,123 → 1,921 MiB peak, the same ONNX bytes); set before TensorFlow is imported
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    pause_point("tf2onnx.convert")
    _use_mmap_for_large_blocks()

    import onnx
    from tf2onnx import logging as tf2onnx_logging

    from pipeline.core.onnx_files import data_name, save_onnx

    tf2onnx_logging.basicConfig(level=tf2onnx_logging.get_verbosity_level(None))
    spilled = Spilled(os.path.join(os.path.dirname(os.path.abspath(args.output)), data_name(args.output)))
    graph_def, inputs, outputs, tables, renames, lifted = frozen_graph(args.saved_model, args.signature_def, spilled, args.large_over,
                                                                       args.spill_over)
    held = [graph_def]
    del graph_def
    try:
        model, storage = onnx_model(held, inputs, outputs, tables, renames, args.opset, args.saved_model, lifted)
    except UnsupportedOps as exc:
        from pipeline.stages.tf_ops import NEWEST_OPSET, lowest_opsets

        log.error("%s%s", UNSUPPORTED_MARK, json.dumps({"newest_opset": NEWEST_OPSET, "ops": lowest_opsets(sorted(set(exc.ops)))}))
        return 1
    if storage is not None or spilled.tensors:
        save_with_storage(model, storage, spilled, args.output)
        del model
        if storage is None and not args.external_data and _tensor_bytes(args.output) <= EXTERNAL_OVER:
            save_onnx(onnx.load(args.output), args.output, external=False)  # a model this size stays one file, as it always was
    else:
        spilled.file.close()
        os.unlink(spilled.path)
        save_onnx(model, args.output, external=True if args.external_data else None)
    log.info("Successfully converted TensorFlow model %s to ONNX at %s", args.saved_model, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
