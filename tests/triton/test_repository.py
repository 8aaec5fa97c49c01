"""Atomic publishing into a real model repository on disk (real files, real protobuf, real SIGKILL)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from publish_harness import LABELS, publish_two, two_io_onnx

from pipeline.core.errors import PipelineError
from pipeline.triton.config import WARMUP_DIR, parse_config, warmup_input_bytes
from pipeline.triton.repository import OWNED, REPORT, read_repository

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("publish_harness.py")
MODELS = ("digits_fp16", "digits_fp32")


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_io_onnx(tmp_path_factory.mktemp("onnx") / "two_io.onnx")


def staging(repo: Path) -> Path:
    return repo.parent / f".{repo.name}.pipeline-staging"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_complete(repo: Path, model_sha: str) -> dict[str, tuple[int, ...]]:
    """What Triton needs from every model dir: a parsing config named like the dir, the model file
    (byte-identical to the artifact) in every version, and the labels and warmup files it names."""
    models = read_repository(repo)
    assert sorted(models) == list(MODELS)
    for name, info in models.items():
        cfg = parse_config((info.path / "config.pbtxt").read_text())
        assert cfg.name == name
        for version in info.versions:
            assert sha(info.path / str(version) / cfg.default_model_filename) == model_sha, (name, version)
        assert (info.path / cfg.output[0].label_filename).read_bytes() == LABELS
        for sample in cfg.model_warmup:
            for item in sample.inputs.values():
                assert (info.path / WARMUP_DIR / item.input_data_file).stat().st_size == warmup_input_bytes(item)
        owned = json.loads((info.path / OWNED).read_text())
        assert set(owned["versions"]) <= set(info.versions)
        assert sorted(json.loads((info.path / REPORT).read_text())["versions"], key=int) == [str(v) for v in owned["versions"]]
    return {name: info.versions for name, info in models.items()}


def test_new_policy_adds_versions_and_records_what_it_wrote(onnx_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    first = publish_two(onnx_file, repo, "new", report={"accuracy": {"fp32": 0.98}})
    assert first == [repo / "digits_fp32" / "1", repo / "digits_fp16" / "1"]
    publish_two(onnx_file, repo, "new", delay_us=200)
    assert assert_complete(repo, sha(onnx_file)) == {"digits_fp16": (1, 2), "digits_fp32": (1, 2)}
    owned = json.loads((repo / "digits_fp32" / OWNED).read_text())
    assert owned == {"versions": [1, 2], "files": ["1/model.onnx", "2/model.onnx", "config.pbtxt", "labels.txt", "warmup/ids.bin", "warmup/image.bin"]}
    report = json.loads((repo / "digits_fp32" / REPORT).read_text())
    assert report["versions"]["1"]["build"] == {"accuracy": {"fp32": 0.98}}
    assert report["versions"]["2"]["reproduce"] == "python -m pipeline build --name digits"
    assert report["versions"]["2"]["artifact"]["sha256"] == sha(onnx_file)
    # Staging happened beside the repository, never inside it, and is gone.
    assert not staging(repo).exists()
    assert sorted(p.name for p in repo.iterdir()) == list(MODELS)


def test_replace_removes_only_the_versions_the_pipeline_wrote(onnx_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    publish_two(onnx_file, repo, "new")
    publish_two(onnx_file, repo, "new", delay_us=200)
    mine = repo / "digits_fp32"
    (mine / "9").mkdir()
    (mine / "9" / "model.onnx").write_bytes(onnx_file.read_bytes())  # a version someone else put there
    (mine / "NOTES.md").write_text("hand-written notes")
    (mine / "configs").mkdir()
    (mine / "configs" / "a100.pbtxt").write_text('name: "digits_fp32"\n')
    (mine / "scratch" / "empty").mkdir(parents=True)
    (mine / "0").mkdir()  # not a version for Triton (leading "0"), and not the pipeline's
    (repo / "README.md").write_text("repository readme")
    publish_two(onnx_file, repo, "replace")
    assert read_repository(repo)["digits_fp32"].versions == (1, 9)
    assert (mine / "NOTES.md").read_text() == "hand-written notes"
    assert (mine / "configs" / "a100.pbtxt").exists() and (repo / "README.md").exists()
    assert (mine / "scratch" / "empty").is_dir() and (mine / "0").is_dir()
    assert json.loads((mine / OWNED).read_text())["versions"] == [1]
    assert sorted(json.loads((mine / REPORT).read_text())["versions"]) == ["1"]
    assert sorted(p.name for p in (repo / "digits_fp16").iterdir() if p.name.isdigit()) == ["1"]


def test_stale_pipeline_files_go_foreign_files_stay(onnx_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    publish_two(onnx_file, repo, "new")
    (repo / "digits_fp32" / "warmup" / "mine.bin").write_bytes(b"user sample")
    publish_two(onnx_file, repo, "new", labels=False)
    assert not (repo / "digits_fp32" / "labels.txt").exists()  # written by the pipeline, no longer produced
    assert (repo / "digits_fp32" / "warmup" / "mine.bin").read_bytes() == b"user sample"
    assert "labels.txt" not in json.loads((repo / "digits_fp32" / OWNED).read_text())["files"]


def test_never_overwrites_a_file_it_did_not_write(onnx_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    (repo / "digits_fp32").mkdir(parents=True)
    (repo / "digits_fp32" / "labels.txt").write_text("my labels\n")
    with pytest.raises(PipelineError, match=r"digits_fp32/labels.txt was not written by the pipeline"):
        publish_two(onnx_file, repo, "new")
    assert sorted(p.name for p in (repo / "digits_fp32").iterdir()) == ["labels.txt"]
    assert not (repo / "digits_fp16").exists()  # nothing swapped in: every model is staged first
    assert not staging(repo).exists()


def test_replace_refuses_a_foreign_version_1_and_foreign_files_in_its_versions(onnx_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    (repo / "digits_fp32" / "1").mkdir(parents=True)
    (repo / "digits_fp32" / "1" / "model.onnx").write_bytes(b"theirs")
    with pytest.raises(PipelineError, match="1 was not written by the pipeline, so policy 'replace'"):
        publish_two(onnx_file, repo, "replace")
    assert (repo / "digits_fp32" / "1" / "model.onnx").read_bytes() == b"theirs"

    other = tmp_path / "other"
    publish_two(onnx_file, other, "new")
    (other / "digits_fp16" / "1" / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match=r"digits_fp16/1 holds files the pipeline did not write \(1/notes.txt\)"):
        publish_two(onnx_file, other, "replace", delay_us=200)
    assert (other / "digits_fp16" / "1" / "notes.txt").exists()


def test_failed_publish_leaves_the_repository_as_it_was(onnx_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    publish_two(onnx_file, repo, "new")
    before = {p.relative_to(repo): p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    (repo / "digits_fp16" / OWNED).write_text("{broken")
    with pytest.raises(PipelineError, match="is unreadable, so the pipeline cannot tell its files from yours"):
        publish_two(onnx_file, repo, "new")
    (repo / "digits_fp16" / OWNED).write_bytes(before[Path("digits_fp16") / OWNED])
    assert {p.relative_to(repo): p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    assert not staging(repo).exists()


def test_leftover_staging_folders_are_removed(onnx_file: Path, tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    leftover = staging(repo) / "digits_fp32.4242.deadbeef" / "1"
    leftover.mkdir(parents=True)
    (leftover / "model.onnx").write_bytes(b"half written")
    publish_two(onnx_file, repo, "new")
    assert not staging(repo).exists()
    assert_complete(repo, sha(onnx_file))


def test_extra_files_cannot_create_versions_or_escape(onnx_file: Path, tmp_path: Path) -> None:
    from pipeline.data.artifacts import Artifact
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.triton.config import model_config_from_artifact
    from pipeline.triton.repository import publish_repository

    artifact = Artifact("fp32", "onnx", onnx_file)
    cfg = model_config_from_artifact(artifact, name="digits_fp32", signature=signature_from_onnx(onnx_file), max_batch=8)
    for rel, message in [("3/x.bin", "would sit in a version directory"), ("../x", "not a plain relative path"), ("config.pbtxt", "written by the pipeline itself")]:
        with pytest.raises(PipelineError, match=message):
            publish_repository([artifact], model="digits", repository=tmp_path / "r", configs={"digits_fp32": cfg}, extra_files={"digits_fp32": {rel: b"x"}})
    with pytest.raises(PipelineError, match="a100.pbtxt of 'digits_fp32' names model 'other'"):
        publish_repository([artifact], model="digits", repository=tmp_path / "r", configs={"digits_fp32": cfg}, extra_files={"digits_fp32": {"configs/a100.pbtxt": b'name: "other"'}})
    with pytest.raises(PipelineError, match="is not a valid Triton model config"):
        publish_repository([artifact], model="digits", repository=tmp_path / "r", configs={"digits_fp32": cfg}, extra_files={"digits_fp32": {"configs/a100.pbtxt": b"max_batch_size: many"}})
    with pytest.raises(PipelineError, match="no config for Triton model 'digits_fp32'"):
        publish_repository([artifact], model="digits", repository=tmp_path / "r", configs={})
    with pytest.raises(PipelineError, match="labels file labels.txt, which is not published"):
        labelled = model_config_from_artifact(artifact, name="digits_fp32", signature=signature_from_onnx(onnx_file), max_batch=8, labels_file="labels.txt", classifier_output="probs")
        publish_repository([artifact], model="digits", repository=tmp_path / "r", configs={"digits_fp32": labelled})


def test_unchanged_models_keep_their_version_and_only_changed_ones_get_a_new_one(
    onnx_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As a rebuild where only INT8 changed: the byte-identical models are not republished."""
    from pipeline.data.artifacts import Artifact
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.triton.config import model_config_from_artifact
    from pipeline.triton.repository import publish_repository

    repo = tmp_path / "model_repository"
    publish_two(onnx_file, repo, "new")
    before = {p: p.stat().st_mtime_ns for p in repo.rglob("*") if p.is_file()}
    with caplog.at_level("INFO"):
        assert publish_two(onnx_file, repo, "new") == [repo / "digits_fp32" / "1", repo / "digits_fp16" / "1"]
    assert {p: p.stat().st_mtime_ns for p in repo.rglob("*") if p.is_file()} == before  # nothing rewritten
    assert "digits_fp32 unchanged: keeps serving version 1" in caplog.text
    assert publish_two(onnx_file, repo, "replace") == [repo / "digits_fp32" / "1", repo / "digits_fp16" / "1"]

    # One model's artifact changes (another file, other bytes): only it gets version 2.
    changed = two_io_onnx(tmp_path / "changed.onnx", pad_bytes=64)
    cfg = model_config_from_artifact(Artifact("int8", "onnx", changed), name="digits_int8", signature=signature_from_onnx(changed), max_batch=8)
    publish_repository([Artifact("int8", "onnx", changed)], model="digits", repository=repo, configs={"digits_int8": cfg})
    cfg16 = model_config_from_artifact(Artifact("fp16", "onnx", changed), name="digits_fp16", signature=signature_from_onnx(changed), max_batch=8)
    cfg16.CopyFrom(parse_config((repo / "digits_fp16" / "config.pbtxt").read_text()))
    extra = {"digits_fp16": {rel: (repo / "digits_fp16" / rel).read_bytes() for rel in ("labels.txt", "warmup/ids.bin", "warmup/image.bin")}}
    out = publish_repository([Artifact("fp16", "onnx", changed)], model="digits", repository=repo, configs={"digits_fp16": cfg16}, extra_files=extra)
    assert out == [repo / "digits_fp16" / "2"]
    assert read_repository(repo)["digits_fp32"].versions == (1,) and read_repository(repo)["digits_fp16"].versions == (1, 2)
    # A labels file that changes is a change too.
    extra["digits_fp16"]["labels.txt"] = b"other\n" * 10
    assert publish_repository([Artifact("fp16", "onnx", changed)], model="digits", repository=repo, configs={"digits_fp16": cfg16}, extra_files=extra) == [repo / "digits_fp16" / "3"]


def test_read_repository_explains_a_missing_or_empty_repository(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"nope does not exist — build it first: python -m pipeline build"):
        read_repository(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("models go here")
    with pytest.raises(PipelineError, match=r"empty has no models — build it first: python -m pipeline build"):
        read_repository(tmp_path / "empty")


@pytest.mark.slow
def test_sigkill_mid_publish_leaves_a_complete_repository(tmp_path: Path) -> None:
    """Kill a looping publisher (tests/triton/publish_harness.py) at random moments; after every kill
    each model directory must still be complete, and the next publish must clean up the leftovers."""
    repo, work = tmp_path / "model_repository", tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    rng = random.Random(7)
    interrupted = 0
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, str(HARNESS), str(repo), str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        padded_sha = sha(work / "padded.onnx")
        assert_complete(repo, padded_sha)
        interrupted += staging(repo).exists()
    # Kills that landed mid-publish leave a staging folder behind; without any, this test proved nothing.
    assert interrupted >= 2, interrupted
    publish_two(work / "padded.onnx", repo, "new")
    assert not staging(repo).exists()
    assert_complete(repo, padded_sha)
