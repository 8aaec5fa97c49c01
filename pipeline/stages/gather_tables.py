"""INT8 for embedding tables: the large tables a ``Gather`` reads, quantized weights-only, one scale per row.

A recommender's item table or a language model's token table is most of its weights but does no
arithmetic: each request reads a few rows. Activation quantization has nothing to gain there, so the
INT8 stage stores such a table (float, rank 2, read only by ``Gather`` on axis 0, at least
``--int8-table-min-mib``) as int8 with a float scale per row (``max |row| / 127``): a quarter of the bytes.
Two graph forms compute the same values, ``float(q[ids]) × scale[ids]``:

- ONNX Runtime's (both INT8 variants as ONNX): ``Gather(q) → Cast → Mul(Gather(scale))``. Only the rows a
  request reads are converted. ONNX Runtime does not fold a ``DequantizeLinear`` of a constant, so the other
  form would dequantize the whole table on every request.
- TensorRT's (:func:`tables_for_tensorrt`, the ``int8`` variant): ``DequantizeLinear(q, scale, axis=0) →
  Gather``. TensorRT accepts an int8 constant only before a DequantizeLinear; TensorRT-RTX 1.7 builds this
  form and refuses the other ("Quantized constant ... is only allowed before DQ").

The table is read from its data file a block of rows at a time: the float table is never in memory whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.onnx_files import graph_proto, has_external_data, save_onnx

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

TABLE_FLAG = "--int8-table-min-mib"
DEFAULT_TABLE_MIN_MIB = 64.0
_BLOCK_BYTES = 64 << 20  # float rows read at once


@dataclass(frozen=True)
class Table:
    """One table: its initializer, the Gather nodes that read it, and its size."""

    initializer: str
    gathers: tuple[str, ...]
    rows: int
    cols: int
    nbytes: int


def large_tables(model: onnx.ModelProto, min_bytes: int) -> list[Table]:
    """Float rank-2 initializers of at least ``min_bytes`` whose every consumer is a ``Gather`` on axis 0 reading
    them as its data (not a tied output projection, which a MatMul also reads)."""
    from onnx import TensorProto, helper

    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = []
    for init in model.graph.initializer:
        if init.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16) or len(init.dims) != 2:
            continue
        readers = consumers.get(init.name, [])
        gathers = [n for n in readers if n.op_type == "Gather" and n.input[0] == init.name and n.input[1] != init.name
                   and next((a.i for a in n.attribute if a.name == "axis"), 0) == 0]
        size = int(init.dims[0]) * int(init.dims[1]) * np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        if readers and len(gathers) == len(readers) and size >= min_bytes:
            found.append(Table(init.name, tuple(n.name for n in gathers), int(init.dims[0]), int(init.dims[1]), size))
    return found


def _rows(init: onnx.TensorProto, base: Path, start: int, stop: int, cols: int) -> np.ndarray:
    """Rows ``start:stop`` of ``init`` as float32, read from its data file (external) or its bytes."""
    from onnx import TensorProto, helper

    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    if init.data_location == TensorProto.EXTERNAL:
        info = {e.key: e.value for e in init.external_data}
        offset = int(info.get("offset", 0)) + start * cols * dtype.itemsize
        block = np.fromfile(base / info["location"], dtype=dtype, count=(stop - start) * cols, offset=offset)
    else:
        from onnx import numpy_helper

        block = numpy_helper.to_array(init)[start:stop].reshape(-1)
    return block.reshape(stop - start, cols).astype(np.float32)


def quantized_table(init: onnx.TensorProto, base: Path, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale per row) of the table ``init``: symmetric, ``scale = max|row| / 127`` (1 for a row
    of zeros), rounded half to even as QuantizeLinear does."""
    q = np.empty((rows, cols), np.int8)
    scale = np.empty((rows, 1), np.float32)
    step = max(1, _BLOCK_BYTES // (cols * 4))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block = _rows(init, base, start, stop, cols)
        peak = np.abs(block).max(axis=1, keepdims=True)
        s = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q[start:stop] = np.clip(np.rint(block / s), -127, 127).astype(np.int8)
        scale[start:stop] = s
    return q, scale


def tables_quantized(path: Path, dst: Path, min_bytes: int) -> list[str]:
    """Write the model at ``path`` to ``dst`` with its large Gather tables quantized (ONNX Runtime's form, see the
    module docstring); returns the names of the nodes that now compute them (to leave out of activation
    quantization). Where it has no such table, nothing is written and the list is empty."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_tensor

    path, dst = Path(path), Path(dst)
    model = graph_proto(path)
    tables = large_tables(model, min_bytes)
    if not tables:
        return []
    external = has_external_data(path)
    names = {t.initializer for t in tables}
    for tensor in _get_all_tensors(model):  # the rest of the weights, to be saved again beside the new tables
        if tensor.data_location == TensorProto.EXTERNAL and tensor.name not in names:
            load_external_data_for_tensor(tensor, str(path.parent))
    inits = {init.name: init for init in model.graph.initializer}
    nodes: list[str] = []
    for table in tables:
        q, scale = quantized_table(inits[table.initializer], path.parent, table.rows, table.cols)
        model.graph.initializer.remove(inits[table.initializer])
        model.graph.initializer.extend([numpy_helper.from_array(q, f"{table.initializer}_int8"),
                                        numpy_helper.from_array(scale, f"{table.initializer}_row_scale")])
        del q
        for node in model.graph.node:
            if node.name not in table.gathers:
                continue
            out, ids = node.output[0], node.input[1]
            node.input[0], node.output[0] = f"{table.initializer}_int8", f"{out}/int8"
            model.graph.node.extend([
                helper.make_node("Cast", [f"{out}/int8"], [f"{out}/rows"], name=f"{node.name}/dequantize", to=TensorProto.FLOAT),
                helper.make_node("Gather", [f"{table.initializer}_row_scale", ids], [f"{out}/scale"], name=f"{node.name}/row_scale", axis=0),
                helper.make_node("Mul", [f"{out}/rows", f"{out}/scale"], [out], name=f"{node.name}/scaled"),
            ])
            nodes += [node.name, f"{node.name}/dequantize", f"{node.name}/row_scale", f"{node.name}/scaled"]
        log.info("INT8: table %s (%d × %d, %.0f MiB) quantized per row, weights only", table.initializer, table.rows, table.cols, table.nbytes / 2**20)
    _sorted_topologically(model)
    save_onnx(model, dst, external=external)
    return nodes


def _sorted_topologically(model: onnx.ModelProto) -> None:
    graph = model.graph
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input)]
        if not ready:
            ordered += pending  # a cycle or an outer-scope input: leave the rest as it was
            break
        for node in ready:
            ordered.append(node)
            known.update(node.output)
        pending = [n for n in pending if n not in ready]
    copies = [type(n)() for n in ordered]
    for copy, node in zip(copies, ordered):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def tables_for_tensorrt(model: onnx.ModelProto) -> int:
    """Rewrite each table of :func:`tables_quantized` in ``model`` into TensorRT's form, ``DequantizeLinear(q,
    scale, axis=0) → Gather`` (zero point 0); returns how many Gathers it rewrote."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {out: n for n in graph.node for out in n.output}
    rewritten, drop = 0, []
    for mul in [n for n in graph.node if n.op_type == "Mul" and n.name.endswith("/scaled")]:
        cast, row_scale = producers.get(mul.input[0]), producers.get(mul.input[1])
        gather = producers.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
        if gather is None or row_scale is None or row_scale.op_type != "Gather" or gather.input[0] not in inits:
            continue
        table, scale_name = gather.input[0], row_scale.input[0]
        flat = f"{scale_name}_rows"
        if flat not in inits:  # a table two Gathers read is dequantized once
            graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(inits[scale_name]).reshape(-1), flat))
            inits[flat] = graph.initializer[-1]
            # no zero point: an int8 input's default one is int8 0, what TensorRT's explicit quantization wants
            graph.node.append(helper.make_node("DequantizeLinear", [table, flat], [f"{table}/dequantized"], name=f"{table}/dequantize", axis=0))
        gather.input[0] = f"{table}/dequantized"
        gather.output[0] = mul.output[0]
        drop += [cast, row_scale, mul]
        rewritten += 1
    for node in drop:
        graph.node.remove(node)
    used = {i for n in graph.node for i in n.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)
    _sorted_topologically(model)
    return rewritten
