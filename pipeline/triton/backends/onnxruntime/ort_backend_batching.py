"""Fixed batch sizes (:func:`fixed_batch_sizes`) and the runner that uses them (:class:`FixedSizeRunner`).

ONNX Runtime's CUDA execution provider (1.20 and later, cuDNN 9's frontend API) rebuilds every Conv's cuDNN
execution plan whenever the Conv's input shape differs from its previous call's, seen before or not
(``UpdateState`` in ``core/providers/cuda/nn/conv.cc``; microsoft/onnxruntime#23006). The dynamic batcher
forms a different batch size at almost every execution, so a CNN on a GPU instance spent seconds per
execution rebuilding plans with the GPU idle (MobileNetV2 on an H200: 2.5–4 s). Such an instance therefore
runs every batch at one of a few fixed sizes, one ONNX Runtime session per size (each Conv then always sees
one shape), the batch padded up with copies of its last row and the padding cut from the outputs. The
sessions share one device memory arena. The ``fixed_batch_sizes`` parameter overrides the choice (``off``,
or sizes such as ``1,8,32,128``).

Part of the backend folder (see ``model.py``): runs in the stub and imports nothing from ``pipeline``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from ort_backend_config import NUMPY_TYPES, BackendConfigError, string_parameter

PLAN_PER_SHAPE_OPS = {"Conv", "ConvTranspose", "FusedConv", "NhwcConv"}
FIXED_BATCH_SIZES = "fixed_batch_sizes"


def fixed_batch_sizes(
    config: dict[str, Any], providers: list[tuple[str, dict[str, str]]], plan_per_shape: bool
) -> list[int]:
    """The batch sizes an instance runs every batch at (empty: as the batch comes).

    ``providers``: the instance's (:func:`execution_providers`); ``plan_per_shape``: the model has ops
    whose CUDA kernels rebuild a plan per input shape (Conv). By default a batched model with such ops
    on the CUDA provider without TensorRT gets the powers of two below its max batch, its preferred
    sizes and the max; the ``fixed_batch_sizes`` parameter says ``off`` or lists sizes (the max batch is
    always added, so every batch the server forms has a size to run at)."""
    max_batch = int(config.get("max_batch_size", 0))
    text = (string_parameter(config, FIXED_BATCH_SIZES) or "auto").strip().lower()
    if max_batch <= 1 or text in ("off", "0", "none", ""):
        return []
    if text == "auto":
        names = [name for name, _ in providers]
        if not plan_per_shape or "CUDAExecutionProvider" not in names or "TensorrtExecutionProvider" in names:
            return []
        preferred = config.get("dynamic_batching", {}).get("preferred_batch_size", [])
        sizes = {1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch} | {int(p) for p in preferred}
    else:
        try:
            sizes = {int(part) for part in text.split(",") if part.strip()}
        except ValueError:
            raise BackendConfigError(
                f"parameter '{FIXED_BATCH_SIZES}' must be 'auto', 'off' or batch sizes like '1,8,32', got '{text}'"
            ) from None
        if any(size < 1 or size > max_batch for size in sizes):
            raise BackendConfigError(f"parameter '{FIXED_BATCH_SIZES}' sizes must lie in 1..{max_batch} (max_batch_size), got '{text}'")
    return sorted(sizes | {max_batch})


def size_for(rows: int, sizes: list[int]) -> int:
    """The smallest fixed size that holds ``rows`` (``rows`` itself when none does or none are fixed)."""
    return next((size for size in sizes if size >= rows), rows)


def padded(feed: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """``feed`` with every input grown to ``size`` rows by repeating its last row (real data, so no
    op sees values a request could not send)."""
    out = {}
    for name, array in feed.items():
        missing = size - array.shape[0]
        out[name] = array if missing <= 0 else np.concatenate([array, np.repeat(array[-1:], missing, axis=0)])
    return out


def warmup_feed(config: dict[str, Any], size: int) -> dict[str, np.ndarray] | None:
    """Zeros of ``size`` rows for every configured input, or None when a dimension is variable."""
    feed = {}
    for entry in config.get("input", []):
        dims = [int(d) for d in entry.get("reshape", {}).get("shape", entry["dims"])]
        dtype = NUMPY_TYPES.get(entry["data_type"])
        if dtype is None or any(d < 0 for d in dims):
            return None
        feed[entry["name"]] = np.zeros([size, *dims], dtype=dtype)
    return feed


def plan_per_shape(path: Path) -> bool:
    """Whether the ONNX graph (its main graph) has ops that rebuild a cuDNN plan per input shape."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # unreadable: ONNX Runtime's load says why, in its own words
        return False
    return any(node.op_type in PLAN_PER_SHAPE_OPS for node in graph.node)



class SessionRunner:
    """ONNX Runtime on a feed for one instance: its session as the batch comes, or, with fixed batch
    sizes, the session of the smallest size that holds the batch, padded up and cut back."""

    def __init__(self, session: Any, outputs: list[str], sessions: dict[int, Any], sizes: list[int]) -> None:
        self.session = session
        self.outputs = outputs
        self.sessions = sessions
        self.sizes = sizes

    def plan(self, rows: int) -> tuple[Any, int]:
        """The session a batch of ``rows`` runs on and the size it runs at."""
        if not self.sessions:
            return self.session, rows
        size = size_for(rows, self.sizes)
        return self.sessions.get(size, self.session), size

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs for ``feed`` (rows as given)."""
        if not self.sessions or not feed:
            return self.session.run(self.outputs, feed)
        rows = next(iter(feed.values())).shape[0]
        session, size = self.plan(rows)
        return [out[:rows] for out in session.run(self.outputs, padded(feed, size))]
