"""Keras 2 / tf-keras HDF5 files (``model.h5``): checked, then loaded by Keras 3 where it can, else by tf-keras.

Keras 3 reads the HDF5 files of Sequential and Functional models made of layers it still has
(``keras.saving.load_model`` keeps a legacy HDF5 loader). Files it cannot read (layers Keras 3
dropped, such as the ``TFOpLambda`` layers a Keras 2 functional model gets for every raw
``tf.*`` call) are loaded by tf-keras, the ``keras2`` extra, and exported through TensorFlow.

Safe loading is kept on both paths: a ``Lambda`` layer stores Python bytecode that loading runs.
Keras 3 refuses it in safe mode, but tf-keras loads it from HDF5 whatever ``safe_mode`` says, so
the file's model config is read first (plain JSON, nothing deserialised) and any Lambda refused
unless ``--allow-lambda`` was given. ``TFOpLambda`` names a TensorFlow function, not code: allowed.

Legacy tf-keras SavedModel folders need none of this: they go through as SavedModels (TensorFlow's
graph, no Python deserialised; pipeline/stages/source.py).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.core.errors import PipelineError

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
EXTRA = "keras2"
PROJECT = "keras-trt-pipeline"


def is_hdf5(path: Path) -> bool:
    """True when ``path`` starts with the HDF5 signature (files written by Keras/h5py have no user block)."""
    with path.open("rb") as f:
        return f.read(len(HDF5_MAGIC)) == HDF5_MAGIC


def _attribute(path: Path, name: str) -> Any:
    """A JSON attribute of the HDF5 file's root (Keras 2 stores ``model_config`` and ``training_config`` there), or None."""
    import h5py

    with h5py.File(path, "r") as f:
        value = f.attrs.get(name)
    if value is None:
        return None
    return json.loads(value.decode() if isinstance(value, bytes) else str(value))


def _layers(config: Any) -> Iterator[dict]:
    """Every layer config in a (nested) Keras model config."""
    if isinstance(config, dict):
        if "class_name" in config:
            yield config
        for value in config.values():
            yield from _layers(value)
    elif isinstance(config, list):
        for value in config:
            yield from _layers(value)


def checked_hdf5(path: Path, spec: str, allow_lambda: bool) -> None:
    """Refuse an HDF5 file that holds no model (weights only) or, without ``allow_lambda``, a Lambda layer."""
    try:
        config = _attribute(path, "model_config")
    except (OSError, ValueError) as exc:
        raise PipelineError(f"cannot read HDF5 file '{spec}': {exc}", "save the model again with model.save('name.keras')") from None
    if config is None:
        raise PipelineError(f"'{spec}' holds weights only, no model (written by save_weights)",
                            "save the whole model with model.save('name.h5'), or better model.save('name.keras')")
    lambdas = [str(layer.get("config", {}).get("name", "?")) for layer in _layers(config) if layer.get("class_name") == "Lambda"]
    if lambdas and not allow_lambda:
        raise PipelineError(
            f"'{spec}' has Lambda layer(s) {', '.join(lambdas)}, whose Python code loading would run",
            "pass --allow-lambda only if you trust where the file comes from, or replace the Lambda layers with registered custom layers",
        )


def compile_config_of_hdf5(path: Path) -> dict[str, Any] | None:
    """The training config a Keras 2 HDF5 file stores (its ``loss`` is what output kinds read)."""
    try:
        return _attribute(path, "training_config") or None
    except (OSError, ValueError):
        return None


def _requirement() -> str:
    """The tf-keras requirement of the ``keras2`` extra, from this project's installed metadata (pyproject.toml)."""
    try:
        requires = importlib.metadata.requires(PROJECT) or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    return next((r.split(";")[0].strip() for r in requires if f'extra == "{EXTRA}"' in r), "tf-keras")


def model_from_hdf5(path: Path, spec: str, allow_lambda: bool, cause: Callable[[Exception], str]) -> Any:
    """The model in a checked HDF5 file: Keras 3's, else tf-keras's (a ``tf_keras.Model``); ``cause``
    makes an exception one line."""
    import keras

    try:
        return keras.saving.load_model(path, compile=False, safe_mode=not allow_lambda)
    except Exception as exc:  # Keras raises many types for configs it cannot rebuild
        keras3_error = cause(exc)
    try:
        import tf_keras
    except ImportError:
        raise PipelineError(
            f"Keras 3 cannot load the Keras 2 file '{spec}' ({keras3_error}); it needs tf-keras (the '{EXTRA}' extra), which is not installed",
            f"pip install --no-deps '{_requirement()}' (without --no-deps pip would add the 'tensorflow' wheel over tensorflow-cpu)",
        ) from None
    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as exc:
        raise PipelineError(f"cannot load Keras 2 model '{spec}': Keras 3: {keras3_error}; tf-keras: {cause(exc)}",
                            "pass --import MODULE naming the module that registers its custom layers, or save it again with tf-keras") from None


def is_tf_keras(model: Any) -> bool:
    """True for a tf-keras (Keras 2) model."""
    return type(model).__module__.startswith("tf_keras.")


def savedmodel_from_tf_keras(model: Any, dst: Path, outputs: list[str], inputs: list[str]) -> Path:
    """Export a tf-keras model to a SavedModel at ``dst.partial`` (renamed by the caller) with the
    ``serving_default`` signature keyed by ``inputs`` and ``outputs``, batch axis dynamic."""
    import tensorflow as tf

    from pipeline.data.tensors import SIGNATURE

    specs = [tf.TensorSpec((None, *t.shape[1:]), t.dtype, name=n) for t, n in zip(model.inputs, inputs)]

    @tf.function(input_signature=specs)
    def serve(*args: Any) -> dict[str, Any]:
        result = model(args[0] if len(args) == 1 else list(args), training=False)
        flat = result if isinstance(result, (list, tuple)) else [result]
        return dict(zip(outputs, flat))

    tf.saved_model.save(model, str(dst), signatures={SIGNATURE: serve})
    return dst
