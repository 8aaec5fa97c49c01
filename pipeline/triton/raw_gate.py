"""The raw-input gate: image files through the served ensemble, against the model fed by Keras's preprocessing.

Each file's bytes go to the ensemble ``<model>`` (decode, fit, resize, scale, the variant) through Triton; the
reference is the FP32 ONNX model, which the parity stage proved equal to TensorFlow, on the tensor Keras's own
image utilities make of the same file (:func:`pipeline.data.raw_files.reference_tensor`). Both are judged with
the statistics and bounds of every other gate (pipeline.accuracy.judging) at the served variant's tolerance, less
its max-abs limit: two resamplers of the same picture differ by a few grey levels, and what matters is whether
the answers do; the figures are those of agreement with the reference (:func:`judge_raw`). Against the labels of
an ImageFolder each side's accuracy is reported beside.

A preprocessing that differs from training (BGR for RGB, 0..255 for 0..1, another resize filter) changes the
answers, and this gate fails it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.gates import Tolerance
from pipeline.accuracy.judging import judge_comparison
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.core.errors import PipelineError
from pipeline.core.objectstore import S3Url
from pipeline.core.progress import progress
from pipeline.data.raw_files import BYTES_INPUT, ImageFiles, ImagePreprocess, reference_tensor

log = logging.getLogger(__name__)

BATCH = 64  # reference tensors run through ONNX Runtime this many at a time


def served_raw_outputs(url: str, model: str, files: ImageFiles, outputs: list[str], class_count: int = 0) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """Each file's bytes through ``model`` at ``url`` (HTTP), one request per file: the outputs of each, and with
    ``class_count`` the top-k answer of the first output (``score:index:label``) per file."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    client = http.InferenceServerClient(url, connection_timeout=10, network_timeout=60)
    answers, names = [], []
    try:
        with progress("raw files through the ensemble", len(files.files), unit="files") as bar:
            for path in bar.track(files.files):
                data = np.fromfile(path, np.uint8)
                tensor = http.InferInput(BYTES_INPUT, [len(data)], "UINT8")
                tensor.set_data_from_numpy(data)
                requested = [http.InferRequestedOutput(o) for o in outputs]
                result = client.infer(model, [tensor], outputs=requested)
                answers.append({o: result.as_numpy(o) for o in outputs})
                if class_count:
                    top = client.infer(model, [tensor], outputs=[http.InferRequestedOutput(outputs[0], class_count=class_count)])
                    names.append(" ".join(v.decode() if isinstance(v, bytes) else str(v) for v in top.as_numpy(outputs[0]).ravel()))
    except InferenceServerException as exc:
        raise PipelineError(f"Triton at {url} failed to answer '{model}' for a raw file: {exc.message()}", "check the server log") from None
    except OSError as exc:
        raise PipelineError(f"cannot reach Triton at {url}: {exc}", "start it with `python -m pipeline serve` or pass the right --url") from None
    finally:
        client.close()
    return answers, names


def reference_outputs(fp32_onnx: Path, files: ImageFiles, pre: ImagePreprocess, outputs: list[str]) -> list[dict[str, np.ndarray]]:
    """The FP32 model's outputs on the Keras reference tensor of each file, one dict per file (batch axis 1)."""
    from pipeline.backend.onnxrt import session_from_onnx

    session = session_from_onnx(fp32_onnx)
    rows: list[dict[str, np.ndarray]] = []
    for start in range(0, len(files.files), BATCH):
        batch = np.stack([reference_tensor(p, pre) for p in files.files[start:start + BATCH]])
        result = dict(zip(outputs, session.run(outputs, {pre.input: batch})))
        rows += [{o: result[o][i:i + 1] for o in outputs} for i in range(len(batch))]
    return rows


def judge_raw(model: str, precision: str, files: ImageFiles, reference: list[dict[str, np.ndarray]], served: list[dict[str, np.ndarray]],
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
    summary: dict[str, dict[str, float]] = {name: dict(comparison.summary(name)) for name in kinds}
    if files.labels is not None:
        labels = np.asarray(files.labels)
        for name, kind in kinds.items():
            if kind.kind == "classes":
                served_top = np.array([r[name].reshape(-1).argmax() for r in served])
                reference_top = np.array([r[name].reshape(-1).argmax() for r in reference])
                summary[name] |= {"accuracy": float((served_top == labels).mean()), "reference_accuracy": float((reference_top == labels).mean())}
    return {"model": model, "precision": precision, "files": len(files.files), "folder": str(files.folder), "rows": verdict.rows,
            "failures": verdict.failures, "undecided": verdict.undecided, "passed": verdict.passed, "summary": summary}


def raw_gate(repository: Path | S3Url, model: str, precision: str, files: ImageFiles, pre: ImagePreprocess, fp32_onnx: Path,
             kinds: dict[str, OutputKind], tolerance: Tolerance, *, workdir: Path, url: str | None = None) -> dict[str, Any]:
    """Serve ``repository`` (or use ``url``), send every file of ``files`` through the ensemble ``model``, and judge the
    answers against the FP32 model on Keras's preprocessing of the same files (:func:`judge_raw`)."""
    from pipeline.triton.server import TritonServer

    outputs = list(kinds)
    reference = reference_outputs(fp32_onnx, files, pre, outputs)
    server = None if url else TritonServer(repository, workdir=workdir)
    with server if server else contextlib.nullcontext():
        endpoint = url or server.http_url  # type: ignore[union-attr]
        served, _ = served_raw_outputs(endpoint, model, files, outputs)
    return judge_raw(model, precision, files, reference, served, kinds, tolerance)

