"""What keras-hub itself makes of raw sentences: the model's own preprocessor run on them (build --raw-inputs text).

The raw-input gate judges the served tokenizer (pipeline/triton/python_models/wordpiece/) against this: the
model is loaded again in a child process (TensorFlow and keras-hub leave with it), its ``preprocessor`` (the
keras-hub task's, e.g. ``BertTextClassifierPreprocessor``) tokenizes and packs the sentences, and the arrays are
written to an ``.npz`` that the gate feeds to the parity-checked FP32 model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.stages.source import ModelSource


def keras_hub_tokens_from_source(source: "ModelSource", texts: list[str], dst: Path, *, inputs: list[str], dtypes: list[str]) -> Path:
    """The model's own preprocessor on ``texts``, one array per model input (``inputs``, cast to ``dtypes``), to
    ``dst`` (``.npz``), in a child process."""
    from pipeline.core.isolate import call_in_child

    return call_in_child(_tokens, source, texts, dst, inputs, dtypes)


def _tokens(source: "ModelSource", texts: list[str], dst: Path, inputs: list[str], dtypes: list[str]) -> Path:
    from pipeline.core.atomic import write_bytes_atomic
    from pipeline.stages.source import keras_model_from_source

    model = keras_model_from_source(source)
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is None:
        raise PipelineError("--raw-inputs text needs the model's keras-hub preprocessor, and the model carries none",
                            "save the task with its preprocessor")
    packed = {name: np.asarray(value) for name, value in preprocessor(texts).items()}
    missing = [name for name in inputs if name not in packed]
    if missing:
        raise PipelineError(f"the model's preprocessor makes {sorted(packed)}, not its inputs {missing}", "leave --raw-inputs out for this model")
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **{name: packed[name].astype(dtype) for name, dtype in zip(inputs, dtypes, strict=True)})
    return write_bytes_atomic(dst, buffer.getvalue())
