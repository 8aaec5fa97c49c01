"""Raw requests in, answers out (build --raw-inputs image): the preprocessing graph against Keras's own image
utilities, planted mismatches, and the bundled digits model answering PNG files with class names through the
embedded tritonserver. Real onnxruntime-extensions, ONNX Runtime, Keras, Triton server and client."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.accuracy.gates import Gates
from pipeline.accuracy.outputkinds import kinds_from_json
from pipeline.backend.extensions import extensions_library, session_with_extensions
from pipeline.build.config import BuildConfig
from pipeline.build.orchestrator import build
from pipeline.build.raw import gate_raw_inputs
from pipeline.core.errors import CheckFailed
from pipeline.data.artifacts import Artifact
from pipeline.data.raw_files import BYTES_INPUT, ImagePreprocess, image_files, preprocess_of, reference_tensor, text_samples
from pipeline.data.tensors import TensorSpec
from pipeline.stages.image_preprocess import image_preprocess_for, image_preprocess_onnx
from pipeline.triton.raw_gate import image_reference_feeds, reference_outputs, text_reference_feeds
from pipeline.triton.server import TritonServer

FITS = ("stretch", "crop", "pad")


def _pictures(folder: Path, count: int = 10, seed: int = 0) -> list[Path]:
    """Smooth pictures of assorted sizes (what a camera gives, not noise), as PNG and JPEG, in the modes files come in
    that the guard lets through: RGB, grayscale and RGBA PNG, RGB JPEG (a grayscale JPEG is refused: the decoder swaps
    its bytes, tests/triton/test_image_guard.py)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        height, width = (int(v) for v in rng.integers(20, 90, 2))
        small = (rng.random((4, 5, 3)) * 255).astype(np.uint8)
        picture = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)
        if i % 2:  # PNG
            picture = picture.convert("L") if i % 5 == 3 else (picture.convert("RGBA") if i % 5 == 4 else picture)
        path = folder / f"{i}.{'png' if i % 2 else 'jpg'}"
        picture.save(path, quality=95) if path.suffix == ".jpg" else picture.save(path)
        paths.append(path)
    return paths


def _spec(channels: int) -> TensorSpec:
    return TensorSpec("image", np.dtype("float32"), ("batch", 24, 32, channels))


def _graph_outputs(pre: ImagePreprocess, paths: list[Path], tmp_path: Path) -> np.ndarray:
    graph = image_preprocess_onnx(pre, tmp_path / f"pre-{pre.channels}-{pre.fit}-{pre.channel_order}-{pre.interpolation}.onnx")
    session = session_with_extensions(graph, extensions_library().path)
    # whole outputs concatenated: a view of one ([0][0]) would outlive the ONNX Runtime value that holds its memory
    return np.concatenate([session.run(None, {BYTES_INPUT: np.fromfile(p, np.uint8)})[0] for p in paths])


def test_reference_tensor_is_what_keras_load_img_gives(tmp_path: Path) -> None:
    import keras

    for path in _pictures(tmp_path, 6):
        for channels, mode in ((3, "rgb"), (1, "grayscale")):
            for fit in ("stretch", "crop"):
                pre = image_preprocess_for(_spec(channels), fit, "unit", None, "pil-bilinear")
                img = keras.utils.load_img(path, color_mode=mode, target_size=(24, 32), interpolation="bilinear", keep_aspect_ratio=fit == "crop")
                expected = keras.utils.img_to_array(img) / 255.0
                np.testing.assert_allclose(reference_tensor(path, pre), expected, atol=1e-6)


