"""An ONNX model on disk as one unit: the graph file and the external data files its tensors point to.

A protobuf message cannot exceed 2 GB, so ONNX keeps a larger model's weights in data files beside the
graph (``model.onnx`` + ``model.onnx.data``), named relative to the graph's folder. Every tool in the
chain reads them from there: ONNX Runtime and its quantizer, TensorRT's ``parse_from_file``, Triton's
ONNX Runtime backend. The pipeline writes one data file per model, named ``<graph file>.data``, and
moves, copies, hashes and deletes the two together through this module.

Imports: ``onnx``, lazily (core imports nothing else of the pipeline).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.atomic import atomic_path, hidden_temporary

if TYPE_CHECKING:
    import onnx

DATA_SUFFIX = ".data"
PROTOBUF_LIMIT = 2**31 - 1  # bytes: protobuf's hard limit for one serialized message
# Weights above this go to a data file. Well below the limit, because a single file costs memory everywhere: it is
# parsed whole, and ONNX Runtime copies the weights out of the parsed protobuf, where it maps a data file and reads
# only the pages a request touches; the stages stream a data file a block at a time (a 1 GB model in one file
# peaked at 7.2 GB; scripts/bench_build.py --sizes).
EXTERNAL_OVER = 256 << 20
GRAPHDEF_OVER = 1 << 30  # weights above this take tf2onnx's large-model path (pipeline/stages/tf2onnx_run.py)


def data_name(graph: Path | str) -> str:
    """The data file's name for the graph file ``graph``: ``<graph file name>.data``."""
    return Path(graph).name + DATA_SUFFIX


def _locations(model: onnx.ModelProto) -> list[str]:
    from onnx.external_data_helper import _get_all_tensors

    seen: dict[str, None] = {}
    for tensor in _get_all_tensors(model):
        if tensor.data_location == 1:  # TensorProto.EXTERNAL
            for entry in tensor.external_data:
                if entry.key == "location":
                    seen.setdefault(entry.value, None)
    return list(seen)


def graph_proto(path: Path) -> onnx.ModelProto:
    """The model at ``path`` without its external data (tensors keep pointing at their files)."""
    import onnx

    return onnx.load(str(path), load_external_data=False)


def data_files(path: Path) -> list[Path]:
    """The external data files the ONNX model at ``path`` points to (existing or not); [] for a single-file model,
    a path that is not a readable ONNX file, or one that does not end in ``.onnx``."""
    path = Path(path)
    if path.suffix != ".onnx" or not path.is_file():
        return []
    try:
        model = graph_proto(path)
    except Exception:  # noqa: BLE001 - not ONNX (or corrupt): no data files; readers say what is wrong
        return []
    return [path.parent / location for location in _locations(model)]


def onnx_files(path: Path) -> list[Path]:
    """``[path, *data_files(path)]``: every file that makes up the model at ``path``."""
    return [Path(path), *data_files(path)]


def has_external_data(path: Path) -> bool:
    """Whether the ONNX model at ``path`` keeps tensors in data files."""
    return bool(data_files(path))


