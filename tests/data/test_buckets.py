"""Length buckets: data whose samples differ in a dynamic axis (``tokens__16``, ``tokens__20``),
read from .npz files and .npy folders, checked per bucket, batched without mixing sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.accuracy.evaldata import eval_data_from_path
from pipeline.core.errors import PipelineError
from pipeline.data.buckets import array_shapes, sample_shapes
from pipeline.data.tensors import ModelSignature, TensorSpec

TOKENS = TensorSpec("tokens", np.dtype("int32"), ("batch", "tokens_dim1"))
MASK = TensorSpec("scale", np.dtype("float32"), ("batch", 2))
PROBS = TensorSpec("probs", np.dtype("float32"), ("batch", 4))
SIG = ModelSignature(inputs=(TOKENS, MASK), outputs=(PROBS,))


def buckets(lengths: dict[int, int], labels: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {}
    for length, n in lengths.items():
        arrays[f"tokens__{length}"] = rng.integers(0, 50, (n, length)).astype(np.int64)
        arrays[f"scale__{length}"] = rng.random((n, 2), dtype=np.float32)
        if labels:
            arrays[f"labels__{length}"] = rng.integers(0, 4, n)
    return arrays


@pytest.mark.parametrize("layout", ["npz", "npy"])
def test_eval_data_in_buckets_batches_each_size_apart(tmp_path: Path, layout: str) -> None:
    arrays = buckets({20: 5, 8: 3, 16: 70})
    if layout == "npz":
        path = tmp_path / "eval.npz"
        np.savez(path, **arrays)
    else:
        path = tmp_path / "eval"
        path.mkdir()
        for key, value in arrays.items():
            np.save(path / f"{key}.npy", value)
    data = eval_data_from_path(path, SIG)
    assert [b.name for b in data.buckets] == ["8", "16", "20"]  # numeric labels in numeric order
    assert data.num_samples == 78
    shapes = [tuple(batch["tokens"].shape) for batch in data.batches(64)]
    assert shapes == [(3, 8), (64, 16), (6, 16), (5, 20)]
    assert all(batch["tokens"].dtype == np.int32 for batch in data.batches(64))  # the model's dtype
    assert np.array_equal(data.labels, np.concatenate([arrays["labels__8"], arrays["labels__16"], arrays["labels__20"]]))
    assert data.head(1)["tokens"].shape == (1, 16)  # warmup: a sample of the most common size
    assert [(s, n) for _, s, n in data.sample_shapes()] == [({"tokens": (8,), "scale": (2,)}, 3), ({"tokens": (16,), "scale": (2,)}, 70), ({"tokens": (20,), "scale": (2,)}, 5)]
    with pytest.raises(PipelineError, match="holds 3 length buckets, which cannot be stacked"):
        data.inputs


def test_headers_give_the_shapes_without_loading(tmp_path: Path) -> None:
    np.savez_compressed(tmp_path / "c.npz", **buckets({4: 2, 6: 3}, labels=False))
    assert array_shapes(tmp_path / "c.npz") == {"tokens__4": (2, 4), "scale__4": (2, 2), "tokens__6": (3, 6), "scale__6": (3, 2)}
    assert [(s, n) for _, s, n in sample_shapes(tmp_path / "c.npz", SIG)] == [({"tokens": (4,), "scale": (2,)}, 2), ({"tokens": (6,), "scale": (2,)}, 3)]


def test_a_static_axis_that_differs_between_buckets_names_the_bucket(tmp_path: Path) -> None:
    arrays = buckets({16: 4, 20: 4})
    arrays["scale__20"] = np.zeros((4, 3), np.float32)
    np.savez(tmp_path / "eval.npz", **arrays)
    with pytest.raises(PipelineError, match=r"input 'scale' in '.*eval.npz\[20\]' has shape \(4, 3\), the model expects \(N, 2\)"):
        eval_data_from_path(tmp_path / "eval.npz", SIG)


def test_bucket_sample_counts_must_agree_within_a_bucket(tmp_path: Path) -> None:
    arrays = buckets({16: 4})
    arrays["scale__16"] = arrays["scale__16"][:3]
    np.savez(tmp_path / "eval.npz", **arrays)
    with pytest.raises(PipelineError, match=r"different sample counts: \{'tokens': 4, 'scale': 3\}"):
        eval_data_from_path(tmp_path / "eval.npz", SIG)


def test_labels_for_some_buckets_only(tmp_path: Path) -> None:
    arrays = buckets({16: 4, 20: 2})
    del arrays["labels__20"]
    np.savez(tmp_path / "eval.npz", **arrays)
    with pytest.raises(PipelineError, match=r"has labels for buckets \['16'\] but not for \['20'\]") as info:
        eval_data_from_path(tmp_path / "eval.npz", SIG)
    assert "labels__<bucket> for every bucket" in str(info.value.fix)


def test_labels_of_a_bucket_without_inputs_are_refused(tmp_path: Path) -> None:
    arrays = buckets({16: 4})
    arrays["labels__20"] = np.zeros(4, np.int64)
    np.savez(tmp_path / "eval.npz", **arrays)
    with pytest.raises(PipelineError, match=r"has \['labels__20'\] but no inputs of that bucket"):
        eval_data_from_path(tmp_path / "eval.npz", SIG)


def test_plain_names_are_one_bucket(tmp_path: Path) -> None:
    np.savez(tmp_path / "eval.npz", tokens=np.ones((3, 5), np.int64), scale=np.ones((3, 2), np.float32), labels=np.arange(3))
    data = eval_data_from_path(tmp_path / "eval.npz", SIG)
    assert [b.name for b in data.buckets] == [""] and data.inputs["tokens"].shape == (3, 5)
    assert data.sample_shapes()[0][0] == str(tmp_path / "eval.npz")


def test_loadtest_requests_take_the_buckets_in_turn_at_their_real_sizes() -> None:
    from pipeline.loadtest.payload import ModelIO, TensorInfo, request_batches

    io = ModelIO("m_fp32", (TensorInfo("tokens", "INT32", (-1,)), TensorInfo("scale", "FP32", (2,))), (TensorInfo("probs", "FP32", (4,)),), 8)
    batches = request_batches(buckets({16: 5, 20: 3}), io, batch_size=4, count=5)
    assert [b["tokens"].shape for b in batches] == [(4, 16), (4, 20), (4, 16), (4, 20), (4, 16)]
    assert all(b["tokens"].dtype == np.int32 for b in batches)
    fixed = ModelIO("m_fp32", (TensorInfo("tokens", "INT32", (16,)), TensorInfo("scale", "FP32", (2,))), (), 8)
    with pytest.raises(PipelineError, match=r"have shape \[4, 20\] per request but model 'm_fp32' takes \[-1, 16\]"):
        request_batches(buckets({16: 5, 20: 3}), fixed, batch_size=4, count=2)


def test_a_model_input_whose_name_has_the_separator_is_not_split(tmp_path: Path) -> None:
    sig = ModelSignature(inputs=(TensorSpec("input__0", np.dtype("float32"), ("batch", 3)),), outputs=(PROBS,))
    np.savez(tmp_path / "eval.npz", input__0=np.zeros((2, 3), np.float32))
    assert [b.name for b in eval_data_from_path(tmp_path / "eval.npz", sig).buckets] == [""]