def test_reference_tensor_is_what_keras_image_dataset_gives(tmp_path: Path) -> None:
    """The default filter against Keras's own loader code: image_dataset_from_directory's resize of each fit (smart_resize
    for the crop, tf.image.resize_with_pad for the pad), on the pixels keras.utils.load_img decodes."""
    import keras
    import tensorflow as tf
    from keras.src.utils import image_utils

    for path in _pictures(tmp_path, 6, seed=7):
        for channels, mode in ((3, "rgb"), (1, "grayscale")):
            pixels = keras.utils.img_to_array(keras.utils.load_img(path, color_mode=mode))
            for fit in FITS:
                pre = image_preprocess_for(_spec(channels), fit, "unit", None)
                assert pre.interpolation == "bilinear"
                if fit == "crop":
                    expected = np.asarray(image_utils.smart_resize(pixels, (24, 32), interpolation="bilinear"))
                elif fit == "pad":
                    expected = tf.image.resize_with_pad(pixels, 24, 32, method="bilinear").numpy()
                else:
                    expected = tf.image.resize(pixels, (24, 32), method="bilinear").numpy()
                np.testing.assert_allclose(reference_tensor(path, pre), expected / 255.0, atol=1e-6)


@pytest.mark.parametrize("resize_filter", ["bilinear", "pil-bilinear"])
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("fit", FITS)
def test_preprocess_graph_follows_keras_preprocessing(tmp_path: Path, channels: int, fit: str, resize_filter: str) -> None:
    paths = _pictures(tmp_path, 10, seed=channels)
    pre = image_preprocess_for(_spec(channels), fit, "unit", None, resize_filter)
    ours = _graph_outputs(pre, paths, tmp_path)
    reference = np.stack([reference_tensor(p, pre) for p in paths])
    assert ours.shape == reference.shape == (10, 24, 32, channels)
    levels = np.abs(ours - reference) * 255
    # ONNX Resize's linear filter follows TensorFlow's (antialiased: PIL's), and two JPEG decoders (libjpeg in onnxruntime-extensions,
    # PIL's libjpeg-turbo) differ a little: measured 0.52-0.54 levels on average, 5-9 at the 99th percentile, 12 at worst
    assert levels.mean() < 1.0 and np.percentile(levels, 99) <= 16.0, (levels.mean(), levels.max())


def test_planted_mismatches_move_the_pixels_far(tmp_path: Path) -> None:
    paths = _pictures(tmp_path, 8, seed=3)
    good = image_preprocess_for(_spec(3), "stretch", "unit", None)
    reference = np.stack([reference_tensor(p, good) for p in paths])
    for planted in (ImagePreprocess(**{**vars(good), "channel_order": "BGR"}),
                    ImagePreprocess(**{**vars(good), "interpolation": "nearest"}),
                    ImagePreprocess(**{**vars(good), "scale": (1.0, 1.0, 1.0)})):
        levels = np.abs(_graph_outputs(planted, paths, tmp_path) - reference) * 255
        assert levels.mean() > 3.0, planted


def test_model_rescaling_layer_replaces_preprocess() -> None:
    pre = image_preprocess_for(_spec(3), None, "imagenet", "Rescaling layer 'rescale' (x · 0.00392157 + 0)")
    assert pre.scale == (1.0, 1.0, 1.0) and pre.offset == (0.0, 0.0, 0.0)
    assert "the model's own Rescaling layer" in pre.scaling and "--preprocess not applied" in pre.scaling


def _planted(repository: Path, model: str, planted: ImagePreprocess, dst: Path) -> Path:
    """A copy of the gate's repository whose preprocessing graph is ``planted``."""
    shutil.copytree(repository, dst)
    image_preprocess_onnx(planted, dst / f"{model}_preprocess" / "1" / "model.onnx")
    return dst


def _gate(repository: Path, workspace: Path, model: str, samples, pre: ImagePreprocess | None, tmp_path: Path) -> str:
    """The raw-input gate on ``repository``: its one-line failure, or "passed". The reference: the FP32 model on
    Keras's preprocessing (images: ``pre``; sentences: the build's keras-hub tokens)."""
    manifest = json.loads((workspace / "manifest.json").read_text())
    kinds = kinds_from_json(manifest["results"]["output_kinds"])
    fp32 = workspace / "model.fp32.onnx"
    feeds = image_reference_feeds(samples, pre) if pre is not None else text_reference_feeds(workspace / "text_reference.npz")
    reference = reference_outputs(fp32, feeds, list(kinds))
    try:
        gate_raw_inputs(repository, model, Artifact("fp32", "onnx", fp32), samples, reference, fp32, kinds, Gates(), tmp_path / "served")
    except CheckFailed as exc:
        return exc.problem
    return "passed"


