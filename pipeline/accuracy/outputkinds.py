"""What each model output is, so that each is judged by what it means.

Every output gets one kind:

=============  ====================================================  ==============================
kind           what it is                                            judged on (pipeline.accuracy.taskstats)
=============  ====================================================  ==============================
classes        K > 1 class scores (softmax or logits), [B, K]        top-1 (with labels: accuracy)
binary         one sigmoid probability or logit, [B] or [B, 1]       decisions at a threshold
multilabel     K independent sigmoids, [B, K]                        decisions per label
regression     real values                                           error relative to their spread
segmentation   class scores per position, [B, …, K]                  per-position top-1 (labels: mIoU)
embedding      a vector compared by angle, [B, D]                    cosine, nearest-neighbour agreement
=============  ====================================================  ==============================

The kind is decided per output, first match wins: ``--output-kind NAME=KIND`` (any numeric output;
integer and boolean values are judged as they are, never as logits; other dtypes refuse it); for
integer and boolean outputs without it, ``regression`` (compared as numbers); the Keras loss the
model was compiled with (``.keras`` files keep it); the output layer's activation (softmax, sigmoid,
``UnitNormalization``); for SavedModels, the ONNX op that makes the output; the labels the
evaluation data gives for it (integers: class indices; floats: targets); else the shape (a linear
output is regression). The decision and its reason are printed and recorded in the manifest.

The Keras side is described once, in the SavedModel export's child process
(:func:`describe_keras_outputs`), and stored with the SavedModel as
``assets.extra/pipeline_outputs.json``; the ONNX stage orders the ONNX outputs as Keras does.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core.errors import PipelineError

if TYPE_CHECKING:
    import keras
    import onnx

    from pipeline.data.tensors import ModelSignature, TensorSpec

log = logging.getLogger(__name__)

NUMERIC = "fiub"  # numpy dtype kinds an output kind can judge (taskstats computes in float64)
KINDS = ("classes", "binary", "multilabel", "regression", "segmentation", "embedding")
DESCRIPTION_FILE = Path("assets.extra") / "pipeline_outputs.json"  # inside the SavedModel folder

# Keras loss names (class or function, lower case, without underscores) → what they train.
_LOSS_KINDS = {
    "categoricalcrossentropy": "classes", "sparsecategoricalcrossentropy": "classes", "categoricalfocalcrossentropy": "classes",
    "categoricalhinge": "classes", "kldivergence": "classes", "kld": "classes", "kullbackleiblerdivergence": "classes",
    "binarycrossentropy": "binary", "binaryfocalcrossentropy": "binary", "hinge": "binary", "squaredhinge": "binary",
    "meansquarederror": "regression", "mse": "regression", "meanabsoluteerror": "regression", "mae": "regression",
    "meanabsolutepercentageerror": "regression", "mape": "regression", "meansquaredlogarithmicerror": "regression",
    "msle": "regression", "huber": "regression", "logcosh": "regression", "poisson": "regression",
    "cosinesimilarity": "embedding", "tripletloss": "embedding", "contrastiveloss": "embedding",
}
_PASS_THROUGH = {"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"}


@dataclass(frozen=True)
class OutputKind:
    """One output's kind, why it was chosen, and what judging it needs."""

    name: str
    kind: str
    why: str
    logits: bool = False  # binary/multilabel scores before the sigmoid: the threshold moves to logit(t)
    classes: int | None = None  # K of classes/segmentation/multilabel outputs, when fixed

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputKind:
        """Inverse of :meth:`as_dict`."""
        return cls(**{k: data[k] for k in ("name", "kind", "why", "logits", "classes") if k in data})


def parse_output_kinds(values: Sequence[str]) -> dict[str, str]:
    """``NAME=KIND`` overrides (``--output-kind``, repeatable) as a dict; a bad kind is one line naming the closest."""
    overrides: dict[str, str] = {}
    for text in values:
        name, sep, kind = text.partition("=")
        name, kind = name.strip(), kind.strip().lower()
        if not sep or not name or not kind:
            raise PipelineError(f"malformed --output-kind '{text}': expected NAME=KIND", f"write e.g. --output-kind score=regression (kinds: {', '.join(KINDS)})")
        if kind not in KINDS:
            close = difflib.get_close_matches(kind, KINDS, n=1)
            raise PipelineError(f"unknown output kind '{kind}' in --output-kind {text}",
                                f"use {'--output-kind ' + name + '=' + close[0] if close else 'one of: ' + ', '.join(KINDS)}")
        overrides[name] = kind
    return overrides