def total_size(path: Path) -> int:
    """Bytes of the model at ``path`` with its data files (what a publish copies, what a server loads)."""
    return sum(f.stat().st_size for f in onnx_files(path) if f.is_file())


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the tensors held in ``model`` (initializers and constant attributes), inline or external."""
    from onnx.external_data_helper import _get_all_tensors

    total = 0
    for tensor in _get_all_tensors(model):
        if tensor.data_location == 1:
            total += next((int(e.value) for e in tensor.external_data if e.key == "length"), 0)
        else:
            total += len(tensor.raw_data) or tensor.ByteSize()
    return total


def save_onnx(model: onnx.ModelProto, dst: Path, *, external: bool | None = None) -> Path:
    """Save ``model`` at ``dst``, its tensors in ``<dst>.data`` when ``external`` (None: when they exceed
    :data:`EXTERNAL_OVER`). ``model``'s own external tensors must already be loaded. A stale data file of an
    earlier save goes first (ONNX appends to an existing one). With external data the in-memory model is left
    pointing at the file (its tensors no longer hold their bytes)."""
    import onnx

    dst = Path(dst)
    data = dst.parent / data_name(dst)
    data.unlink(missing_ok=True)
    if external is None:
        external = tensor_bytes(model) > EXTERNAL_OVER
    if external:
        onnx.save_model(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
                        size_threshold=1024, convert_attribute=True)
        if data.exists():
            os.chmod(data, 0o644)  # ONNX creates it 0600; a server in a container runs as another user
    else:
        onnx.save_model(model, str(dst))
    return dst


_BLOCK = 64 << 20  # bytes of a tensor read, converted and written at once by save_streamed


def save_streamed(model: onnx.ModelProto, dst: Path, src_folder: Path,
                  convert: Callable[[onnx.TensorProto, bytes], bytes] | None = None) -> Path:
    """Save ``model`` at ``dst`` when its tensors still point into data files in ``src_folder`` (its graph was
    loaded without them and changed): each external tensor is copied into ``<dst>.data`` a block at a time, through
    ``convert(tensor, block)`` when given (a block is a multiple of 8 bytes: whole elements), and re-pointed there.
    The weights are never in memory whole."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    dst, src_folder = Path(dst), Path(src_folder)
    data = dst.parent / data_name(dst)
    with open(data, "wb") as out:
        for tensor in _get_all_tensors(model):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in tensor.external_data}
            offset, length = int(info.get("offset", 0)), int(info["length"]) if "length" in info else None
            start = -out.tell() % 4096 + out.tell()
            out.seek(start)
            with open(src_folder / info["location"], "rb") as src:
                src.seek(offset)
                remaining = length if length is not None else os.fstat(src.fileno()).st_size - offset
                while remaining > 0:
                    block = src.read(min(_BLOCK, remaining))
                    remaining -= len(block)
                    out.write(convert(tensor, block) if convert is not None else block)
            del tensor.external_data[:]
            for key, value in (("location", data.name), ("offset", str(start)), ("length", str(out.tell() - start))):
                tensor.external_data.add(key=key, value=value)
    os.chmod(data, 0o644)
    onnx.save_model(model, str(dst))
    return dst


def _relocate(graph: Path, dst_graph: Path, moves: dict[str, str], move: bool) -> None:
    """``graph``'s proto with its external locations renamed by ``moves``, at ``dst_graph`` (the weights stay
    where they are): moved (rewritten in place, then renamed) or written atomically beside ``dst_graph``."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    model = graph_proto(graph)
    for tensor in _get_all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in moves:
                entry.value = moves[entry.value]
    if move:
        onnx.save_model(model, str(graph))
        os.replace(graph, dst_graph)
        return
    with atomic_path(dst_graph) as tmp:
        onnx.save_model(model, str(tmp))


def _transfer(src: Path, dst: Path, move: bool) -> Path:
    src, dst = Path(src), Path(dst)
    files = data_files(src)
    if not files:
        if move:
            os.replace(src, dst)
        else:
            shutil.copyfile(src, dst)
        (dst.parent / data_name(dst)).unlink(missing_ok=True)  # a single-file model replaces one with data
        return dst
    names = {f.name: data_name(dst) if len(files) == 1 else f"{dst.name}.{i}{DATA_SUFFIX}" for i, f in enumerate(files)}
    for file in files:
        target = dst.parent / names[file.name]
        if file.resolve() != target.resolve():
            (os.replace if move else shutil.copyfile)(file, target)
        os.chmod(target, 0o644)  # ONNX Runtime's quantizer writes 0600; a server in a container runs as another user
    _relocate(src, dst, names, move)
    return dst


def move_onnx(src: Path, dst: Path) -> Path:
    """Move the model at ``src`` (graph and data files) to ``dst``; its data file becomes ``<dst>.data``. The graph
    file is replaced last, so a reader never finds a graph whose data file is not there yet."""
    return _transfer(src, dst, move=True)


def copy_onnx(src: Path, dst: Path) -> Path:
    """Copy the model at ``src`` (graph and data files) to ``dst``; its data file becomes ``<dst>.data``."""
    return _transfer(src, dst, move=False)


def remove_onnx(path: Path) -> None:
    """Delete the model at ``path`` and its data files."""
    for file in onnx_files(path):
        Path(file).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_onnx(dst: Path) -> Iterator[Path]:
    """Like :func:`pipeline.core.atomic.atomic_path` for an ONNX model that may have a data file: yields a hidden
    temporary path beside ``dst`` (``.<name>.<random>.tmp.onnx``, existing and empty) to save the model to; on
    success the model there (graph and data file) is fsynced and moved to ``dst`` (:func:`move_onnx`); on an
    exception the temporaries are removed and ``dst`` is untouched."""
    dst = Path(dst)
    tmp = hidden_temporary(dst)
    try:
        yield tmp
        for file in onnx_files(tmp):
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
        move_onnx(tmp, dst)
    finally:
        remove_onnx(tmp)
        (tmp.parent / data_name(tmp)).unlink(missing_ok=True)
