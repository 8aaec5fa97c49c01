"""Keras → SavedModel (stages/savedmodel.py) → ONNX (stages/onnx_export.py) → parity gate (stages/parity.py).

Stage by stage on tiny Keras models built here (tests/keras_models.py): real TensorFlow, real
tf2onnx, real ONNX Runtime; the SavedModel runner of pipeline/backend/runners.py runs TensorFlow for parity.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pipeline.accuracy.evaldata import synthetic_eval_data
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import SIGNATURE, signature_from_onnx
from pipeline.stages.onnx_export import MIN_OPSET, onnx_from_savedmodel, tf2onnx_command
from pipeline.stages.parity import parity_report_from_models
from pipeline.stages.savedmodel import input_names, output_names, savedmodel_from_keras

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def multi_io(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tests.keras_models.multi_io (inputs image, meta; outputs cls, reg) as a SavedModel and its ONNX."""
    from tests.keras_models import multi_io as make

    root = tmp_path_factory.mktemp("multi_io")
    saved = savedmodel_from_keras(make(), root / "savedmodel")
    return saved, onnx_from_savedmodel(saved, root / "model.onnx", MIN_OPSET)


def dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


# -- SavedModel ------------------------------------------------------------------------------------


def test_savedmodel_signature_keeps_keras_names_and_outputs(multi_io: tuple[Path, Path]) -> None:
    import tensorflow as tf

    from tests.keras_models import multi_io as make

    saved, _ = multi_io
    serve = tf.saved_model.load(str(saved)).signatures[SIGNATURE]
    inputs = serve.structured_input_signature[1]
    assert {name: spec.shape.as_list() for name, spec in inputs.items()} == {"image": [None, 6, 6, 2], "meta": [None, 3]}
    rng = np.random.default_rng(0)
    feed = {"image": rng.random((3, 6, 6, 2), dtype=np.float32), "meta": rng.random((3, 3), dtype=np.float32)}
    got = {k: v.numpy() for k, v in serve(**{k: tf.constant(v) for k, v in feed.items()}).items()}
    assert set(got) == {"cls", "reg"}
    cls, reg = make()(feed, training=False)  # the same seeded weights
    np.testing.assert_allclose(got["cls"], cls, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["reg"], reg, rtol=0, atol=1e-6)
    assert not saved.with_name(saved.name + ".partial").exists()


def test_names_of_unnamed_inputs_and_sequential_outputs() -> None:
    import keras

    from tests.keras_models import sequential

    model = sequential()  # Sequential: outputs named after the last layer
    assert input_names(model) == ["features"] and output_names(model) == [model.layers[-1].name]
    x = keras.Input((3,))  # no name: Keras calls the tensor keras_tensor_N; the export uses the Input layer's name
    unnamed = keras.Model(x, keras.layers.Dense(2, name="a")(x))
    [name] = input_names(unnamed)
    assert not name.startswith("keras_tensor") and name.startswith("input_layer")


def test_savedmodel_export_replaces_an_older_export(tmp_path: Path) -> None:
    from tests.keras_models import sequential

    dst = tmp_path / "savedmodel"
    dst.mkdir()
    (dst / "stale.txt").write_text("from an older export")
    assert savedmodel_from_keras(sequential(), dst) == dst
    assert (dst / "saved_model.pb").is_file() and not (dst / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["savedmodel"]  # no .partial left beside it


def test_savedmodel_holds_each_weight_once_and_the_resources_its_layers_own(tmp_path: Path) -> None:
    """Keras 3 writes a layer tracked as a Layer twice (its variables beside the ones the endpoint captures); the
    export tracks it as a plain trackable: the weights once, and a lookup table a custom layer owns still saved."""
    import keras
    import tensorflow as tf

    class Lookup(keras.layers.Layer):
        def __init__(self, **kwargs: object) -> None:
            super().__init__(**kwargs)
            keys, values = tf.constant([1, 2, 3], tf.int64), tf.constant([10.0, 20.0, 30.0])
            self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=0.0)

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.table.lookup(tf.cast(x, tf.int64))

    ids = keras.Input((4,), dtype="int32", name="ids")
    table = keras.layers.Embedding(4096, 256, name="items")  # 4 MiB: nearly all of the weights
    pooled = keras.layers.GlobalAveragePooling1D()(table(ids))
    looked = Lookup()(ids)
    model = keras.Model(ids, keras.layers.Dense(2, name="out")(keras.layers.Concatenate()([pooled, looked])))
    saved = savedmodel_from_keras(model, tmp_path / "savedmodel")
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    stored = sum(p.stat().st_size for p in (saved / "variables").glob("variables.data-*"))
    assert weights <= stored < 1.05 * weights
    serve = tf.saved_model.load(str(saved)).signatures[SIGNATURE]
    feed = np.array([[1, 2, 3, 9]], np.int32)
    np.testing.assert_allclose(serve(ids=tf.constant(feed))["out"].numpy(), model(feed), rtol=0, atol=1e-6)

