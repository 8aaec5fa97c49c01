"""Where the model comes from: a `.keras` file, a Keras 2 `.h5` file, a SavedModel folder, or `module:function`.

The source is fingerprinted *before* anything is loaded, so an unchanged rebuild never has to
load (or, for the bundled model, train) the Keras model at all.
"""

from __future__ import annotations

import importlib
import importlib.util
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.errors import PipelineError
from pipeline.core.fingerprint import hash_path
from pipeline.core.lazy import import_optional

if TYPE_CHECKING:
    import keras

DEFAULT_MODEL = "pipeline.models.digits:trained_model"
HDF5_SUFFIXES = (".h5", ".hdf5")  # Keras 2 / tf-keras model.save('name.h5')


@dataclass(frozen=True)
class ModelSource:
    """A parsed ``--model`` value. ``kind`` is ``keras``, ``h5``, ``savedmodel`` or ``function``."""

    spec: str
    kind: str
    path: Path | None = None
    imports: tuple[str, ...] = ()  # modules that register custom objects, imported before loading
    allow_lambda: bool = False  # load Lambda layers' stored Python code (Keras safe_mode off)

    def fingerprint(self) -> str:
        """A hash of what the model is made from: the file, the folder, or the function's module source,
        and the source of the modules imported before loading it."""
        imported = ",".join(_module_hash(m) for m in self.imports)
        if self.path is not None:
            return hash_path(self.path) + (f"+{imported}" if imported else "")
        module_name, _, func = self.spec.partition(":")
        return f"{_module_hash(module_name)}:{func}" + (f"+{imported}" if imported else "")


def _module_hash(module_name: str) -> str:
    spec = importlib.util.find_spec(module_name)
    origin = Path(spec.origin) if spec and spec.origin and Path(spec.origin).is_file() else None
    return hash_path(origin) if origin else module_name


def _checked_imports(imports: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(n.strip() for item in imports for n in item.split(",") if n.strip())
    for name in names:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise PipelineError(f"cannot find module '{name}' named in --import", "check the module name and that its folder is on PYTHONPATH "
                                                                                  "(or run from the folder that holds it)")
    return names


def model_source(spec: str, imports: tuple[str, ...] = (), allow_lambda: bool = False) -> ModelSource:
    """Parse and check a ``--model`` value (and the ``--import`` modules) without loading anything heavy;
    an HDF5 file's model config is checked for Lambda layers here (refused without ``allow_lambda``)."""
    source = _model_source(spec)
    if source.kind == "h5" and source.path is not None:
        from pipeline.stages.keras2 import checked_hdf5

        checked_hdf5(source.path, spec, allow_lambda)
    return ModelSource(source.spec, source.kind, source.path, _checked_imports(imports) if imports else (), allow_lambda)


def _model_source(spec: str) -> ModelSource:
    path = Path(spec)
    if path.suffix in (".keras", *HDF5_SUFFIXES) or path.is_file():
        if not path.exists():
            raise PipelineError(f"model file '{spec}' does not exist", "check the path given to --model")
        if path.suffix in HDF5_SUFFIXES:
            from pipeline.stages.keras2 import is_hdf5

            if not is_hdf5(path):
                raise PipelineError(f"'{spec}' is not an HDF5 file (corrupt, truncated, or another format named .h5)",
                                    "save the model again with model.save('name.keras')")
            return ModelSource(spec, "h5", path)
        if path.suffix != ".keras":
            raise PipelineError(
                f"'{spec}' is not a Keras model file (expected a .keras or Keras 2 .h5 file, a SavedModel folder or module:function)",
                "save the model with model.save('name.keras') and pass that file to --model",
            )
        if not zipfile.is_zipfile(path):
            raise PipelineError(
                f"'{spec}' is not a valid .keras archive (corrupt or truncated file)",
                "save the model again with model.save('name.keras')",
            )
        return ModelSource(spec, "keras", path)
    if path.is_dir():
        if not (path / "saved_model.pb").exists():
            raise PipelineError(
                f"folder '{spec}' is not a SavedModel (no saved_model.pb in it)",
                "pass a folder written by model.export(...) or tf.saved_model.save(...)",
            )
        return ModelSource(spec, "savedmodel", path)
    module_name, sep, func = spec.partition(":")
    if sep and module_name and func.isidentifier():
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):  # a parent package is missing
            found = None
        if found is None:
            raise PipelineError(f"cannot import module '{module_name}' named in --model {spec}", "check the module path and PYTHONPATH")
        return ModelSource(spec, "function", None)
    raise PipelineError(
        f"model '{spec}' does not exist",
        "pass a .keras file, a SavedModel folder, or module:function returning a Keras model",
    )


def _cause(exc: Exception) -> str:
    """An exception's message on one line, whole, less the object configs Keras appends."""
    text = str(exc).rsplit("Exception encountered:", 1)[-1]  # Keras wraps the cause in the outer layer's config
    text = " ".join(text.split("Full object config")[0].split("Config:")[0].split())
    return text.rstrip(" .:") or type(exc).__name__


def keras_model_from_source(source: ModelSource) -> "keras.Model":
    """Load (safe mode unless ``allow_lambda``) or build the Keras model a source names; a Keras 2 file
    only tf-keras reads gives a ``tf_keras.Model``."""
    keras = import_optional("keras", "cpu", "Loading the Keras model")  # Keras needs its TensorFlow backend

    for module in source.imports:
        try:
            importlib.import_module(module)
        except Exception as exc:  # the user's module may raise anything while importing
            raise PipelineError(f"importing '{module}' (--import) failed: {type(exc).__name__}: {_cause(exc)}", "fix that module, or check PYTHONPATH") from None
    if source.kind == "h5":
        from pipeline.stages.keras2 import is_tf_keras, model_from_hdf5

        model = model_from_hdf5(source.path, source.spec, source.allow_lambda, _cause)  # type: ignore[arg-type]
        if is_tf_keras(model):
            return model  # a tf_keras.Model: Keras 2's API, exported by pipeline/stages/keras2.py
    elif source.kind == "keras":
        try:
            model = keras.models.load_model(source.path, compile=False, safe_mode=not source.allow_lambda)
        except Exception as exc:  # Keras raises many types for bad archives
            custom = "Could not locate" in str(exc) or "Unknown layer" in str(exc) or "custom" in str(exc).lower()
            if "safe_mode" in str(exc):
                fix = "pass --allow-lambda only if you trust where the file comes from, or replace the Lambda layers with registered custom layers"
            elif custom:
                fix = "pass --import MODULE naming the module that registers its custom layers (@keras.saving.register_keras_serializable)"
            else:
                fix = "save the model again with model.save('name.keras')"
            raise PipelineError(f"cannot load Keras model '{source.spec}': {_cause(exc)}", fix) from None
    elif source.kind == "function":
        module_name, _, func = source.spec.partition(":")
        factory = getattr(importlib.import_module(module_name), func, None)
        if not callable(factory):
            raise PipelineError(f"'{source.spec}' is not a function", "name a function that returns a Keras model")
        model = factory()
    else:
        raise PipelineError(f"'{source.spec}' is a SavedModel, not a Keras model", "this is a bug: SavedModels skip the export stage")
    if not isinstance(model, keras.Model):
        raise PipelineError(
            f"'{source.spec}' gave a {type(model).__name__}, not a Keras model",
            "pass a .keras file or a function returning keras.Model",
        )
    if not getattr(model, "inputs", None):
        raise PipelineError(
            f"Keras model from '{source.spec}' has no defined inputs",
            "build it with keras.Input(...) (functional) or a Sequential starting with keras.Input",
        )
    return model