@pytest.fixture(scope="module")
def digits_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("raw-digits")
    build(BuildConfig(workdir=root / "build", calibration_root=root / "calibration", repository=root / "repo", raw_inputs="image"))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["nearest", "0..255 for 0..1"])
def test_planted_mismatch_fails_the_served_gate(digits_built: Path, tmp_path: Path, plant: str) -> None:
    workspace = digits_built / "build" / "digits"
    good = preprocess_of(workspace / "preprocess.onnx")
    files = image_files(workspace / "raw_eval", [str(i) for i in range(10)])
    assert _gate(workspace / "raw_gate_repository", workspace, "digits", files, good, tmp_path) == "passed"
    if plant == "nearest":
        # a model trained on keras.utils.load_img's antialiased bilinear (--resize-filter pil-bilinear), served with nearest;
        # (nearest is close to tf.image.resize's bilinear, which does not antialias either: 1.34 points apart, undecided)
        good = replace(good, interpolation="pil-bilinear")
        assert _gate(_planted(workspace / "raw_gate_repository", "digits", good, tmp_path / "pil"), workspace, "digits", files, good, tmp_path) == "passed"
    planted = replace(good, interpolation="nearest") if plant == "nearest" else replace(good, scale=(1.0,))
    repository = _planted(workspace / "raw_gate_repository", "digits", planted, tmp_path / "planted")
    line = _gate(repository, workspace, "digits", files, good, tmp_path)
    assert "output 'probs' (classes): top-1 disagreement" in line and "> 1 allowed" in line, line


def _colour_folder(folder: Path, count: int = 400) -> Path:
    """The zoo colour model's task as files: 16×16 pictures of five colours enlarged to assorted sizes, PNG and JPEG."""
    from tests.zoo.models import _colour_pixels

    images, labels = _colour_pixels(np.random.default_rng(5), count)
    rng = np.random.default_rng(6)
    for i, (image, label) in enumerate(zip(images["pixels"], labels, strict=True)):
        side = int(rng.integers(16, 64))
        target = folder / f"c{label}" / f"{i:04d}.{'jpg' if i % 3 == 0 else 'png'}"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(image).astype(np.uint8)).resize((side, side), Image.Resampling.BILINEAR).save(target)
    return folder


@pytest.mark.slow
def test_model_that_rescales_itself_and_channels_swapped(tmp_path: Path) -> None:
    folder = _colour_folder(tmp_path / "images")
    result = build(BuildConfig(model="tests.zoo.models:preprocessing_cnn", workdir=tmp_path / "build", calibration_root=tmp_path / "calibration",
                               repository=tmp_path / "repo", raw_inputs="image", eval_data=folder, preprocess="imagenet"))
    workspace = result.workspace.root
    gate = json.loads(result.manifest.read_text())["results"]["raw_inputs"]
    assert not gate["failures"] and "the model's own Rescaling layer" in gate["preprocess"] and "--preprocess not applied" in gate["preprocess"]
    good = preprocess_of(workspace / "preprocess.onnx")
    assert good.scale == (1.0, 1.0, 1.0)
    files = image_files(folder)
    name = result.name
    line = _gate(_planted(workspace / "raw_gate_repository", name, replace(good, channel_order="BGR"), tmp_path / "bgr"), workspace, name, files, good, tmp_path)
    assert "top-1 disagreement" in line and "> 1 allowed" in line, line