# -- ONNX export ------------------------------------------------------------------------------------


def test_onnx_has_keras_names_and_named_dynamic_axes(multi_io: tuple[Path, Path]) -> None:
    _, onnx_path = multi_io
    model = onnx.load(str(onnx_path))
    onnx.checker.check_model(model, full_check=True)
    assert {i.name: dims(i) for i in model.graph.input} == {"image": ["batch", 6, 6, 2], "meta": ["batch", 3]}
    assert {o.name: dims(o) for o in model.graph.output} == {"cls": ["batch", 3], "reg": ["batch", 1]}
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= MIN_OPSET
    assert not onnx_path.with_name(onnx_path.name + ".partial").exists()


def test_dynamic_non_batch_axes_are_named_after_their_tensor(tmp_path: Path) -> None:
    from tests.keras_models import tokens

    saved = savedmodel_from_keras(tokens(), tmp_path / "savedmodel")
    model = onnx.load(str(onnx_from_savedmodel(saved, tmp_path / "model.onnx", MIN_OPSET)))
    assert [(i.name, dims(i)) for i in model.graph.input] == [("tokens", ["batch", "tokens_dim1"])]


def test_tf2onnx_command_is_the_one_to_reproduce(tmp_path: Path) -> None:
    cmd = tf2onnx_command(tmp_path / "sm", tmp_path / "m.onnx", 18)
    assert cmd[1:3] == ["-m", "pipeline.stages.tf2onnx_run"]
    assert cmd[3:] == ["--saved-model", str(tmp_path / "sm"), "--signature_def", SIGNATURE, "--opset", "18", "--output", str(tmp_path / "m.onnx")]


def _canonical(path: Path) -> tuple:
    """An ONNX model without the names tf2onnx makes up and the order of independent nodes (both follow
    dict/set order and vary between runs of ``python -m tf2onnx.convert`` itself): its graph inputs
    and outputs, every node's op and attributes, and every weight."""
    model = onnx.load(str(path))
    graph = model.graph
    nodes = sorted((n.op_type, n.domain, sorted(str(a) for a in n.attribute), len(n.input)) for n in graph.node)
    weights = sorted((i.data_type, tuple(i.dims), numpy_helper.to_array(i).tobytes()) for i in graph.initializer)
    return model.opset_import, [str(i) for i in graph.input], [str(o) for o in graph.output], nodes, weights


@pytest.mark.parametrize("model", ["multi_io", "tokens"])
def test_driver_converts_as_tf2onnx_convert_does(model: str, tmp_path: Path) -> None:
    """The memory-frugal driver (pipeline/stages/tf2onnx_run.py) runs tf2onnx's phases with tf2onnx's arguments:
    the same nodes, attributes and weights as ``python -m tf2onnx.convert`` (ResNet50: the same bytes)."""
    import subprocess
    import sys

    import tests.keras_models as models

    saved = savedmodel_from_keras(getattr(models, model)(), tmp_path / "savedmodel")
    ours = tf2onnx_command(saved, tmp_path / "ours.onnx", MIN_OPSET)
    theirs = [sys.executable, "-m", "tf2onnx.convert", *ours[3:-1], str(tmp_path / "theirs.onnx")]
    for cmd in (ours, theirs):
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    assert _canonical(tmp_path / "ours.onnx") == _canonical(tmp_path / "theirs.onnx")


