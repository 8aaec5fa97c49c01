"""SavedModel → ONNX with tf2onnx, then checked and given readable dynamic-axis names.

tf2onnx runs in a child process through :mod:`pipeline.stages.tf2onnx_run`, which calls tf2onnx's
conversion phases in the order ``python -m tf2onnx.convert`` does (the same ONNX model, byte for
byte) but frees each intermediate when the next phase no longer needs it: ResNet50 converts in
1.9 GB instead of 4.7 GB.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.onnx_files import atomic_onnx, has_external_data, save_onnx
from pipeline.core.errors import PipelineError
from pipeline.core.isolate import die_with_parent
from pipeline.data.tensors import SIGNATURE
from pipeline.stages.mixed import float32_from_mixed
from pipeline.stages.tf2onnx_run import UNSUPPORTED_MARK

if TYPE_CHECKING:
    import onnx  # imported lazily at run time

log = logging.getLogger(__name__)

MIN_OPSET = 17


def tf2onnx_command(saved: Path, dst: Path, opset: int, external_data: bool = False) -> list[str]:
    """The exact tf2onnx command line this stage runs (also the artifact's reproduce command)."""
    return [
        sys.executable, "-m", "pipeline.stages.tf2onnx_run",
        "--saved-model", str(saved),
        "--signature_def", SIGNATURE,
        "--opset", str(opset),
        "--output", str(dst),
        *(["--external-data"] if external_data else []),
    ]


def onnx_from_savedmodel(saved: Path, dst: Path, opset: int, external_data: bool = False) -> Path:
    """Convert the SavedModel's serving signature to ONNX at ``dst`` (opset ≥ 17), run
    ``onnx.checker``, and name dynamic axes: ``batch`` for axis 0, ``<tensor>_dim<i>`` otherwise.
    Weights over 256 MiB (or any, with ``external_data``) are written to ``<dst>.data`` beside it."""
    import onnx

    if opset < MIN_OPSET:
        raise PipelineError(f"--opset {opset} is too old", f"use --opset {MIN_OPSET} or newer")
    with atomic_onnx(dst) as tmp:  # hidden .<name>.*.tmp.onnx beside dst (and its data file), moved into place at the end
        cmd = tf2onnx_command(saved, tmp, opset, external_data)
        log.info("tf2onnx: %s", shlex.join(cmd[1:]))
        proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=die_with_parent)
        unsupported = unsupported_ops(proc.stderr)
        if unsupported:
            raise unsupported_error(unsupported, opset)
        if proc.returncode != 0 or tmp.stat().st_size == 0:
            tail = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            raise PipelineError(f"tf2onnx failed: {tail[0][:300]}", f"run it by hand to see the full log: {shlex.join(tf2onnx_command(saved, dst, opset, external_data))}")

        external = has_external_data(tmp)
        model = onnx.load(str(tmp))
        _keras_output_order(model, saved)
        float32_from_mixed(model)
        _name_dynamic_axes(model)
        save_onnx(model, tmp, external=external)
        del model
        try:
            onnx.checker.check_model(str(tmp), full_check=True)  # by path: a model over 2 GB cannot be checked in memory
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            raise PipelineError(f"tf2onnx produced an invalid ONNX model: {str(exc).splitlines()[0]}", "report the model to tf2onnx") from None
    return dst


def unsupported_ops(stderr: str) -> dict:
    """What the conversion driver's stderr line (tf2onnx_run.UNSUPPORTED_MARK) says was left
    unconverted: ``{"newest_opset": N, "ops": {op: lowest opset converting it, or None}}``; empty when none."""
    found = re.search(re.escape(UNSUPPORTED_MARK) + r"(\{.*\})", stderr)
    return json.loads(found.group(1)) if found else {}


def unsupported_error(unsupported: dict, opset: int) -> PipelineError:
    """One line naming every unconverted op and the opset that would convert it."""
    ops: dict[str, int | None] = unsupported["ops"]
    later = {op: v for op, v in ops.items() if v is not None}
    never = [op for op, v in ops.items() if v is None]
    parts = [f"{op} (needs opset {v})" for op, v in later.items()] + [f"{op} (no tf2onnx handler at any opset up to {unsupported['newest_opset']})" for op in never]
    if never:
        fix = ("replace those layers with ones built from supported ops, or add a handler for them to pipeline/stages/tf_ops.py"
               + (f" (and pass --opset {max(later.values())})" if later else ""))
    else:
        fix = f"pass --opset {max(later.values())}"
    return PipelineError(f"tf2onnx cannot convert TensorFlow op(s) {', '.join(parts)} to ONNX opset {opset}", fix)


def _keras_output_order(model: onnx.ModelProto, saved: Path) -> None:
    """tf2onnx emits a dict signature's outputs sorted by name; put them back in the Keras model's order."""
    from pipeline.accuracy.outputkinds import read_description

    described = read_description(saved)
    if not described:
        return
    rank = {d["name"]: i for i, d in enumerate(described)}
    outputs = sorted(model.graph.output, key=lambda o: rank.get(o.name, len(rank)))
    del model.graph.output[:]
    model.graph.output.extend(outputs)


def _name_dynamic_axes(model: onnx.ModelProto) -> None:
    initializers = {i.name for i in model.graph.initializer}
    tensors = [v for v in model.graph.input if v.name not in initializers] + list(model.graph.output)
    for value in tensors:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            dim.dim_param = "batch" if axis == 0 else f"{value.name}_dim{axis}"