@pytest.mark.slow
def test_digits_answer_png_files_with_class_names(tmp_path: Path) -> None:
    import tritonclient.http as http

    result = build(BuildConfig(workdir=tmp_path / "build", calibration_root=tmp_path / "calibration", repository=tmp_path / "repo",
                               raw_inputs="image"))
    manifest = json.loads(result.manifest.read_text())
    gate = manifest["results"]["raw_inputs"]
    assert gate["files"] == 449 and not gate["failures"]  # one more disagreement on another CPU may leave it undecided, never failed
    assert gate["rows"][0]["metric"] == "top-1 disagreement" and gate["summary"]["probs"]["agreement"] >= 0.99
    # the files are the evaluation digits drawn at other sizes: their accuracy is held to the tensor path's file by file, within the gate
    versus = gate["accuracy_vs_tensor_path"]
    assert gate["tensor_path_accuracy"] > 0.95 and versus["comparison"] == "paired, file by file", versus
    assert versus["high"] <= versus["limit"] == 1.0 and not any("tensor path" in line for line in gate["undecided"]), versus
    assert {"digits", "digits_preprocess", "digits_fp32"} <= {p.name for p in (tmp_path / "repo").iterdir()}

    files = image_files(result.workspace.root / "raw_eval", [str(i) for i in range(10)])
    sizes = {Image.open(p).size for p in files.files}
    assert len(sizes) > 20  # assorted sizes, none of them 8×8
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "serve") as server:
        client = http.InferenceServerClient(server.http_url)
        right = 0
        for path, label in list(zip(files.files, files.labels, strict=True))[::15]:
            tensor = http.InferInput(BYTES_INPUT, [1], "BYTES")  # one file, one string element
            tensor.set_data_from_numpy(np.array([path.read_bytes()], dtype=object))
            answer = client.infer("digits", [tensor], outputs=[http.InferRequestedOutput("probs", class_count=3)]).as_numpy("probs")
            top = [entry.decode().split(":") for entry in answer.ravel()]
            assert len(top) == 3 and all(len(parts) == 3 for parts in top)  # score:index:label
            assert top[0][2] == top[0][1]  # the digits' labels are their indices
            right += int(top[0][2] == str(label))
        assert right >= 0.9 * len(files.files[::15])
    # `verify --data` with the PNG folder, through the embedded server: the gate's verdict and class names
    from tests.conftest import cli

    done = cli("verify", "--repository", str(tmp_path / "repo"), "--data", str(files.folder), "--workdir", str(tmp_path / "verify"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "top-1 disagreement" in done.stdout and "score:index:label" in done.stdout
    report = json.loads((tmp_path / "verify" / "verify_raw.json").read_text())[0]
    assert report["model"] == "digits" and not report["failures"] and len(report["answers"]) == 10
    # the build's own files again: held to its tensor path file by file (by content), as the build held them
    assert report["accuracy_vs_tensor_path"]["comparison"] == "paired, file by file" and report["accuracy_vs_tensor_path"]["high"] <= 1.0
    assert all(top[0].split(":")[2] == name.split("/")[0] for name, top in report["answers"].items() if top[0].startswith("0.9"))
    # the PyPI library loads only in a Python process: the deploy bundle leaves the ensemble unloaded, saying why (the
    # ensemble for decoded images needs no library and loads)
    import re

    script = (tmp_path / "deploy" / "docker-run.sh").read_text()
    assert set(re.findall(r"--load-model=(\w+)", script)) == {"digits_fp32", "digits_hwc", "digits_preprocess_hwc"}


@pytest.mark.slow
def test_keras_hub_text_classifier_answers_sentences(tmp_path: Path) -> None:
    """The zoo's keras-hub BertTextClassifier (its own BertTokenizer and preprocessor) built with --raw-inputs text:
    sentences in, class names out, agreeing with keras-hub run on the same sentences; another vocabulary fails."""
    import tritonclient.http as http

    from tests.zoo.hub import TEXT_CLASSES, sentences, write_sentences

    names = [f"topic-{c}" for c in range(TEXT_CLASSES)]
    (tmp_path / "calibration" / "bert_text").mkdir(parents=True)
    (tmp_path / "calibration" / "bert_text" / "labels.txt").write_text("\n".join(names) + "\n")
    csv_path = write_sentences(tmp_path / "sentences.csv", n=400)
    result = build(BuildConfig(model="tests.zoo.hub:bert_text_classifier", name="bert_text", workdir=tmp_path / "build",
                               calibration_root=tmp_path / "calibration", repository=tmp_path / "repo", raw_inputs="text", eval_data=csv_path))
    gate = json.loads(result.manifest.read_text())["results"]["raw_inputs"]
    assert gate["files"] == 400 and not gate["failures"] and gate["summary"]["logits"]["agreement"] == 1.0
    assert gate["summary"]["logits"]["accuracy"] > 0.8
    workspace = result.workspace.root
    settings = json.loads((tmp_path / "repo" / "bert_text_tokenize" / "tokenizer_settings.json").read_text())
    assert settings["kind"] == "wordpiece" and settings["lowercase"] and settings["buckets"] == [8, 16, 32]

    texts, labels = sentences(np.random.default_rng(9), 12)
    texts[0] = "KALO, lomi!!  Kalos? xyzzy"  # case, punctuation, runs of spaces, a plural, a word outside the vocabulary
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "serve") as server:
        client = http.InferenceServerClient(server.http_url)
        tensor = http.InferInput("text", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
        answer = client.infer("bert_text", [tensor], outputs=[http.InferRequestedOutput("logits", class_count=1)]).as_numpy("logits")
        served = client.infer("bert_text", [tensor]).as_numpy("logits")
    top = [row[0].decode().split(":")[2] for row in answer]
    assert all(name in names for name in top)
    # keras-hub on the same sentences, fed to the published FP32 model
    import keras_hub

    from tests.zoo.hub import TEXT_SEQUENCE_LENGTH, TEXT_VOCABULARY

    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=TEXT_VOCABULARY, lowercase=True)
    packed = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=TEXT_SEQUENCE_LENGTH)(texts)
    feed = {k: np.asarray(v).astype(np.int32) for k, v in packed.items()}
    import onnxruntime as ort

    reference = ort.InferenceSession(str(workspace / "model.fp32.onnx")).run(["logits"], feed)[0]
    np.testing.assert_allclose(served, reference, atol=1e-4)
    assert top == [names[i] for i in reference.argmax(1)]

    from tests.conftest import cli

    done = cli("verify", "--repository", str(tmp_path / "repo"), "--data", str(csv_path), "--workdir", str(tmp_path / "verify"))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "verify" / "verify_raw.json").read_text())[0]
    assert report["model"] == "bert_text" and not report["failures"] and report["summary"]["logits"]["agreement"] == 1.0
    assert all(top[0].split(":")[2] in names for top in report["answers"].values())

    samples = text_samples(csv_path, names)
    planted = tmp_path / "planted"
    shutil.copytree(workspace / "raw_gate_repository", planted)
    vocabulary = (planted / "bert_text_tokenize" / "vocabulary.txt").read_text().splitlines()
    words = vocabulary[11:]  # another version of the vocabulary: the same words, renumbered
    (planted / "bert_text_tokenize" / "vocabulary.txt").write_text("\n".join(vocabulary[:11] + words[1:] + words[:1]) + "\n")
    line = _gate(planted, workspace, "bert_text", samples, None, tmp_path)
    assert "output 'logits' (classes): top-1 disagreement" in line and "> 1 allowed" in line, line


