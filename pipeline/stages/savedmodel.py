"""Keras model → SavedModel with a named serving signature (inputs and outputs keep Keras names)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.lazy import import_tensorflow
from pipeline.data.tensors import SIGNATURE

if TYPE_CHECKING:
    import keras

    from pipeline.stages.source import ModelSource



def output_names(model: "keras.Model") -> list[str]:
    """Unique names for the model's outputs, from Keras (duplicates get ``_1``, ``_2``…)."""
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != len(model.outputs):
        names = [model.layers[-1].name] if len(model.outputs) == 1 else [f"output_{i}" for i in range(len(model.outputs))]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}_{count}")
    return unique


def input_names(model: "keras.Model") -> list[str]:
    """The names the exported inputs get: the tensor's name, or the Input layer's name when Keras
    generated the tensor name (``keras_tensor_12`` from ``keras.Input`` without ``name=``)."""
    names = []
    for tensor in model.inputs:
        name = tensor.name
        if name.startswith("keras_tensor"):
            # Keras 3 has no public accessor for the layer that made a symbolic input.
            history = getattr(tensor, "_keras_history", None)
            name = getattr(getattr(history, "operation", None), "name", None) or name
        names.append(name)
    return names


def savedmodel_from_keras(model: "keras.Model", dst: Path, compile_config: dict[str, Any] | None = None) -> Path:
    """Export ``model`` to a SavedModel at ``dst`` whose ``serving_default`` signature names every
    input after its Keras input and every output after its Keras output layer, batch axis dynamic.
    Beside it, ``assets.extra/pipeline_outputs.json`` describes the outputs in Keras order
    (pipeline.accuracy.outputkinds), with the losses of ``compile_config`` where the model was compiled. A
    tf-keras model (a Keras 2 file only tf-keras reads) is exported through TensorFlow (stages/keras2.py)."""
    import keras

    from pipeline.accuracy.outputkinds import DESCRIPTION_FILE, describe_keras_outputs
    from pipeline.stages.keras2 import is_tf_keras, savedmodel_from_tf_keras

    tf = import_tensorflow("Exporting the Keras model to a SavedModel")

    feed_names = [t.name for t in model.inputs]  # what the model's call matches a dict against
    outputs = output_names(model)
    specs = [tf.TensorSpec((None, *t.shape[1:]), t.dtype, name=n) for t, n in zip(model.inputs, input_names(model))]

    def serve(*args: Any) -> dict[str, Any]:
        feed = args[0] if len(args) == 1 else dict(zip(feed_names, args))
        result = model(feed, training=False)
        if isinstance(result, dict):
            return {name: result[name] for name in result}
        flat = result if isinstance(result, (list, tuple)) else [result]
        return dict(zip(outputs, flat))

    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if is_tf_keras(model):
            savedmodel_from_tf_keras(model, tmp, outputs, input_names(model))
        else:
            archive = keras.export.ExportArchive()
            # Tracked through a plain trackable, not as a Layer: Keras 3 (3.15) writes a tracked layer's variables a
            # second time beside the ones the endpoint captures (a 2 GB model became a 4 GB SavedModel). The walk
            # still finds the lookup tables and other resources its layers own.
            archive.track(tf.train.Checkpoint(model=model))
            archive.add_endpoint(SIGNATURE, serve, input_signature=specs)
            archive.write_out(str(tmp), verbose=False)
    except Exception as exc:  # TF raises a zoo of types when tracing fails
        shutil.rmtree(tmp, ignore_errors=True)
        raise PipelineError(
            f"cannot export the Keras model to a SavedModel: {str(exc).splitlines()[0][:200]}",
            "check that the model runs on a batch of its inputs (model(x)) and uses serialisable layers",
        ) from None
    description = tmp / DESCRIPTION_FILE
    description.parent.mkdir(parents=True, exist_ok=True)
    description.write_text(json.dumps(describe_keras_outputs(model, outputs, compile_config), indent=2) + "\n")
    (tmp / SCALING_FILE).write_text(json.dumps(input_scaling_layers(model), indent=2) + "\n")
    from pipeline.stages.tokenizer_export import export_model_tokenizer

    export_model_tokenizer(model, tmp, input_names(model))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


SCALING_FILE = "assets.extra/pipeline_input_scaling.json"  # which inputs the model scales itself (build --raw-inputs)
_SCALING_LAYERS = ("Rescaling", "Normalization")


def input_scaling_layers(model: Any) -> dict[str, str]:
    """Per model input that feeds a ``Rescaling`` (of 1/255 or 1/127.5, one or per channel) or a ``Normalization``
    layer straight away, that layer in words (``Rescaling layer 'rescale' (x · 0.00392157 + 0)``): such a model
    takes raw 0..255 pixels."""
    found = {}
    for tensor, name in zip(model.inputs, input_names(model)):
        for layer in model.layers:
            if type(layer).__name__ not in _SCALING_LAYERS:
                continue
            inbound = [getattr(t, "name", None) for node in getattr(layer, "_inbound_nodes", []) for t in node.input_tensors]
            if tensor.name not in inbound:
                continue
            if type(layer).__name__ == "Rescaling":
                scale = np.asarray(layer.scale, dtype=np.float64).ravel()
                offset = np.asarray(layer.offset, dtype=np.float64).ravel()
                # Only a Rescaling that maps 0..255 to 0..1 or -1..1 says the model takes raw pixels; another (x·2 - 1,
                # say) expects input already scaled, and --preprocess decides.
                if not any(np.allclose(scale, s, rtol=1e-3) for s in (1 / 255, 1 / 127.5)):
                    continue
                detail = f" (x · {_numbers(scale)} + {_numbers(offset)})"
            else:
                detail = ""
            found[name] = f"{type(layer).__name__} layer '{layer.name}'{detail}"
    return found


def _numbers(values: Any) -> str:
    return " ".join(f"{v:g}" for v in values) if len(values) != 1 else f"{values[0]:g}"


def read_input_scaling(saved: Path) -> dict[str, str]:
    """What :func:`input_scaling_layers` found, as the savedmodel stage recorded it ({} for other SavedModels)."""
    path = Path(saved) / SCALING_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def savedmodel_from_source(source: "ModelSource", dst: Path) -> Path:
    """Load the model ``source`` names (a .keras file or module:function) and export it to ``dst``, in a
    child process: TensorFlow and the Keras model leave with it, so the build does not hold them while
    tf2onnx converts (pipeline/core/isolate.py)."""
    from pipeline.core.isolate import call_in_child

    return call_in_child(_export_source, source, dst)


def _deterministic() -> None:
    """Seed Python, NumPy and TensorFlow (seed 0, unless the function seeds them itself) and make TensorFlow's ops
    deterministic, in the export's child process only."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()


def _export_source(source: "ModelSource", dst: Path) -> Path:
    from pipeline.core.pausepoints import pause_point

    pause_point("savedmodel.export")
    from pipeline.accuracy.outputkinds import compile_config_of_archive, compile_config_of_model
    from pipeline.stages.source import keras_model_from_source

    if source.kind == "function":
        _deterministic()  # a function that trains its model trains the same weights build after build
    model = keras_model_from_source(source)
    if source.kind == "h5":
        from pipeline.stages.keras2 import compile_config_of_hdf5

        compiled = compile_config_of_hdf5(source.path)  # type: ignore[arg-type]
    else:
        compiled = compile_config_of_archive(source.path) if source.path is not None else compile_config_of_model(model)
    return savedmodel_from_keras(model, dst, compiled)