def test_driver_hands_lookup_tables_to_tf2onnx_loader(tmp_path: Path) -> None:
    """A signature that captures a lookup table goes through tf2onnx's own loader, which restores the table."""
    import subprocess
    import sys

    import tensorflow as tf

    class Vocabulary(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            init = tf.lookup.KeyValueTensorInitializer(["cat", "dog", "emu"], [3, 5, 7], key_dtype=tf.string, value_dtype=tf.int64)
            self.table = tf.lookup.StaticHashTable(init, default_value=-1)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words")])
        def serve(self, words: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"ids": self.table.lookup(words)}

    module = Vocabulary()
    tf.saved_model.save(module, str(tmp_path / "savedmodel"), signatures={SIGNATURE: module.serve})
    ours = tf2onnx_command(tmp_path / "savedmodel", tmp_path / "ours.onnx", MIN_OPSET)
    theirs = [sys.executable, "-m", "tf2onnx.convert", *ours[3:-1], str(tmp_path / "theirs.onnx")]
    for cmd in (ours, theirs):
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    import onnxruntime as ort

    for path in (tmp_path / "ours.onnx", tmp_path / "theirs.onnx"):  # the table's export order varies: compare what it maps
        model = onnx.load(str(path))
        assert [n.op_type for n in model.graph.node] == ["CategoryMapper"]
        ids = ort.InferenceSession(str(path)).run(None, {"words": np.array(["dog", "yak", "cat", "emu"], dtype=object)})[0]
        assert ids.tolist() == [5, -1, 3, 7]


def test_too_old_opset_is_refused_before_converting(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=re.escape(f"--opset {MIN_OPSET - 1} is too old — use --opset {MIN_OPSET} or newer")):
        onnx_from_savedmodel(tmp_path / "not-even-there", tmp_path / "m.onnx", MIN_OPSET - 1)


def test_unsupported_tensorflow_op_is_named_with_the_opset_that_would_have_it(tmp_path: Path) -> None:
    from tests.keras_models import unsupported_op

    saved = savedmodel_from_keras(unsupported_op(), tmp_path / "savedmodel")
    with pytest.raises(PipelineError, match=f"^tf2onnx cannot convert TensorFlow op\\(s\\) Igamma \\(no tf2onnx handler at any opset up to 18\\) "
                                            f"to ONNX opset {MIN_OPSET} — replace those layers .* or add a handler for them to pipeline/stages/tf_ops.py$"):
        onnx_from_savedmodel(saved, tmp_path / "m.onnx", MIN_OPSET)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["savedmodel"]  # nothing half-written


def test_an_op_a_newer_opset_converts_is_named_with_that_opset() -> None:
    """The driver's line for an op whose handler starts at a newer opset (none such between opsets 17
    and 18 in tf2onnx 1.17, so the line is written here as the driver writes it)."""
    from pipeline.stages.onnx_export import unsupported_error, unsupported_ops
    from pipeline.stages.tf2onnx_run import UNSUPPORTED_MARK

    stderr = "noise\n2026-12-02 ERROR " + UNSUPPORTED_MARK + json.dumps({"newest_opset": 18, "ops": {"Foo": 18, "Bar": None}}) + "\nmore noise"
    error = unsupported_error(unsupported_ops(stderr), 17)
    assert str(error).startswith("tf2onnx cannot convert TensorFlow op(s) Foo (needs opset 18), Bar (no tf2onnx handler at any opset up to 18) to ONNX opset 17")
    assert "(and pass --opset 18)" in str(error)
    assert str(unsupported_error({"newest_opset": 18, "ops": {"Foo": 18}}, 17)).endswith("pass --opset 18")
    assert unsupported_ops("no such line") == {}


def test_lowest_opsets_come_from_tf2onnx_registry() -> None:
    from pipeline.stages.tf_ops import NEWEST_OPSET, lowest_opsets

    found = lowest_opsets(["Erfc", "Erf", "Igamma", "MatMul"])
    assert found["Erfc"] == 9  # ours: ONNX Erf is opset 9
    assert found["Igamma"] is None and found["MatMul"] is not None and found["MatMul"] <= 9
    assert NEWEST_OPSET == 18


def test_exact_gelu_converts_through_erf_and_matches_tensorflow(tmp_path: Path) -> None:
    """``activation="gelu"`` (exact: Erfc in TensorFlow) converts, as Sub(1, Erf), and the ONNX model
    matches TensorFlow on data spanning GELU's whole range (inputs scaled so pre-activations reach ±10)."""
    from tests.keras_models import exact_gelu

    saved = savedmodel_from_keras(exact_gelu(), tmp_path / "savedmodel")
    onnx_path = onnx_from_savedmodel(saved, tmp_path / "model.onnx", MIN_OPSET)
    ops = [n.op_type for n in onnx.load(str(onnx_path)).graph.node]
    assert ops.count("Erf") == 2 and "Erfc" not in ops
    rng = np.random.default_rng(4)
    features = (rng.normal(size=(256, 6)) * 8).astype(np.float32)
    np.savez(tmp_path / "eval.npz", features=features)
    from pipeline.accuracy.evaldata import eval_data_from_npz

    data = eval_data_from_npz(tmp_path / "eval.npz", signature_from_onnx(onnx_path))
    report = json.loads(parity_report_from_models(saved, onnx_path, data, tmp_path / "parity.json", atol=1e-5, rtol=1e-4, batch_size=64).read_text())
    assert report["passed"] and report["samples"] == 256, report


def test_tf2onnx_failure_names_the_command_to_rerun(tmp_path: Path) -> None:
    (tmp_path / "not_a_savedmodel").mkdir()
    with pytest.raises(PipelineError, match=r"^tf2onnx failed: .* — run it by hand to see the full log: .*pipeline\.stages\.tf2onnx_run --saved-model"):
        onnx_from_savedmodel(tmp_path / "not_a_savedmodel", tmp_path / "m.onnx", MIN_OPSET)
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "m.onnx.partial").exists()