@pytest.mark.slow
def test_deploy_bundle_serves_the_ensemble_with_a_standalone_library(digits_built: Path, tmp_path: Path) -> None:
    """With a custom-op library that loads without Python (a stand-in: a real shared library with no libpython symbol,
    since the standalone libortextensions.so cannot be built here), the deploy bundle loads the ensemble and its
    preprocessing beside the variant, starting the server in the repository's folder; every config reads back as
    Triton's ModelConfig and passes the publish checks. With the PyPI module it leaves them out (the first test)."""
    import onnxruntime

    from pipeline.backend.extensions import LIBRARY_FILE, extensions_library
    from pipeline.triton.deploy import write_deploy_bundle
    from pipeline.triton.repository import check_staged, read_repository

    repository = tmp_path / "repo"
    shutil.copytree(digits_built / "repo", repository)
    standin = Path(onnxruntime.__file__).parent / "capi" / "libonnxruntime_providers_shared.so"
    assert extensions_library(standin).standalone and not extensions_library().standalone
    shutil.copy(standin, repository / "digits_preprocess" / LIBRARY_FILE)
    write_deploy_bundle(repository, tmp_path / "deploy")
    script = (tmp_path / "deploy" / "docker-run.sh").read_text()
    for model in ("digits", "digits_guard", "digits_preprocess", "digits_fp32", "digits_hwc", "digits_preprocess_hwc"):
        assert f"--load-model={model} " in script
    assert "cd /models && " in script
    models = read_repository(repository)
    assert models["digits"].config.platform == "ensemble"
    assert list(models["digits_preprocess"].config.model_operations.op_library_filename) == ["digits_preprocess/libortextensions.so"]
    for model in ("digits", "digits_preprocess"):
        check_staged(models[model].path, models[model].config)


