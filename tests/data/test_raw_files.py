"""Raw inputs as users bring them: image folders (the ImageFolder layout) and files of sentences, and the one-line
refusals of what cannot be read as such."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from pipeline.core.errors import PipelineError
from pipeline.data.raw_files import image_files, is_image_folder, is_text_file, text_samples


def _png(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 3), (10, 20, 30)).save(path)
    return path


def test_image_folder_labels_by_sub_folder_and_skips_hidden_files(tmp_path: Path) -> None:
    _png(tmp_path / "cat" / "1.png")
    _png(tmp_path / "dog" / "2.PNG")
    _png(tmp_path / "dog" / "._2.png")  # a macOS resource fork
    _png(tmp_path / "__MACOSX" / "dog" / "x.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    files = image_files(tmp_path, ["bird", "cat", "dog"])
    assert [p.name for p in files.files] == ["1.png", "2.PNG"] and files.labels == (1, 2)
    assert image_files(tmp_path).labels == (0, 1) and is_image_folder(tmp_path)


def test_image_folder_refusals(tmp_path: Path) -> None:
    _png(tmp_path / "mixed" / "cat" / "1.png")
    _png(tmp_path / "mixed" / "loose.png")
    with pytest.raises(PipelineError, match="both images .* and sub-folders"):
        image_files(tmp_path / "mixed")
    _png(tmp_path / "unknown" / "zebra" / "1.png")
    with pytest.raises(PipelineError, match=r"sub-folders \['zebra'\] .* name no class"):
        image_files(tmp_path / "unknown", ["cat", "dog"])
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(PipelineError, match="holds no JPEG or PNG file in its sub-folders"):
        image_files(tmp_path / "empty")


def test_sentences_from_csv_and_text(tmp_path: Path) -> None:
    csv_file = tmp_path / "s.csv"
    csv_file.write_bytes('\ufefftext,label\n"Hello, world!",dog\nCafé,0\n'.encode("utf-8"))  # a spreadsheet's byte-order mark
    samples = text_samples(csv_file, ["cat", "dog"])
    assert samples.texts == ("Hello, world!", "Café") and samples.labels == (1, 0) and is_text_file(csv_file)
    unlabeled = tmp_path / "s2.csv"
    unlabeled.write_text("text\nOne\nTwo\n")
    assert text_samples(unlabeled).labels is None
    lines = tmp_path / "s.txt"
    lines.write_text("First sentence.\n\nSecond one\n")
    assert text_samples(lines).texts == ("First sentence.", "Second one")


@pytest.mark.parametrize("content, classes, problem", [
    (b"sentence,label\nx,0\n", None, "has no 'text' column"),
    (b"text,label\nx,7\n", ["a", "b"], "label 7 .* names no class of the 2"),
    (b"text,label\nx,zebra\n", ["a", "b"], "neither a class index nor a class"),
    ("text\ncaf\u00e9\n".encode("latin-1"), None, "is not UTF-8 text"),
    (b"text,label\n", None, "holds no sentence|has no 'text' column"),
])
def test_sentence_file_refusals(tmp_path: Path, content: bytes, classes: list[str] | None, problem: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(PipelineError, match=problem):
        text_samples(path, classes)


def test_an_image_too_thin_to_pad_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """tf.image.resize_with_pad refuses a 1000×3 picture padded to 24×24 (it shrinks to no rows): so does the reference."""
    from PIL import Image

    from pipeline.core.errors import PipelineError
    from pipeline.data.raw_files import ImagePreprocess, reference_tensor

    Image.new("RGB", (1000, 3), (9, 9, 9)).save(tmp_path / "thin.png")
    pre = ImagePreprocess("image", 24, 24, 3, False, "pad", (1 / 255,) * 3, (0.0,) * 3, "test")
    with pytest.raises(PipelineError, match=r"cannot read image .*thin.png.*: a 1000×3 image shrinks to nothing when padded to 24×24"):
        reference_tensor(tmp_path / "thin.png", pre)
