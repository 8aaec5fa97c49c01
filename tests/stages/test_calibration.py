"""Calibration data loading: every accepted source and every user error, on real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.core.errors import PipelineError
from pipeline.data.tensors import ModelSignature, TensorSpec
from pipeline.stages.calibration import CalibrationData, calibration_from_path

F32 = np.dtype(np.float32)
IMAGE = ModelSignature(inputs=(TensorSpec("image", F32, ("batch", 8, 8, 1)),), outputs=(TensorSpec("probs", F32, ("batch", 10)),))
TOKENS = ModelSignature(
    inputs=(TensorSpec("ids", np.dtype(np.int32), ("batch", 5)), TensorSpec("extra", F32, ("batch", 4))),
    outputs=(TensorSpec("y", F32, ("batch", 3)),),
)


def _images(n: int = 120) -> np.ndarray:
    return np.random.default_rng(0).random((n, 8, 8, 1), dtype=np.float32)


def _sizes(data: CalibrationData, batch_size: int, **kwargs: bool) -> list[int]:
    return [len(next(iter(batch.values()))) for batch in data.batches(batch_size, **kwargs)]


# ----------------------------------------------------------------------------- arrays


def test_npz_batches_are_bounded_and_in_order(tmp_path: Path) -> None:
    images = _images(120)
    np.savez(tmp_path / "calib.npz", image=images.astype(np.float64), labels=np.arange(120))
    data = calibration_from_path(tmp_path / "calib.npz", IMAGE)
    assert data.num_samples == 120 and data.input_names == ("image",)
    assert _sizes(data, 32) == [32, 32, 32, 24]
    assert _sizes(data, 32, drop_last=True) == [32, 32, 32]
    batches = list(data.batches(50))
    assert all(b["image"].dtype == np.float32 for b in batches)  # float64 cast within the kind
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in batches]), images)


def test_folder_with_calib_npz_and_max_samples(tmp_path: Path) -> None:
    np.savez(tmp_path / "calib.npz", image=_images(300))
    (tmp_path / "eval.npz").write_bytes(b"ignored")
    data = calibration_from_path(tmp_path, IMAGE, max_samples=200)
    assert data.origin == tmp_path / "calib.npz"
    assert data.num_samples == 200 and sum(_sizes(data, 64)) == 200


def test_folder_of_npy_files_is_memory_mapped_and_cast_per_batch(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "ids.npy", rng.integers(0, 1000, (150, 5)).astype(np.int64))
    np.save(tmp_path / "extra.npy", rng.standard_normal((150, 4)).astype(np.float32))
    data = calibration_from_path(tmp_path, TOKENS)
    batch = data.batch(0, 16)
    assert batch["ids"].dtype == np.int32 and batch["ids"].shape == (16, 5)
    assert type(batch["extra"]) is np.ndarray  # a copy of one batch, not the memory map
    assert _sizes(data, 100) == [100, 50]


def test_fingerprint_follows_data_and_settings(tmp_path: Path) -> None:
    np.savez(tmp_path / "calib.npz", image=_images(150))
    first = calibration_from_path(tmp_path, IMAGE).fingerprint()
    assert calibration_from_path(tmp_path, IMAGE).fingerprint() == first
    assert calibration_from_path(tmp_path, IMAGE, max_samples=120).fingerprint() != first
    np.savez(tmp_path / "calib.npz", image=_images(150) + 0.5)
    assert calibration_from_path(tmp_path, IMAGE).fingerprint() != first


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"imgae": _images()}, r"arrays \['imgae'\] that are not model inputs — name the arrays after the model inputs: image"),
        # an array named after the output holds its labels: the fix names the key they go under
        ({"image": _images(), "probs": np.arange(120)}, r"arrays \['probs'\] that are not model inputs — rename 'probs' to 'labels:probs'"),
        ({"labels": np.arange(120)}, r"no array for model input\(s\) \['image'\] — add one array per model input: image"),
        ({"image": _images()[..., 0]}, r"has shape \(120, 8, 8\), the model expects \(N, 8, 8, 1\)"),
        ({"image": np.zeros((120, 8, 9, 1), np.float32)}, r"has shape \(120, 8, 9, 1\), the model expects \(N, 8, 8, 1\)"),
        ({"image": np.zeros((120, 8, 8, 1), np.uint8)}, "is uint8, but the model input is float32"),
        ({"image": _images(50)}, "has 50 samples, at least 100 are required"),
    ],
)
def test_array_errors_name_the_problem(tmp_path: Path, arrays: dict[str, np.ndarray], message: str) -> None:
    np.savez(tmp_path / "calib.npz", **arrays)
    with pytest.raises(PipelineError, match=message):
        calibration_from_path(tmp_path / "calib.npz", IMAGE)


def test_nan_and_inf_are_counted_per_input(tmp_path: Path) -> None:
    images = _images(120).astype(np.float64)
    images[3, 0, 0, 0] = np.nan
    images[7, 1, 1, 0] = np.inf
    images[9, 2, 2, 0] = 1e300  # finite in float64, inf once cast to the model's float32
    np.savez(tmp_path / "calib.npz", image=images)
    with pytest.raises(PipelineError, match="input 'image' in .* has 3 NaN/Inf value"):
        calibration_from_path(tmp_path, IMAGE)


def test_integer_inputs_cast_within_kind_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    extra = rng.standard_normal((120, 4)).astype(np.float32)
    np.savez(tmp_path / "ok.npz", ids=rng.integers(0, 9, (120, 5)).astype(np.uint8), extra=extra)
    assert calibration_from_path(tmp_path / "ok.npz", TOKENS).batch(0, 8)["ids"].dtype == np.int32
    np.savez(tmp_path / "big.npz", ids=np.full((120, 5), 2**40, np.int64), extra=extra)
    with pytest.raises(PipelineError, match=r"values 1099511627776\.\.1099511627776 that do not fit the model's int32"):
        calibration_from_path(tmp_path / "big.npz", TOKENS)
    np.savez(tmp_path / "float_ids.npz", ids=np.zeros((120, 5), np.float32), extra=extra)
    with pytest.raises(PipelineError, match="input 'ids' .* is float32, but the model input is int32"):
        calibration_from_path(tmp_path / "float_ids.npz", TOKENS)
    np.savez(tmp_path / "uneven.npz", ids=np.zeros((130, 5), np.int32), extra=extra)
    with pytest.raises(PipelineError, match="different sample counts"):
        calibration_from_path(tmp_path / "uneven.npz", TOKENS)


def test_pickled_object_arrays_are_refused(tmp_path: Path) -> None:
    objects = np.empty(120, dtype=object)
    objects[:] = [np.zeros((8, 8, 1))] * 120
    np.savez(tmp_path / "calib.npz", image=objects)
    with pytest.raises(PipelineError, match="holds a pickled object array"):
        calibration_from_path(tmp_path / "calib.npz", IMAGE)
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "image.npy", objects)
    with pytest.raises(PipelineError, match="image.npy' holds a pickled object array"):
        calibration_from_path(folder, IMAGE)


def test_unreadable_sources(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        calibration_from_path(tmp_path / "nowhere", IMAGE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineError, match=r"'.*empty' is empty: it has no calib.npz, <input>.npy files \(image\) or JPEG/PNG"):
        calibration_from_path(tmp_path / "empty", IMAGE)
    np.savez(tmp_path / "empty" / "train.npz", image=_images())
    (tmp_path / "empty" / "eval.npz").write_bytes(b"x")
    with pytest.raises(PipelineError, match=r"'.*empty' holds eval.npz, train.npz but no calib.npz, .* — pass the file itself \(--calibration .*eval.npz\) or rename it to calib.npz"):
        calibration_from_path(tmp_path / "empty", IMAGE)
    (tmp_path / "broken.npz").write_text("not a zip")
    with pytest.raises(PipelineError, match="is not a valid .npz archive"):
        calibration_from_path(tmp_path / "broken.npz", IMAGE)
    (tmp_path / "data.csv").write_text("1,2")
    with pytest.raises(PipelineError, match="is not an .npz archive"):
        calibration_from_path(tmp_path / "data.csv", IMAGE)
    np.savez(tmp_path / "calib.npz", image=_images())
    with pytest.raises(PipelineError, match="unknown preprocessing 'zscore' — use one of: unit, symmetric, imagenet, raw"):
        calibration_from_path(tmp_path / "calib.npz", IMAGE, preprocess="zscore")
    with pytest.raises(PipelineError, match="no input named 'pixels'"):
        calibration_from_path(tmp_path / "calib.npz", IMAGE, shape_hint={"pixels": (8, 8, 1)})


def test_shape_bounds_accept_any_size_inside_the_profile(tmp_path: Path) -> None:
    dynamic = ModelSignature(inputs=(TensorSpec("x", F32, ("batch", "seq", 4)),), outputs=())
    np.savez(tmp_path / "calib.npz", x=np.zeros((100, 7, 4), np.float32))
    assert calibration_from_path(tmp_path, dynamic).num_samples == 100
    assert calibration_from_path(tmp_path, dynamic, shape_bounds={"x": ((1, 4), (16, 4))}).num_samples == 100
    with pytest.raises(PipelineError, match=r"input 'x' has dim 1 = 7, outside the shape profile's 1..6 — widen the profile with --shape x:MIN/OPT/MAX to cover 7"):
        calibration_from_path(tmp_path, dynamic, shape_bounds={"x": ((1, 4), (6, 4))})


SEQ = ModelSignature(
    inputs=(TensorSpec("tokens", np.dtype(np.int64), ("batch", "seq")), TensorSpec("mask", F32, ("batch", "seq")), TensorSpec("meta", F32, ("batch", 3))),
    outputs=(TensorSpec("y", F32, ("batch", 2)),),
)


def _bucket(rng: np.random.Generator, n: int, length: int) -> dict[str, np.ndarray]:
    return {"tokens": rng.integers(0, 50, (n, length)), "mask": np.ones((n, length), np.float32), "meta": rng.random((n, 3), dtype=np.float32)}


def test_buckets_of_different_lengths_are_batched_per_length(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for label, n, length in (("len16", 70, 16), ("len20", 50, 20), ("b", 10, 16)):
        arrays.update({f"{name}__{label}": arr for name, arr in _bucket(rng, n, length).items()})
    np.savez(tmp_path / "calib.npz", **arrays)
    caplog.set_level("INFO", logger="pipeline.stages.calibration")
    data = calibration_from_path(tmp_path / "calib.npz", SEQ, shape_bounds={"tokens": ((1,), (32,)), "mask": ((1,), (32,))})
    assert data.num_samples == 130
    shapes = [(b["tokens"].shape, b["mask"].shape, b["meta"].shape) for b in data.batches(32)]
    assert shapes == [((32, 16), (32, 16), (32, 3)), ((32, 16), (32, 16), (32, 3)), ((16, 16), (16, 16), (16, 3)), ((32, 20), (32, 20), (32, 3)), ((18, 20), (18, 20), (18, 3))]
    assert data.num_batches(32) == 5
    first = np.concatenate([b["tokens"] for b in data.batches(64)][:2][:1])
    np.testing.assert_array_equal(first, np.concatenate([arrays["tokens__b"], arrays["tokens__len16"]])[:64])  # buckets of one length, in name order
    assert data.sizes == {"tokens": {1: {16: 80, 20: 50}}, "mask": {1: {16: 80, 20: 50}}}
    assert data.largest_shapes() == {"tokens": (20,), "mask": (20,), "meta": (3,)}
    assert "in 2 shape groups (tokens dim 1: 16 (80), 20 (50)" in caplog.text
    limited = calibration_from_path(tmp_path / "calib.npz", SEQ, max_samples=104)
    assert [len(b["tokens"]) for b in limited.batches(100)] == [64, 40]  # spread over the lengths: 80:50


def test_bucket_errors_are_one_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    good = _bucket(rng, 120, 16)
    np.savez(tmp_path / "missing.npz", **{f"{k}__len16": v for k, v in good.items() if k != "mask"})
    with pytest.raises(PipelineError, match=r"bucket 'len16' of '.*missing.npz' has no array for model input\(s\) \['mask'\]"):
        calibration_from_path(tmp_path / "missing.npz", SEQ)
    np.savez(tmp_path / "disagree.npz", tokens=good["tokens"], mask=np.ones((120, 20), np.float32), meta=good["meta"])
    with pytest.raises(PipelineError, match=r"input 'mask' has dim 1 = 20 but 'tokens' has dim 1 = 16, and the model says both are the same axis 'seq'"):
        calibration_from_path(tmp_path / "disagree.npz", SEQ)
    bucketed = {f"{k}__a": v for k, v in good.items()}
    np.savez(tmp_path / "static.npz", **bucketed, meta__x=np.zeros((5, 4), np.float32), tokens__x=good["tokens"][:5], mask__x=good["mask"][:5])
    with pytest.raises(PipelineError, match=r"input 'meta' in '.*static.npz\[x\]' has shape \(5, 4\), the model expects \(N, 3\)"):
        calibration_from_path(tmp_path / "static.npz", SEQ)
    np.savez(tmp_path / "typo.npz", **bucketed, tokenz__a=good["tokens"])
    with pytest.raises(PipelineError, match=r"typo.npz' has arrays \['tokenz__a'\] that are not model inputs"):
        calibration_from_path(tmp_path / "typo.npz", SEQ)
    np.savez(tmp_path / "target.npz", **bucketed, y__a=np.zeros((120, 2), np.float32))
    with pytest.raises(PipelineError, match=r"target.npz' has arrays \['y__a'\] that are not model inputs — rename 'y__a' to 'labels:y__a'"):
        calibration_from_path(tmp_path / "target.npz", SEQ)
    np.savez(tmp_path / "mixed.npz", **good, tokens__x=good["tokens"])
    with pytest.raises(PipelineError, match=r"bucket 'x' of '.*mixed.npz' has no array for model input\(s\) \['mask', 'meta'\]"):
        calibration_from_path(tmp_path / "mixed.npz", SEQ)


def test_npy_buckets_in_a_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for label, length in (("len8", 8), ("len12", 12)):
        for name, arr in _bucket(rng, 60, length).items():
            np.save(tmp_path / f"{name}__{label}.npy", arr)
    data = calibration_from_path(tmp_path, SEQ)
    assert data.num_samples == 120 and data.sizes["tokens"][1] == {8: 60, 12: 60}


def test_float64_arrays_are_cast_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="pipeline.data.arrays")
    np.savez(tmp_path / "calib.npz", image=_images().astype(np.float64))
    data = calibration_from_path(tmp_path / "calib.npz", IMAGE)
    assert data.batch(0, 8)["image"].dtype == np.float32
    casts = [r.getMessage() for r in caplog.records if "cast to the model's float32" in r.getMessage()]
    assert len(casts) == 1 and "input 'image' is float64" in casts[0]


# ----------------------------------------------------------------------------- images


def _write_images(folder: Path, values: list[int], size: tuple[int, int] = (16, 16), mode: str = "L") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, value in enumerate(values):
        color = value if mode == "L" else (value, value // 2, 255 - value)
        path = folder / f"img_{index:03d}.{'png' if index % 2 else 'jpg'}"
        Image.new(mode, size, color).save(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize(("preprocess", "low", "high"), [("unit", 0.0, 1.0), ("symmetric", -1.0, 1.0), ("raw", 0.0, 255.0)])
def test_grayscale_images_resized_and_scaled(tmp_path: Path, preprocess: str, low: float, high: float) -> None:
    _write_images(tmp_path / "imgs", [0, 255] * 5, mode="RGB")  # RGB files into a 1-channel model
    (tmp_path / "imgs" / "notes.txt").write_text("not an image, ignored")
    data = calibration_from_path(tmp_path / "imgs", IMAGE, preprocess=preprocess, min_samples=10)
    batch = data.batch(0, 4)["image"]
    assert batch.shape == (4, 8, 8, 1) and batch.dtype == np.float32
    gray_of_0 = 0.299 * 0 + 0.587 * 0 + 0.114 * 255  # PIL's RGB→L of (v, v//2, 255-v) for v = 0
    expected_low = {"unit": gray_of_0 / 255, "symmetric": gray_of_0 / 127.5 - 1, "raw": gray_of_0}[preprocess]
    assert abs(float(batch[0].mean()) - expected_low) < 0.02 * (high - low)
    assert float(batch.max()) <= high and float(batch.min()) >= low
    assert _sizes(data, 4) == [4, 4, 2]


def test_rgb_nchw_images_with_imagenet_normalisation(tmp_path: Path) -> None:
    nchw = ModelSignature(inputs=(TensorSpec("pixels", F32, ("batch", 3, 4, 6)),), outputs=())
    _write_images(tmp_path, [200] * 3, size=(12, 8), mode="RGB")
    batch = calibration_from_path(tmp_path, nchw, preprocess="imagenet", min_samples=3).batch(0, 3)["pixels"]
    assert batch.shape == (3, 3, 4, 6)
    expected = (np.array([200, 100, 55]) / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    np.testing.assert_allclose(batch[0].mean(axis=(1, 2)), expected, atol=0.05)  # JPEG is lossy


def test_image_errors(tmp_path: Path) -> None:
    paths = _write_images(tmp_path / "imgs", [10, 20, 30, 40])
    with pytest.raises(PipelineError, match="has 4 samples, at least 100 are required"):
        calibration_from_path(tmp_path / "imgs", IMAGE)
    paths[1].write_bytes(paths[1].read_bytes()[:40])  # truncated PNG
    with pytest.raises(PipelineError, match="cannot read image '.*img_001.png'"):
        calibration_from_path(tmp_path / "imgs", IMAGE, min_samples=4)
    (tmp_path / "imgs" / "img_001.png").write_text("garbage")
    with pytest.raises(PipelineError, match="cannot read image '.*img_001.png'"):
        calibration_from_path(tmp_path / "imgs", IMAGE, min_samples=4)
    paths[1].unlink()
    with pytest.raises(PipelineError, match="only calibrate a model with one image input; this model has inputs ids, extra"):
        calibration_from_path(tmp_path / "imgs", TOKENS, min_samples=3)
    with pytest.raises(PipelineError, match="needs an RGB input, but 'image' has 1 channel"):
        calibration_from_path(tmp_path / "imgs", IMAGE, preprocess="imagenet", min_samples=3)
    dynamic = ModelSignature(inputs=(TensorSpec("image", F32, ("batch", "h", "w", 3)),), outputs=())
    with pytest.raises(PipelineError, match="has a dynamic image size — pass the per-sample shape"):
        calibration_from_path(tmp_path / "imgs", dynamic, min_samples=3)
    hinted = calibration_from_path(tmp_path / "imgs", dynamic, min_samples=3, shape_hint={"image": (5, 7, 3)}, resize="stretch")
    assert hinted.batch(0, 2)["image"].shape == (2, 5, 7, 3)
    flat = ModelSignature(inputs=(TensorSpec("x", F32, ("batch", 64)),), outputs=())
    with pytest.raises(PipelineError, match="does not look like an image"):
        calibration_from_path(tmp_path / "imgs", flat, min_samples=3)


def test_image_calibration_says_what_it_did_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """64×48 RGB photos into a 28×28×1 model: refused without --resize (aspect 1.33 vs 1.00), then one line saying what was done."""
    square = ModelSignature(inputs=(TensorSpec("image", F32, ("batch", 28, 28, 1)),), outputs=())
    _write_images(tmp_path / "photos", [40, 200, 90], size=(64, 48), mode="RGB")
    with pytest.raises(PipelineError, match=r"img_000.jpg' is 64×48 \(aspect 1.33\), the model input is 28×28 \(aspect 1.00\).*tolerance — say how to fit it: --resize stretch .* crop .* pad"):
        calibration_from_path(tmp_path / "photos", square, min_samples=3)
    with pytest.raises(PipelineError, match="unknown resize mode 'squash' — use one of: stretch, crop, pad"):
        calibration_from_path(tmp_path / "photos", square, min_samples=3, resize="squash")
    caplog.set_level("INFO", logger="pipeline.stages.calibration")
    data = calibration_from_path(tmp_path / "photos", square, min_samples=3, resize="crop")
    lines = [r.getMessage() for r in caplog.records if "images from" in r.getMessage()]
    assert lines == [f"calibration data: 3 images from {tmp_path / 'photos'}: resized 64×48 → 28×28 (centre-cropped to the aspect ratio, bilinear); RGB → grayscale; unit scaling; HWC layout"]
    assert "_ImageLayout" not in caplog.text
    assert data.batch(0, 3)["image"].shape == (3, 28, 28, 1)
    assert data.fingerprint() != calibration_from_path(tmp_path / "photos", square, min_samples=3, resize="pad").fingerprint()


def test_crop_and_pad_fit_the_aspect_ratio(tmp_path: Path) -> None:
    """A 40×20 image, white left half and black right half, into a 10×10 input."""
    pixels = np.zeros((20, 40), np.uint8)
    pixels[:, :20] = 255
    folder = tmp_path / "wide"
    folder.mkdir()
    Image.fromarray(pixels, "L").save(folder / "a.png")
    square = ModelSignature(inputs=(TensorSpec("image", F32, ("batch", 10, 10, 1)),), outputs=())

    def fitted(mode: str) -> np.ndarray:
        return calibration_from_path(folder, square, min_samples=1, resize=mode).batch(0, 1)["image"][0, ..., 0]

    crop, pad, stretch = fitted("crop"), fitted("pad"), fitted("stretch")
    assert crop[:, :4].min() == 1.0 and crop[:, 6:].max() == 0.0  # centre 20×20: half white, half black, full height
    assert pad[0].max() == 0.0 and pad[-1].max() == 0.0 and pad[4, 1] == 1.0  # black bars above and below
    assert stretch[0, 1] == 1.0 and stretch[0, 8] == 0.0  # whole image squeezed, no bars


def test_shape_bounds_are_the_union_of_the_profiles() -> None:
    from pipeline.stages.calibration import shape_bounds

    profiles = [{"tokens": ((1, 8), (32, 16), (64, 32))}, {"tokens": ((1, 4), (8, 64), (8, 128))}]
    assert shape_bounds(profiles) == {"tokens": ((4,), (128,))}