@pytest.mark.slow
def test_loadtest_sends_jpeg_files_and_reports_each_step(digits_built: Path, tmp_path: Path) -> None:
    """`loadtest --data FOLDER` against the ensemble: one JPEG per request, throughput and client percentiles, and
    Triton's own time in each step (the preprocessing and the variant) from its statistics; results.json keeps them."""
    from tests.conftest import cli

    folder = tmp_path / "jpegs"
    for path in sorted((digits_built / "build" / "digits" / "raw_eval").glob("*/*.png"))[::9]:
        target = folder / path.parent.name / f"{path.stem}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.open(path).convert("RGB").save(target, quality=90)
    done = cli("loadtest", "--repository", str(digits_built / "repo"), "--model", "digits", "--data", str(folder), "--concurrency", "1,4",
               "--window-ms", "500", "--warmup-ms", "200", "--max-seconds", "8", "--workdir", str(tmp_path / "lt"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Triton's time per ensemble step" in done.stdout
    results = json.loads(next((tmp_path / "lt" / "reports").glob("*/results.json")).read_text())
    for point in results["points"]:
        assert point["aggregate"]["requests"] > 0 and point["aggregate"]["error_count"] == 0
        assert point["aggregate"]["latency"]["p99_ms"] >= point["aggregate"]["latency"]["p50_ms"] > 0
        steps = point["steps"]
        assert set(steps) == {"digits_guard", "digits_preprocess", "digits_fp32"}
        assert all(s["success_count"] > 0 and s["compute_infer_us"] > 0 for s in steps.values())


@pytest.mark.slow
def test_the_documented_client_gets_class_names(digits_built: Path, tmp_path: Path) -> None:
    """The client of docs/guide/raw-inputs.md, run as written against the served digits ensemble with a JPEG."""
    import re

    from tests.conftest import ROOT

    page = (ROOT / "docs" / "guide" / "raw-inputs.md").read_text()
    code = re.search(r"<!-- client: image -->\n```python\n(.*?)```", page, re.S).group(1)  # type: ignore[union-attr]
    definitions = code.split("\nprint(")[0]
    namespace: dict = {}
    exec(compile(definitions, "docs/guide/raw-inputs.md", "exec"), namespace)  # noqa: S102 - the documented client itself
    png = sorted((digits_built / "build" / "digits" / "raw_eval" / "7").glob("*.png"))[0]
    jpeg = tmp_path / "photo.jpg"
    Image.open(png).convert("RGB").save(jpeg, quality=95)
    with TritonServer(digits_built / "repo", workdir=tmp_path / "serve") as server:
        answers = namespace["top_classes"](server.http_url, str(jpeg))
    assert len(answers) == 3 and all(len(a.split(":")) == 3 for a in answers)
    assert answers[0].split(":")[2] == "7"


@pytest.mark.slow
def test_decoded_images_get_the_same_answers(digits_built: Path, tmp_path: Path) -> None:
    """`<name>_hwc` takes what a client decoded itself (uint8 HWC RGB, any size) and answers as `<name>` does for the
    file (PNG: both decoders give the same pixels); it needs no custom-op library, so the deploy bundle loads it even
    with the PyPI one."""
    import tritonclient.http as http

    files = image_files(digits_built / "build" / "digits" / "raw_eval", [str(i) for i in range(10)]).files[::40]
    with TritonServer(digits_built / "repo", workdir=tmp_path / "serve") as server:
        client = http.InferenceServerClient(server.http_url)
        for path in files:
            encoded = http.InferInput(BYTES_INPUT, [1], "BYTES")
            encoded.set_data_from_numpy(np.array([path.read_bytes()], dtype=object))
            pixels = np.asarray(Image.open(path).convert("RGB"))
            decoded = http.InferInput("image_hwc", list(pixels.shape), "UINT8")
            decoded.set_data_from_numpy(pixels)
            np.testing.assert_allclose(client.infer("digits_hwc", [decoded]).as_numpy("probs"),
                                       client.infer("digits", [encoded]).as_numpy("probs"), atol=1e-6)
    script = (digits_built / "deploy" / "docker-run.sh").read_text()
    assert "--load-model=digits_hwc " in script and "--load-model=digits_preprocess_hwc " in script



@pytest.mark.slow
def test_bad_uploads_get_an_error_and_the_server_goes_on(digits_built: Path, tmp_path: Path) -> None:
    """A file the decoder would die on (onnxruntime-extensions#1094: libjpeg's fatal errors call exit()) is answered
    with an error by the guard in front of it, and the next good file is answered: nothing reaches the decoder."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    good = sorted((digits_built / "build" / "digits" / "raw_eval" / "3").glob("*.png"))[0]
    jpeg = tmp_path / "good.jpg"
    Image.open(good).convert("RGB").save(jpeg, quality=90)
    whole = jpeg.read_bytes()
    bad = {"cut short": whole[:200], "not an image": b"%PDF-1.7" + bytes(300), "cut near its end": whole[:-40]}
    with TritonServer(digits_built / "repo", workdir=tmp_path / "serve") as server:
        client = http.InferenceServerClient(server.http_url)

        def ask(data: bytes) -> np.ndarray:
            tensor = http.InferInput(BYTES_INPUT, [1], "BYTES")
            tensor.set_data_from_numpy(np.array([data], dtype=object))
            return client.infer("digits", [tensor]).as_numpy("probs")

        for name, data in bad.items():
            with pytest.raises(InferenceServerException, match="image refused"):
                ask(data)
            assert ask(whole).argmax() == 3, name
        assert server.is_running


@pytest.mark.slow
def test_a_scale_unlike_training_fails_against_the_tensor_path(tmp_path: Path) -> None:
    """--preprocess symmetric (-1..1) for the digits, trained on 0..1: the ensemble and its reference agree (both follow the
    declaration), and the accuracy from the raw files, held file by file to the tensor path's, fails the build."""
    from pipeline.core.errors import CheckFailed

    with pytest.raises(CheckFailed, match=r"top-1 accuracy from raw files .* below the tensor path's .*paired, file by file; limit 1\)") as caught:
        build(BuildConfig(workdir=tmp_path / "build", calibration_root=tmp_path / "calibration", repository=tmp_path / "repo",
                          raw_inputs="image", preprocess="symmetric"))
    assert "--preprocess" in (caught.value.fix or "")
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())  # nothing published