def check_override_names(overrides: Mapping[str, str], outputs: Sequence[str]) -> None:
    """Every ``--output-kind`` name must be an output of the model; the error names the closest one."""
    for name in overrides:
        if name not in outputs:
            close = difflib.get_close_matches(name, outputs, n=1)
            raise PipelineError(f"--output-kind names '{name}', which is not an output of the model (outputs: {', '.join(outputs)})",
                                f"did you mean --output-kind {close[0]}={overrides[name]}?" if close else "use one of the model's output names")


# ---- the Keras side (runs where the Keras model is loaded) -----------------------------------------------------


def describe_keras_outputs(model: keras.Model, names: Sequence[str], compile_config: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Per output, in Keras order: its export name, the layer that makes it, that layer's activation,
    whether it L2-normalises, its shape and the loss it was trained with (when the model was compiled)."""
    losses = _losses_by_output(names, compile_config)
    described = []
    for name, tensor in zip(names, model.outputs):
        history = getattr(tensor, "_keras_history", None)
        layer = getattr(history, "operation", None) or getattr(history, "layer", None)  # tf-keras calls it layer
        layer_class = type(layer).__name__ if layer is not None else None
        activation = getattr(getattr(layer, "activation", None), "__name__", None)
        if layer_class == "Softmax":
            activation = "softmax"
        normalized = layer_class == "UnitNormalization" or "l2_normal" in (getattr(layer, "name", "") or "")
        described.append({
            "name": name, "layer": getattr(layer, "name", None), "layer_class": layer_class, "activation": activation,
            "l2_normalized": normalized, "shape": [d if d is None else int(d) for d in tensor.shape], "loss": losses.get(name),
        })  # fmt: skip
    return described


def compile_config_of_archive(path: Path) -> dict[str, Any] | None:
    """The ``compile_config`` a ``.keras`` archive stores (it is kept even when loaded with compile=False)."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return config.get("compile_config") or None


def compile_config_of_model(model: keras.Model) -> dict[str, Any] | None:
    """The compile config of a model built in this process (``module:function`` sources)."""
    try:
        return model.get_compile_config() or None
    except Exception:  # not compiled, or a Keras without it
        return None


def _losses_by_output(names: Sequence[str], compile_config: Mapping[str, Any] | None) -> dict[str, str]:
    """Per output name, the loss name ``compile_config`` gives it (one loss for all, a dict by output, or a list in output order)."""
    loss = (compile_config or {}).get("loss")
    if loss is None:
        return {}
    if isinstance(loss, Mapping) and "class_name" not in loss:
        return {k: _loss_name(v) for k, v in loss.items() if _loss_name(v)}
    if isinstance(loss, (list, tuple)):
        return {n: _loss_name(v) for n, v in zip(names, loss) if _loss_name(v)}
    name = _loss_name(loss)
    return {n: name for n in names} if name else {}


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return loss
    if isinstance(loss, Mapping):
        config = loss.get("config")
        if loss.get("class_name") == "function" and isinstance(config, str):
            return config
        return str(loss.get("class_name") or "")
    return ""


def signature_from_description(described: Sequence[Mapping[str, Any]]) -> ModelSignature:
    """The outputs a Keras description promises (float, Keras shapes), for checks made before ONNX exists."""
    from pipeline.data.tensors import ModelSignature, TensorSpec

    return ModelSignature((), tuple(TensorSpec(d["name"], np.dtype(np.float32), tuple(-1 if x is None else x for x in d["shape"])) for d in described))


def output_info(signature: ModelSignature, kinds: Mapping[str, OutputKind]) -> dict[str, tuple[tuple, str, int | None]]:
    """Per output: (per-sample shape, kind, classes), what pipeline.accuracy.evaldata.check_targets checks labels against."""
    missing = [o.name for o in signature.outputs if o.name not in kinds]
    if missing:  # a served model whose build recorded kinds for other outputs
        raise PipelineError(f"no output kind recorded for {', '.join(repr(n) for n in missing)} (known: {', '.join(kinds) or 'none'})",
                            "rebuild the model: its build records each output's kind")
    return {o.name: (tuple(o.shape[1:]), kinds[o.name].kind, kinds[o.name].classes) for o in signature.outputs}


def read_description(saved: Path) -> list[dict[str, Any]] | None:
    """The Keras output description stored with a SavedModel the pipeline exported (None for others)."""
    path = Path(saved) / DESCRIPTION_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


# ---- deciding ------------------------------------------------------------------------------------------------


def decide_kinds(
    signature: ModelSignature,
    *,
    described: Sequence[Mapping[str, Any]] | None,
    producers: Mapping[str, str] | None,
    overrides: Mapping[str, str],
    targets: Mapping[str, np.ndarray] | None = None,
) -> dict[str, OutputKind]:
    """Each output's kind (see the module docstring for the order of evidence). ``producers`` maps an
    output to the ONNX op that makes it (:func:`onnx_producers`); ``targets`` are the evaluation labels."""
    check_override_names(overrides, [o.name for o in signature.outputs])
    keras_info = {d["name"]: d for d in described or ()}
    kinds = {}
    for spec in signature.outputs:
        kinds[spec.name] = _decide(spec, keras_info.get(spec.name), (producers or {}).get(spec.name), overrides.get(spec.name),
                                   (targets or {}).get(spec.name))  # fmt: skip
    return kinds


def _decide(spec: TensorSpec, keras: Mapping[str, Any] | None, producer: str | None, override: str | None, target: np.ndarray | None) -> OutputKind:
    last = spec.shape[-1] if len(spec.shape) > 1 else 1
    k = last if isinstance(last, int) and last > 0 else None
    per_position = len(spec.shape) > 2
    activation = (keras or {}).get("activation") or {"Softmax": "softmax", "Sigmoid": "sigmoid"}.get(producer or "")
    logits = activation not in ("softmax", "sigmoid")

    def make(kind: str, why: str) -> OutputKind:
        if kind == "binary" and per_position and override is None:  # one decision per position
            kind = "multilabel"
        return OutputKind(spec.name, kind, why, logits=logits and kind in ("binary", "multilabel"), classes=k if kind in ("classes", "segmentation", "multilabel") else None)

    if override and spec.dtype.kind not in NUMERIC:
        raise PipelineError(f"--output-kind {spec.name}={override}: output '{spec.name}' holds {spec.dtype} values, which no kind can judge",
                            f"drop --output-kind {spec.name}=…; only numeric outputs (float, integer, bool) take a kind")
    if spec.dtype.kind != "f":  # integers and booleans are scores or decisions as they are, never logits
        logits = False
        if not override:
            return OutputKind(spec.name, "regression", f"{spec.dtype} values, compared as numbers")
    if override:
        return make(override, "--output-kind")
    loss = (keras or {}).get("loss")
    key = (loss or "").lower().replace("_", "")
    trained = _LOSS_KINDS.get(key) or _LOSS_KINDS.get(key.removesuffix("loss"))
    if trained:
        kind = _shaped(trained, k, per_position)
        return make(kind, f"trained with {loss}")
    where = f"layer '{keras['layer']}' ({keras['layer_class']})" if keras and keras.get("layer") else (f"ONNX {producer}" if producer else "")
    if activation == "softmax":
        return make("segmentation" if per_position else "classes", f"softmax over {k or '?'} classes, {where}")
    if activation == "sigmoid":
        return make("binary" if k == 1 and not per_position else "multilabel", f"sigmoid, {where}")
    if (keras or {}).get("l2_normalized") or producer == "LpNormalization":
        return make("embedding", f"L2-normalised, {where}")
    if target is not None:
        if target.dtype.kind in "iub" and (k or 0) > 1:
            return make("segmentation" if per_position else "classes", "linear scores with integer labels (class indices)")
        if target.dtype.kind == "f":
            return make("regression", "float labels (targets)")
    return make("regression", f"linear output{', ' + where if where else ''}, no loss or labels saying otherwise")


def _shaped(kind: str, k: int | None, per_position: bool) -> str:
    if kind == "classes" and per_position:
        return "segmentation"
    if kind == "binary" and k != 1:  # K labels, or a width unknown until run (as the sigmoid rule decides)
        return "multilabel"
    return kind


def onnx_producers(model: onnx.ModelProto) -> dict[str, str]:
    """Each graph output's producing op type, looking through reshapes, casts and identities."""
    made_by = {out: node for node in model.graph.node for out in node.output}
    twos = _twos(model.graph)
    producers = {}
    for output in model.graph.output:
        node = made_by.get(output.name)
        while node is not None and node.op_type in _PASS_THROUGH and node.input:
            node = made_by.get(node.input[0])
        if node is not None:
            producers[output.name] = "LpNormalization" if _divides_by_its_norm(node, made_by, twos) else node.op_type
    return producers


def _twos(graph: onnx.GraphProto) -> frozenset[str]:
    """The Pow exponents that hold the constant 2 (an initializer or a Constant node): Pow(x, 2) is a square. Only
    the exponents are read, never the weights (they may be external, and large)."""
    from onnx import TensorProto, numpy_helper

    exponents = {n.input[1] for n in graph.node if n.op_type == "Pow" and len(n.input) == 2}
    tensors = {t.name: t for t in graph.initializer if t.name in exponents}
    tensors |= {n.output[0]: a.t for n in graph.node if n.op_type == "Constant" and n.output[0] in exponents for a in n.attribute if a.name == "value"}
    return frozenset(name for name, t in tensors.items()
                     if math.prod(t.dims) == 1 and t.data_location != TensorProto.EXTERNAL and numpy_helper.to_array(t).item() == 2)


def _divides_by_its_norm(node: onnx.NodeProto, made_by: Mapping[str, onnx.NodeProto], twos: frozenset[str]) -> bool:
    """x · rsqrt(Σx²) or x / sqrt(Σx²): what tf.math.l2_normalize and UnitNormalization become in ONNX."""
    if node.op_type not in ("Mul", "Div"):
        return False
    inputs = [made_by.get(name) for name in node.input]  # None: a graph input or initializer
    for _ in range(4):
        frontier = [n for n in inputs if n is not None]
        if any(n.op_type in ("ReduceSumSquare", "ReduceL2") or (n.op_type == "ReduceSum" and _squares(n, made_by, twos)) for n in frontier):
            return True
        inputs = [made_by.get(name) for n in frontier if n.op_type in ("Rsqrt", "Sqrt", "Reciprocal", "Max", "Min", "Add", "Clip") for name in n.input]
    return False


def _squares(node: onnx.NodeProto, made_by: Mapping[str, onnx.NodeProto], twos: frozenset[str]) -> bool:
    """Whether ``node`` (a ReduceSum) sums squares: Square(x), Mul(x, x) or Pow(x, 2); Pow(x, p) for another p is a p-norm."""
    source = made_by.get(node.input[0]) if node.input else None
    if source is None:
        return False
    return (source.op_type == "Square" or (source.op_type == "Mul" and len(set(source.input)) == 1)
            or (source.op_type == "Pow" and len(source.input) == 2 and source.input[1] in twos))


def kinds_to_json(kinds: Mapping[str, OutputKind]) -> list[dict[str, Any]]:
    """The manifest / report form, in output order."""
    return [k.as_dict() for k in kinds.values()]


def kinds_from_json(data: Sequence[Mapping[str, Any]]) -> dict[str, OutputKind]:
    """Inverse of :func:`kinds_to_json`."""
    return {d["name"]: OutputKind.from_dict(d) for d in data}


def describe_kinds(kinds: Mapping[str, OutputKind]) -> str:
    """The decision for every output on one line: name, kind and why."""
    return "; ".join(f"'{k.name}': {k.kind}{' (logits)' if k.logits else ''} — {k.why}" for k in kinds.values())


def log_kinds(kinds: Mapping[str, OutputKind]) -> None:
    """Say how each output will be judged (shown also when a piped build is quiet)."""
    log.info("outputs: %s (override with --output-kind NAME=KIND)", describe_kinds(kinds))


def primary_classes_output(kinds: Mapping[str, OutputKind]) -> str | None:
    """The output Triton's classification extension labels (``labels.txt``): the first ``classes`` output."""
    return next((k.name for k in kinds.values() if k.kind == "classes"), None)
