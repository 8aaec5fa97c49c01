"""LoadGen's accuracy mode against Triton: each request batch is one LoadGen sample, issued by an AccuracyOnly run
of any scenario; Triton's answers are taken back from LoadGen's accuracy log (``mlperf_log_accuracy.json``, each
sample's whole HTTP response in hex), not from the client, so what is judged is what the log holds.

:func:`outputs_through_loadgen` returns the decoded outputs per batch, in the batches' order, for the served
accuracy gates (pipeline.triton.verify) to judge."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError, require
from pipeline.loadtest.client import Endpoint, post_request_bytes, response_frame
from pipeline.loadtest.loadgen.settings import ScenarioSettings
from pipeline.loadtest.loadgen.verdict import ACCURACY, ScenarioVerdict
from pipeline.loadtest.payload import NUMPY_OF, ModelIO, TensorInfo, encode_binary

log = logging.getLogger(__name__)

_TRITON_OF = {np.dtype(v): k for k, v in NUMPY_OF.items()}


def request_for(model: str, endpoint: Endpoint, tensors: dict[str, np.ndarray], outputs: Sequence[str]) -> bytes:
    """One binary-tensor inference request (head and body) for ``tensors``, each input sent in its own dtype (as
    tritonclient sends a numpy array), asking for ``outputs`` as binary data."""
    inputs = []
    for name, array in tensors.items():
        require(array.dtype == object or array.dtype in _TRITON_OF, f"input '{name}' holds {array.dtype} values, which Triton has no type for",
                "store the evaluation data in a numeric dtype the model takes")
        inputs.append(TensorInfo(name, "BYTES" if array.dtype == object else _TRITON_OF[array.dtype], tuple(array.shape[1:])))
    io = ModelIO(model, tuple(inputs), tuple(TensorInfo(o, "", ()) for o in outputs), 0)
    body, head = encode_binary(io, tensors)
    return post_request_bytes(endpoint, f"/v2/models/{model}/infer", body, head)


def decode_answer(response: bytes, outputs: Sequence[str], what: str) -> dict[str, np.ndarray]:
    """``outputs`` of one logged HTTP response (its status line, head and body), decoded by tritonclient."""
    from pipeline.loadtest.request_check import infer_result

    frame = response_frame(response)
    require(frame is not None and response.startswith(b"HTTP/1.1 200") and len(response) >= frame[1], f"{what}: the logged answer is not a "
            "complete HTTP 200 response", "run the accuracy mode again; the server log says why a request failed")
    assert frame is not None
    result = infer_result(response[: frame[0]], response[frame[0] : frame[1]])
    decoded = {}
    for name in outputs:
        array = result.as_numpy(name)
        require(array is not None, f"{what}: the answer has no output '{name}'", "check the model's outputs against its build")
        decoded[name] = array
    return decoded


def read_accuracy_log(path: Path, samples: int) -> list[bytes]:
    """Each sample's logged answer, by sample index; PipelineError naming a sample LoadGen logged no answer for (a
    failed request is logged with no data)."""
    require(path.is_file(), f"LoadGen wrote no accuracy log at {path}", "check that --mode accuracy ran to the end")
    answers: dict[int, bytes] = {}
    for entry in json.loads(path.read_text() or "[]"):  # multi-stream pads its last query with samples again: any answer will do
        if entry["data"]:
            answers.setdefault(int(entry["qsl_idx"]), bytes.fromhex(entry["data"]))
    missing = [i for i in range(samples) if not answers.get(i)]
    if missing:
        raise PipelineError(f"{len(missing)} of {samples} samples have no answer in {path} (first: sample {missing[0]})",
                            "a request failed or timed out: see the client errors and the server log, then run again")
    return [answers[i] for i in range(samples)]


def outputs_through_loadgen(settings: ScenarioSettings, model: str, endpoint: Endpoint, batches: Iterable[dict[str, np.ndarray]],
                            outputs: Sequence[str], out_dir: Path, *, timeout_s: float, max_connections: int,
                            ) -> tuple[list[dict[str, np.ndarray]], ScenarioVerdict]:
    """Send every batch through Triton as one sample of LoadGen's AccuracyOnly run of ``settings.scenario`` (logs in
    ``out_dir``); return ``outputs`` of each batch, read back from the accuracy log, and the run's verdict."""
    from pipeline.loadtest.loadgen.http_sut import TritonSut
    from pipeline.loadtest.loadgen.run import run_scenario

    payloads = [request_for(model, endpoint, batch, outputs) for batch in batches]
    sut = TritonSut(model, endpoint, payloads, settings.scenario, timeout_s=timeout_s, max_connections=max_connections, keep_answers=True)
    sut.start()
    try:
        verdict = run_scenario(replace(settings, mode="accuracy"), sut, len(payloads), out_dir)
    finally:
        sut.stop()
    errors = sut.engine.recorder.errors
    if errors:
        log.warning("%s: %s failed requests in the accuracy run (%s)", model, sum(errors.values()), ", ".join(sorted(errors)))
    answers = read_accuracy_log(out_dir / ACCURACY, len(payloads))
    return [decode_answer(a, outputs, f"{model} sample {i}") for i, a in enumerate(answers)], verdict
