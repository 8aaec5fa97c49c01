"""Where a model comes from (pipeline/stages/source.py): parsing --model without loading, fingerprints, loading.

Parsing and fingerprints import nothing heavy; the loading tests build tiny Keras models (slow: Keras imports TensorFlow).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.stages.source import DEFAULT_MODEL, ModelSource, keras_model_from_source, model_source


def keras_archive(path: Path, content: bytes = b"{}") -> Path:
    """A zip named .keras (enough for parsing, which never loads it)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", content)
    return path


def _weights_only_h5(path: Path) -> Path:
    """An HDF5 file as save_weights writes it: layer groups, no model_config attribute."""
    import h5py

    with h5py.File(path, "w") as f:
        f.create_group("dense").create_dataset("kernel", data=[[1.0]])
    return path


def test_keras_file(tmp_path: Path) -> None:
    path = keras_archive(tmp_path / "clf.keras")
    assert model_source(str(path)) == ModelSource(str(path), "keras", path)


def test_savedmodel_folder(tmp_path: Path) -> None:
    (tmp_path / "sm").mkdir()
    (tmp_path / "sm" / "saved_model.pb").write_bytes(b"")
    assert model_source(str(tmp_path / "sm")) == ModelSource(str(tmp_path / "sm"), "savedmodel", tmp_path / "sm")


def test_module_function() -> None:
    assert model_source("tests.keras_models:sequential") == ModelSource("tests.keras_models:sequential", "function", None)
    assert model_source(DEFAULT_MODEL).kind == "function"


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda d: d / "missing.keras", "model file '{spec}' does not exist"),
        (lambda d: (d / "model.pt").write_bytes(b"x") and d / "model.pt", "'{spec}' is not a Keras model file (expected a .keras or Keras 2 .h5 file"),
        (lambda d: (d / "model.h5").write_bytes(b"x") and d / "model.h5", "'{spec}' is not an HDF5 file"),
        (lambda d: _weights_only_h5(d / "weights.h5"), "'{spec}' holds weights only, no model (written by save_weights)"),
        (lambda d: (d / "bad.keras").write_bytes(b"truncated") and d / "bad.keras", "'{spec}' is not a valid .keras archive"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "folder '{spec}' is not a SavedModel (no saved_model.pb in it)"),
        (lambda d: "no_such_module_xyz:make", "cannot import module 'no_such_module_xyz' named in --model {spec}"),
        (lambda d: "no_such_package_xyz.sub:make", "cannot import module 'no_such_package_xyz.sub'"),
        (lambda d: "tests.keras_models:not-an-identifier", "model '{spec}' does not exist"),
        (lambda d: d / "nothing_here", "model '{spec}' does not exist"),
    ],
    ids=["missing-keras", "not-keras", "not-hdf5", "weights-only-h5", "corrupt-keras", "folder-without-pb", "no-module", "no-package", "bad-function", "nothing"],
)
def test_bad_model_specs_are_user_errors(tmp_path: Path, make, problem: str) -> None:  # type: ignore[no-untyped-def]
    spec = str(make(tmp_path))
    with pytest.raises(PipelineError, match="^" + re.escape(problem.format(spec=spec))):
        model_source(spec)


def test_fingerprint_follows_the_file_content(tmp_path: Path) -> None:
    path = keras_archive(tmp_path / "clf.keras", b'{"a": 1}')
    first = model_source(str(path)).fingerprint()
    assert model_source(str(path)).fingerprint() == first  # stable
    keras_archive(path, b'{"a": 2}')
    assert model_source(str(path)).fingerprint() != first


def test_fingerprint_of_a_function_follows_its_module_source(tmp_path: Path) -> None:
    package = tmp_path / "fp_pkg_source_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text("def make():\n    return 1\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        source = model_source("fp_pkg_source_test.models:make")
        first = source.fingerprint()
        assert first.endswith(":make") and source.fingerprint() == first
        assert model_source("fp_pkg_source_test.models:other").fingerprint() != first  # another function
        (package / "models.py").write_text("def make():\n    return 2\n")
        assert source.fingerprint() != first
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("fp_pkg_source_test")]:
            del sys.modules[name]


# -- loading (Keras) ------------------------------------------------------------------------------


@pytest.mark.slow
def test_loads_a_keras_file_and_builds_from_a_function(tmp_path: Path) -> None:
    from tests.keras_models import sequential

    path = tmp_path / "seq.keras"
    sequential().save(path)
    loaded = keras_model_from_source(model_source(str(path)))
    assert [t.shape[1:] for t in loaded.inputs] == [(5,)] and loaded.outputs[0].shape[1:] == (2,)
    built = keras_model_from_source(model_source("tests.keras_models:multi_io"))
    assert sorted(t.name for t in built.inputs) == ["image", "meta"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("tests.keras_models:not_a_model", "'tests.keras_models:not_a_model' gave a str, not a Keras model"),
        ("tests.keras_models:__doc__", "'tests.keras_models:__doc__' is not a function"),
    ],
)
def test_functions_that_give_no_model_are_user_errors(spec: str, problem: str) -> None:
    with pytest.raises(PipelineError, match="^" + re.escape(problem)):
        keras_model_from_source(model_source(spec))


@pytest.mark.slow
def test_a_keras_archive_that_does_not_load_is_a_user_error(tmp_path: Path) -> None:
    path = keras_archive(tmp_path / "broken.keras", b"not json")
    with pytest.raises(PipelineError, match=f"^cannot load Keras model '{re.escape(str(path))}': "):
        keras_model_from_source(model_source(str(path)))


@pytest.mark.slow
def test_a_savedmodel_is_not_loaded_as_keras(tmp_path: Path) -> None:
    source = ModelSource(str(tmp_path), "savedmodel", tmp_path)
    with pytest.raises(PipelineError, match="is a SavedModel, not a Keras model"):
        keras_model_from_source(source)
