"""A Triton Python model that turns raw UTF-8 text into BERT / DistilBERT inputs, as keras-hub would.

Input ``text`` (TYPE_STRING, one string per row: ``[n, 1]`` with batching); outputs the int32 ``[n, L]``
tensors the settings name (``token_ids``, ``padding_mask``, ``segment_ids``), exactly what keras-hub 0.32's
``BertTextClassifierPreprocessor`` (or DistilBERT's) gives, except that each request's rows are padded only to
the smallest configured bucket that holds its longest row. The tokenizer is ``wordpiece_tokenizer.py``
beside this file, read from ``tokenizer_settings.json`` and ``vocabulary.txt`` in the model's directory
(beside ``config.pbtxt``), both written by ``pipeline/stages/tokenizer_export.py``.

It needs nothing beyond the standard library and numpy: no keras, TensorFlow or tokenizers library in the stub,
so every NGC Triton's Python backend runs it. It is published as a model's ``<model>/1/model.py``
(``backend: "python"``), ``wordpiece_tokenizer.py`` copied beside it. A request that fails (invalid UTF-8, a wrong shape) gets its own
error response; the others in the batch are answered and the model stays up.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# wordpiece_tokenizer.py sits in the model's directory (beside config.pbtxt: the pipeline may not write into a
# version folder but the model file) or, in the source tree and its tests, beside this file.
_HERE = os.path.dirname(os.path.abspath(__file__))


def _tokenizer_module(directory: str) -> Any:
    for folder in (directory, _HERE):
        if os.path.isfile(os.path.join(folder, "wordpiece_tokenizer.py")) and folder not in sys.path:
            sys.path.insert(0, folder)
    import wordpiece_tokenizer

    return wordpiece_tokenizer

INPUT_NAME = "text"


def _texts(array: np.ndarray) -> list[str]:
    """One decoded string per row of a TYPE_STRING input (``[n, 1]``, or ``[n]`` without batching)."""
    rows = array.reshape(1, 1) if array.ndim == 0 else array.reshape(array.shape[0], -1)
    if rows.shape[1] != 1:
        raise ValueError(f"input '{INPUT_NAME}' must hold one string per row, got shape {list(array.shape)}")
    texts = []
    for i, value in enumerate(rows[:, 0]):
        if isinstance(value, str):
            texts.append(value)
            continue
        if not isinstance(value, (bytes, bytearray)):
            raise ValueError(f"input '{INPUT_NAME}' row {i} is {type(value).__name__}, not a string")
        try:
            texts.append(bytes(value).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"input '{INPUT_NAME}' row {i} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    return texts


class TritonPythonModel:
    """One instance: the tokenizer read once, then every request's texts tokenized and packed."""

    def initialize(self, args: dict[str, str]) -> None:
        """Read the tokenizer files from the model directory and check them against the model config."""
        config = json.loads(args["model_config"])
        directory = args["model_repository"]
        module = _tokenizer_module(directory)
        self._encode_batch = module.encode_batch
        try:
            wordpiece, settings = module.load(directory)
        except (OSError, ValueError, KeyError) as exc:
            raise pb_utils.TritonModelException(f"wordpiece tokenizer in {directory}: {exc}") from None
        self._wordpiece = wordpiece
        self._settings: dict[str, Any] = settings
        inputs = [(i.get("name"), i.get("data_type")) for i in config.get("input", [])]
        if inputs and inputs != [(INPUT_NAME, "TYPE_STRING")]:
            raise pb_utils.TritonModelException(
                f"wordpiece tokenizer {config.get('name')}: needs one input '{INPUT_NAME}' of TYPE_STRING, "
                f"has {inputs}")
        configured = [o["name"] for o in config.get("output", [])]
        made = [(settings.get("input_names") or {}).get(name, name) for name in settings["outputs"]]
        unknown = [name for name in configured if name not in made]
        if unknown:
            raise pb_utils.TritonModelException(
                f"wordpiece tokenizer {config.get('name')}: outputs {unknown} are not among {made} "
                f"({directory}/tokenizer_settings.json)")
        self._outputs = configured or made
        # the ids in the integer type the model takes (int32 by default, as keras-hub makes them)
        self._dtypes = {o["name"]: np.int64 if o.get("data_type") == "TYPE_INT64" else np.int32 for o in config.get("output", [])}

    def execute(self, requests: list[Any]) -> list[Any]:
        """One response per request: its outputs, or its own error."""
        responses = []
        for request in requests:
            try:
                tensor = pb_utils.get_input_tensor_by_name(request, INPUT_NAME)
                if tensor is None:
                    raise ValueError(f"the request has no input '{INPUT_NAME}'")
                arrays = self._encode_batch(_texts(tensor.as_numpy()), self._settings, self._wordpiece)
                outputs = [pb_utils.Tensor(name, arrays[name].astype(self._dtypes.get(name, np.int32), copy=False)) for name in self._outputs]
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            except Exception as exc:  # noqa: BLE001 - one bad request must not fail the batch or the model
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"wordpiece tokenizer: {exc}")))
        return responses

    def finalize(self) -> None:
        """Nothing to release: the tokenizer is plain Python data."""
