"""The raw-input gate: raw requests through the served ensemble, against the model fed by Keras's preprocessing.

Each image file's bytes (or each sentence) go to the ensemble ``<model>`` (decode, fit, resize, scale, or the
tokenizer; then the variant) through Triton; the reference is the FP32 ONNX model, which the parity stage proved
equal to TensorFlow, on what Keras's own preprocessing makes of the same input: its image utilities
(:func:`pipeline.data.raw_files.reference_tensor`), or the keras-hub task's preprocessor
(pipeline/stages/text_reference.py). Both are judged with
the statistics and bounds of every other gate (pipeline.accuracy.judging) at the served variant's tolerance, less
its max-abs limit: two resamplers of the same picture differ by a few grey levels, and what matters is whether
the answers do; the figures are those of agreement with the reference (:func:`judge_raw`). Against the labels of
an ImageFolder each side's accuracy is reported beside.

A preprocessing that differs from training (BGR for RGB, 0..255 for 0..1, another resize filter, another
vocabulary) changes the answers, and this gate fails it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.gates import Gates, Tolerance, tolerance_for
from pipeline.accuracy.judging import judge_comparison
from pipeline.accuracy.outputkinds import OutputKind, kinds_from_json
from pipeline.core.errors import PipelineError, require
from pipeline.core.objectstore import S3Url
from pipeline.core.progress import progress
from pipeline.data.artifacts import parse_variant
from pipeline.data.raw_files import BYTES_INPUT, ImageFiles, ImagePreprocess, TextSamples, reference_tensor

log = logging.getLogger(__name__)

BATCH = 64  # reference tensors run through ONNX Runtime this many at a time
RawSamples = ImageFiles | TextSamples  # what clients send: image files, or sentences


def served_raw_outputs(url: str, model: str, samples: RawSamples, outputs: list[str]) -> list[dict[str, np.ndarray]]:
    """Each raw sample (a file's bytes, a sentence) through ``model`` at ``url`` (HTTP), one request each: the outputs of each."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    client = http.InferenceServerClient(url, connection_timeout=10, network_timeout=60)
    answers = []
    try:
        payloads = samples.payloads()
        with progress("raw inputs through the ensemble", len(payloads), unit="requests") as bar:
            for name, data, datatype in bar.track(payloads):
                tensor = http.InferInput(name, list(data.shape), datatype)
                tensor.set_data_from_numpy(data)
                requested = [http.InferRequestedOutput(o) for o in outputs]
                result = client.infer(model, [tensor], outputs=requested)
                answers.append({o: result.as_numpy(o) for o in outputs})
    except InferenceServerException as exc:
        raise PipelineError(f"Triton at {url} failed to answer '{model}' for a raw file: {exc.message()}", "check the server log") from None
    except OSError as exc:
        raise PipelineError(f"cannot reach Triton at {url}: {exc}", "start it with `python -m pipeline serve` or pass the right --url") from None
    finally:
        client.close()
    return answers


def reference_outputs(fp32_onnx: Path, feeds: list[dict[str, np.ndarray]], outputs: list[str]) -> list[dict[str, np.ndarray]]:
    """The FP32 model's outputs on each reference feed (one sample each, batch axis 1), run ``BATCH`` at a time."""
    from pipeline.backend.onnxrt import session_from_onnx

    session = session_from_onnx(fp32_onnx)
    rows: list[dict[str, np.ndarray]] = []
    for start in range(0, len(feeds), BATCH):
        part = feeds[start:start + BATCH]
        batch = {name: np.concatenate([f[name] for f in part]) for name in part[0]}
        result = dict(zip(outputs, session.run(outputs, batch)))
        rows += [{o: result[o][i:i + 1] for o in outputs} for i in range(len(part))]
    return rows


def image_reference_feeds(files: ImageFiles, pre: ImagePreprocess) -> list[dict[str, np.ndarray]]:
    """Per file, the tensor Keras's image utilities make of it (:func:`pipeline.data.raw_files.reference_tensor`)."""
    return [{pre.input: reference_tensor(path, pre)[None]} for path in files.files]


def text_reference_feeds(tokens: Path) -> list[dict[str, np.ndarray]]:
    """Per sentence, what keras-hub's preprocessor made of it (the ``.npz`` of pipeline/stages/text_reference.py)."""
    with np.load(tokens) as arrays:
        packed = {name: arrays[name] for name in arrays.files}
    count = len(next(iter(packed.values())))
    return [{name: array[i:i + 1] for name, array in packed.items()} for i in range(count)]


def judge_raw(model: str, precision: str, samples: RawSamples, reference: list[dict[str, np.ndarray]], served: list[dict[str, np.ndarray]],
              kinds: dict[str, OutputKind], tolerance: Tolerance) -> dict[str, Any]:
    """The verdict of the served answers against the reference, file by file. The reference is the answer the model
    should give, so the figures are those of agreement (top-1 agreement for classes, as a gate without labels judges):
    a preprocessing that changes answers fails even where it happens to keep the accuracy. The labels, where the folder
    has them, give each side's accuracy beside (and pipeline.build.raw holds it to the tensor path's)."""
    tolerance = replace(tolerance, atol=None)
    comparison = new_comparison(model, kinds, tolerance.threshold)
    for mine, theirs in zip(reference, served, strict=True):
        comparison.add({o: mine[o] for o in kinds}, {o: theirs[o].reshape(mine[o].shape) for o in kinds}, {})
    verdict = judge_comparison(model, precision, "raw inputs", comparison, tolerance, kinds)
    summary: dict[str, dict[str, float | None]] = {name: dict(comparison.summary(name)) for name in kinds}
    right = ""
    if samples.labels is not None:
        labels = np.asarray(samples.labels)
        for name, kind in kinds.items():
            if kind.kind == "classes":
                served_top = np.array([r[name].reshape(-1).argmax() for r in served])
                reference_top = np.array([r[name].reshape(-1).argmax() for r in reference])
                summary[name] |= {"accuracy": float((served_top == labels).mean()), "reference_accuracy": float((reference_top == labels).mean())}
                right = right or "".join("1" if r else "0" for r in served_top == labels)
    return {"model": model, "precision": precision, "files": len(reference), "folder": samples.source, "rows": verdict.rows,
            "failures": verdict.failures, "undecided": verdict.undecided, "passed": verdict.passed, "summary": summary,
            "right_per_file": right}


def file_digests(samples: ImageFiles) -> list[str]:
    """Per file, the first 16 hex digits of its SHA-256: which of a build's files a later folder holds, whatever their names."""
    import hashlib

    return [hashlib.sha256(path.read_bytes()).hexdigest()[:16] for path in samples.files]


def hold_to_tensor_path(report: dict[str, Any], tensor_accuracy: float, tensor_samples: int, tolerance: Tolerance,
                        tensor_right: np.ndarray | None = None) -> None:
    """Add to ``report`` (of :func:`judge_raw`) the accuracy from raw files against the tensor path's (FP32 on the build's
    evaluation tensors): a failure when the drop's lower bound passes the accuracy limit, undecided when only its upper
    bound does. With ``tensor_right`` (per raw file, whether the tensor path got the same sample right: the files are
    those samples) the comparison is paired, with the bounds of every other accuracy gate (Tango's, as
    pipeline.accuracy.bounds gives them); else unpaired (other pictures, or other pixels of them): normal bounds."""
    from statistics import NormalDist

    from pipeline.accuracy.bounds import paired_drop

    report["tensor_path_accuracy"] = tensor_accuracy
    raw = next((s["accuracy"] for s in report["summary"].values() if s.get("accuracy") is not None), None)
    if raw is None:
        return
    served = np.frombuffer(report.get("right_per_file", "").encode(), np.uint8) == ord("1")
    if tensor_right is not None and len(tensor_right) == len(served) == report["files"]:
        estimate = paired_drop(int((tensor_right & ~served).sum()), int((~tensor_right & served).sum()), len(served), tolerance.confidence)
        drop, low, high, how = estimate.drop, estimate.low, estimate.high, "paired, file by file"
        tensor_accuracy = float(tensor_right.mean())
        report["tensor_path_accuracy"] = tensor_accuracy
    else:
        z = NormalDist().inv_cdf(0.5 + tolerance.confidence / 2)
        drop = 100 * (tensor_accuracy - raw)
        spread = 100 * z * float(np.sqrt(tensor_accuracy * (1 - tensor_accuracy) / tensor_samples + raw * (1 - raw) / report["files"]))
        low, high, how = drop - spread, drop + spread, "unpaired"
    report["accuracy_vs_tensor_path"] = {"drop_points": drop, "low": low, "high": high, "limit": tolerance.max_drop_points, "comparison": how}
    line = (f"top-1 accuracy from raw files {100 * raw:.2f}% is {drop:.2f} points [{low:.2f}, {high:.2f}] below "
            f"the tensor path's {100 * tensor_accuracy:.2f}% ({how}; limit {tolerance.max_drop_points:g})")
    if low > tolerance.max_drop_points:
        report["failures"].append(line)
        report["passed"] = False
    elif high > tolerance.max_drop_points:
        report["undecided"].append(f"{line}: too few files to tell")


def raw_gate(repository: Path | S3Url, model: str, precision: str, samples: RawSamples, reference: list[dict[str, np.ndarray]],
             kinds: dict[str, OutputKind], tolerance: Tolerance, *, workdir: Path, url: str | None = None,
             answers_for: tuple[int, ...] = ()) -> dict[str, Any]:
    """Serve ``repository`` (or use ``url``), send every raw sample through the ensemble ``model``, and judge the
    answers against ``reference`` (the FP32 model on Keras's preprocessing of the same samples: :func:`judge_raw`);
    with ``answers_for`` (sample indices), also the top-3 class names Triton gives for those samples (``answers``)."""
    from pipeline.triton.server import TritonServer

    outputs = list(kinds)
    server = None if url else TritonServer(repository, workdir=workdir)
    with server if server else contextlib.nullcontext():
        endpoint = url or server.http_url  # type: ignore[union-attr]
        served = served_raw_outputs(endpoint, model, samples, outputs)
        classes = next((n for n, k in kinds.items() if k.kind == "classes"), None)
        answers = class_names(endpoint, model, samples, answers_for, classes) if answers_for and classes else {}
    report = judge_raw(model, precision, samples, reference, served, kinds, tolerance)
    report["answers"] = answers
    return report


def class_names(url: str, model: str, samples: RawSamples, indices: tuple[int, ...], output: str, count: int = 3) -> dict[str, list[str]]:
    """The top ``count`` answers of ``model`` for the samples at ``indices``, as Triton's classification extension gives them."""
    import tritonclient.http as http

    client = http.InferenceServerClient(url, connection_timeout=10, network_timeout=60)
    payloads, names = samples.payloads(), samples.names()
    try:
        answers = {}
        for i in indices:
            name, data, datatype = payloads[i]
            tensor = http.InferInput(name, list(data.shape), datatype)
            tensor.set_data_from_numpy(data)
            result = client.infer(model, [tensor], outputs=[http.InferRequestedOutput(output, class_count=count)])
            answers[names[i]] = [v.decode() if isinstance(v, bytes) else str(v) for v in result.as_numpy(output).ravel()]
        return answers
    finally:
        client.close()


def verify_raw(repository: Path | S3Url, data: Path, *, url: str | None, workdir: Path, gates: Gates, models: tuple[str, ...] = (),
               shown: int = 10) -> list[dict[str, Any]]:
    """Every raw-input ensemble of ``repository`` (or those of ``models``) answering ``data`` — the image files of a
    folder (the image ensembles), or the sentences of a CSV/text file (the text ensembles) — judged as the build's gate
    (its output kinds, limits and tensor-path accuracy) against the FP32 variant on the reference preprocessing: Keras's
    image utilities, or for text the repository's own tokenizer run in this process (the build judged that one against
    keras-hub); with the top-3 class names of ``shown`` inputs through Triton's classification extension. PipelineError
    (one line) when the repository has no such ensemble."""
    from pipeline.data.raw_files import TEXT_INPUT, is_text_file
    from pipeline.data.workspace import build_record_of_served
    from pipeline.triton.ensemble import ensemble_steps
    from pipeline.triton.repository import read_repository
    from pipeline.triton.s3repository import readable

    text = is_text_file(data)
    wanted = TEXT_INPUT if text else BYTES_INPUT
    reports = []
    with readable(repository) as local:
        served = read_repository(local)
        ensembles = [n for n, m in sorted(served.items()) if m.config.platform == "ensemble" and (not models or n in models)
                     and [i.name for i in m.config.input] == [wanted]]
        require(bool(ensembles), f"{repository} has no raw-input ensemble for {'sentences' if text else 'image files'}"
                f"{' among ' + ', '.join(models) if models else ''}", f"build one with: python -m pipeline build --raw-inputs {'text' if text else 'image'}")
        for name in ensembles:
            steps = ensemble_steps(served[name].config)
            first, variant = served[steps[-2]], served[steps[-1]]  # the step that makes the variant's inputs, and the variant
            fp32 = served.get(f"{name}_fp32")
            if fp32 is None:
                raise PipelineError(f"the ensemble {name}'s FP32 variant {name}_fp32 is not in {repository}", "publish it with the ensemble")
            record = build_record_of_served(served[name].path)
            require(bool(record.get("output_kinds")), f"the ensemble {name} records no output kinds", "rebuild it with build --raw-inputs")
            kinds = kinds_from_json(record["output_kinds"])
            samples, feeds, described = _text_case(first.path, data) if text else _image_case(first, data)
            classes = _classes(served[name].path)
            if classes and samples.labels is None:
                samples = replace(samples, classes=tuple(classes))
            limits = replace(Gates(), **{k: v for k, v in (record.get("gates") or {}).items() if k in vars(Gates())})
            limits = replace(limits, fp16_max_drop=gates.fp16_max_drop, int8_max_drop=gates.int8_max_drop, gate_confidence=gates.gate_confidence)
            precision = (parse_variant(steps[-1]) or (steps[-1], "fp32"))[1]
            tolerance = tolerance_for(precision, limits)
            reference = reference_outputs(fp32.path / str(max(fp32.versions)) / "model.onnx", feeds, list(kinds))
            count = len(reference)
            report = raw_gate(repository, name, precision, samples, reference, kinds, tolerance, workdir=workdir, url=url,
                              answers_for=tuple(range(count))[:: max(1, count // shown)][:shown] if classes else ())
            built = record.get("raw_inputs") or {}
            recorded = built.get("tensor_path_accuracy")
            if recorded is not None:
                # the build's own files (by content) are judged file by file against its tensor path; other files unpaired
                by_file = built.get("tensor_right_by_file") or {}
                digests = file_digests(samples) if by_file and isinstance(samples, ImageFiles) else []
                paired = np.array([bool(by_file[d]) for d in digests]) if digests and all(d in by_file for d in digests) else None
                hold_to_tensor_path(report, recorded, int(built.get("tensor_samples") or report["files"]), tolerance, paired)
            report["variant"] = variant.name
            report["preprocess"] = described
            reports.append(report)
    return reports


def _classes(model_dir: Path) -> list[str] | None:
    from pipeline.data.workspace import ModelData

    labels = model_dir / ModelData.LABELS
    return [line.strip() for line in labels.read_text().splitlines() if line.strip()] if labels.is_file() else None


def _image_case(first: Any, folder: Path) -> tuple[RawSamples, list[dict[str, np.ndarray]], str]:
    from pipeline.data.raw_files import image_files, preprocess_of

    pre = preprocess_of(first.path / str(max(first.versions)) / "model.onnx")
    files = image_files(folder, _classes(first.path.parent / first.path.name.removesuffix("_preprocess")))
    return files, image_reference_feeds(files, pre), pre.describe()


def _text_case(tokenizer_dir: Path, path: Path) -> tuple[RawSamples, list[dict[str, np.ndarray]], str]:
    """The sentences of ``path`` and, per sentence, what the served tokenizer's settings and vocabulary (read from the
    repository) pack to the preprocessor's full length with this package's copy of the tokenizer, as keras-hub's
    preprocessor does: code from a repository (a bucket, say) is never run here."""
    import importlib.util
    import json

    from pipeline.data.raw_files import text_samples
    from pipeline.triton.ensemble import TOKENIZER_MODULE, TOKENIZER_SETTINGS, WORDPIECE_MODEL

    samples = text_samples(path, _classes(tokenizer_dir.parent / tokenizer_dir.name.removesuffix("_tokenize")))
    spec = importlib.util.spec_from_file_location("pipeline_wordpiece_tokenizer", WORDPIECE_MODEL.parent / TOKENIZER_MODULE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    require((tokenizer_dir / TOKENIZER_SETTINGS).is_file(), f"{tokenizer_dir} has no {TOKENIZER_SETTINGS}", "rebuild it with build --raw-inputs text")
    wordpiece, settings = module.load(str(tokenizer_dir))
    full = {**json.loads((tokenizer_dir / TOKENIZER_SETTINGS).read_text()), "buckets": [settings["sequence_length"]]}
    feeds = [{k: v.astype(np.int32) for k, v in module.encode_batch([t], full, wordpiece).items()} for t in samples.texts]
    return samples, feeds, "the served tokenizer's files, run in process as the reference (the build judged the tokenizer against keras-hub)"