# -- parity ------------------------------------------------------------------------------------------


def tampered(onnx_path: Path, dst: Path) -> Path:
    """The same model with every float weight matrix doubled: it still runs, but computes something else."""
    model = onnx.load(str(onnx_path))
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32 and array.ndim == 2:
            init.CopyFrom(numpy_helper.from_array(array * 2.0, init.name))
    onnx.save(model, str(dst))
    return dst


def test_parity_passes_and_reports_per_output(multi_io: tuple[Path, Path], tmp_path: Path) -> None:
    saved, onnx_path = multi_io
    data = synthetic_eval_data(signature_from_onnx(onnx_path), 20)
    dst = parity_report_from_models(saved, onnx_path, data, tmp_path / "parity.json", atol=1e-4, rtol=1e-3, batch_size=8)
    report = json.loads(dst.read_text())
    assert report["passed"] is True and report["samples"] == 20 and report["data"] == data.source
    assert report["tolerance"] == {"atol": 1e-4, "rtol": 1e-3}
    assert set(report["outputs"]) == {"cls", "reg"}
    for stats in report["outputs"].values():
        assert stats["max_abs"] <= 1e-4 and stats["elements"] > 0


def test_parity_failure_names_the_output_and_keeps_the_report(multi_io: tuple[Path, Path], tmp_path: Path) -> None:
    saved, onnx_path = multi_io
    wrong = tampered(onnx_path, tmp_path / "wrong.onnx")
    data = synthetic_eval_data(signature_from_onnx(onnx_path), 20)
    dst = tmp_path / "parity.json"
    with pytest.raises(PipelineError, match=r"^ONNX model differs from TensorFlow: output '(cls|reg)' has \d+ of \d+ values farther than atol 0\.0001 \+ rtol 0\.001.*parity\.json\)"):
        parity_report_from_models(saved, wrong, data, dst, atol=1e-4, rtol=1e-3, batch_size=8)
    report = json.loads(dst.read_text())
    assert report["passed"] is False and max(s["max_abs"] for s in report["outputs"].values()) > 1e-4


def test_parity_fails_only_when_both_tolerances_are_exceeded(multi_io: tuple[Path, Path], tmp_path: Path) -> None:
    saved, onnx_path = multi_io
    wrong = tampered(onnx_path, tmp_path / "wrong.onnx")
    data = synthetic_eval_data(signature_from_onnx(onnx_path), 20)
    # an error above atol but within a (huge) rtol passes: atol + rtol·|tf|, as the docstring says
    report = parity_report_from_models(saved, wrong, data, tmp_path / "parity.json", atol=1e-4, rtol=1e9, batch_size=8)
    assert json.loads(report.read_text())["passed"] is True
