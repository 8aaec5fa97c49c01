"""Artifacts → Triton repository (pipeline/build/publish.py): configs, labels, warmup, versions, MIG configs, deploy bundle.

Real files throughout: tiny ONNX models written with onnx.helper, configs parsed back as ModelConfig protobufs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from pipeline.accuracy.evaldata import synthetic_eval_data
from pipeline.build.publish import (
    PublishSettings,
    deploy_dir,
    preferred_batch_sizes,
    published_configs,
    published_from_artifacts,
    repository_from_artifacts,
)
from pipeline.data.artifacts import Artifact
from pipeline.data.tensors import signature_from_onnx
from pipeline.triton.config import parse_config

LABELS = b"cat\ndog\nbird\n"
REPRODUCE = "python -m pipeline build --name tiny"


def softmax_onnx(path: Path) -> Path:
    """x float32 [batch,4] → MatMul → Softmax → probs float32 [batch,3]."""
    weights = numpy_helper.from_array((np.arange(12, dtype=np.float32).reshape(4, 3) - 5.0) / 4.0, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def build(tmp_path: Path) -> tuple[list[Artifact], dict[str, Path], dict[str, np.ndarray]]:
    """Two ONNX artifacts (fp32, fp16: the same tiny file) and a warmup sample."""
    onnx_path = softmax_onnx(tmp_path / "model.onnx")
    artifacts = [Artifact("fp32", "onnx", onnx_path), Artifact("fp16", "onnx", onnx_path)]
    warmup = {"x": np.linspace(0, 1, 4, dtype=np.float32).reshape(1, 4)}
    return artifacts, {"fp32": onnx_path, "fp16": onnx_path}, warmup


def settings(tmp_path: Path, **changes: object) -> PublishSettings:
    labels = tmp_path / "labels.txt"
    labels.write_bytes(LABELS)
    values: dict[str, object] = {
        "model": "tiny", "repository": tmp_path / "site" / "model_repository", "max_batch": 8, "version_policy": "new",
        "labels": labels, "classifier_output": "probs", "mig": None, "image": None,
    }
    values.update(changes)
    return PublishSettings(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("max_batch", "sizes"), [(1, [1]), (5, [2, 5]), (8, [4, 8]), (64, [32, 64])])
def test_preferred_batch_sizes_are_half_and_full(max_batch: int, sizes: list[int]) -> None:
    assert preferred_batch_sizes(max_batch) == sizes


def test_deploy_dir_is_beside_the_repository(tmp_path: Path) -> None:
    assert deploy_dir(tmp_path / "a" / "model_repository") == tmp_path / "a" / "deploy"
    assert deploy_dir(Path("model_repository")) == Path.cwd() / "deploy"  # relative paths from where the user runs


def test_publishes_one_model_per_artifact_with_configs_labels_and_warmup(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    artifacts, onnx_of, warmup = build
    s = settings(tmp_path)
    published = repository_from_artifacts(artifacts, onnx_of, warmup, s, {"note": "unit test"}, REPRODUCE)
    assert published == [s.repository.absolute() / "tiny_fp32" / "1", s.repository.absolute() / "tiny_fp16" / "1"]
    for name in ("tiny_fp32", "tiny_fp16"):
        model_dir = s.repository / name
        cfg = parse_config((model_dir / "config.pbtxt").read_text())
        assert cfg.name == name and cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 8
        assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
        assert [(i.name, list(i.dims)) for i in cfg.input] == [("x", [4])] and [(o.name, list(o.dims)) for o in cfg.output] == [("probs", [3])]
        assert cfg.output[0].label_filename == "labels.txt" and (model_dir / "labels.txt").read_bytes() == LABELS
        assert cfg.model_warmup, "a warmup sample from the real data"
        for sample in cfg.model_warmup:
            data = (model_dir / "warmup" / sample.inputs["x"].input_data_file).read_bytes()
            assert data == warmup["x"][0].astype("<f4").tobytes()
        assert (model_dir / "1" / "model.onnx").read_bytes() == onnx_of["fp32"].read_bytes()
        record = json.loads((model_dir / ".pipeline-report.json").read_text())["versions"]["1"]
        assert record["reproduce"] == REPRODUCE and record["build"] == {"note": "unit test"}
    # the production bundle beside the repository, mounting it
    compose = yaml.safe_load((tmp_path / "site" / "deploy" / "compose.yaml").read_text())
    [volume] = compose["services"]["triton"]["volumes"]
    assert (tmp_path / "site" / "deploy" / volume["source"]).resolve() == s.repository.resolve()


def test_without_labels_there_is_no_classification_output(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    artifacts, onnx_of, warmup = build
    s = settings(tmp_path, labels=None)
    repository_from_artifacts(artifacts[:1], onnx_of, warmup, s, {}, REPRODUCE)
    cfg = parse_config((s.repository / "tiny_fp32" / "config.pbtxt").read_text())
    assert not cfg.output[0].label_filename and not (s.repository / "tiny_fp32" / "labels.txt").exists()


def test_new_policy_adds_a_version_and_replace_keeps_one(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    artifacts, onnx_of, warmup = build
    s = settings(tmp_path)
    repository_from_artifacts(artifacts[:1], onnx_of, warmup, s, {}, REPRODUCE)
    # the same files again: nothing changed, so no new version
    assert repository_from_artifacts(artifacts[:1], onnx_of, warmup, s, {}, REPRODUCE) == [s.repository.absolute() / "tiny_fp32" / "1"]
    other = {k: v + 1 for k, v in warmup.items()}  # another warmup sample changes the model's files
    assert repository_from_artifacts(artifacts[:1], onnx_of, other, s, {}, REPRODUCE) == [s.repository.absolute() / "tiny_fp32" / "2"]
    assert sorted(p.name for p in (s.repository / "tiny_fp32").iterdir() if p.name.isdigit()) == ["1", "2"]
    replaced = settings(tmp_path, version_policy="replace")
    assert repository_from_artifacts(artifacts[:1], onnx_of, warmup, replaced, {}, REPRODUCE) == [s.repository.absolute() / "tiny_fp32" / "1"]
    assert sorted(p.name for p in (s.repository / "tiny_fp32").iterdir() if p.name.isdigit()) == ["1"]


def test_mig_layout_adds_per_profile_configs_and_a_launch_bundle(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    artifacts, onnx_of, warmup = build
    s = settings(tmp_path, mig="H200-141GB:3x2g.35gb,1x1g.18gb")
    repository_from_artifacts(artifacts, onnx_of, warmup, s, {}, REPRODUCE)
    for name in ("tiny_fp32", "tiny_fp16"):
        profiles = {p.stem: parse_config(p.read_text()) for p in (s.repository / name / "configs").glob("*.pbtxt")}
        assert set(profiles) == {"2g.35gb", "1g.18gb"}
        for cfg in profiles.values():
            assert cfg.name == name and cfg.instance_group[0].count >= 1 and cfg.instance_group[0].kind == cfg.instance_group[0].KIND_GPU
    launch = tmp_path / "site" / "deploy" / "mig" / "launch-mig.sh"
    assert subprocess.run(["bash", "-n", str(launch)], capture_output=True, check=False).returncode == 0
    assert "--model-config-name" in launch.read_text()


def test_publish_stage_warms_up_with_the_first_sample_and_records_the_versions(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    artifacts, onnx_of, _ = build
    s = settings(tmp_path)
    data = synthetic_eval_data(signature_from_onnx(onnx_of["fp32"]), 5, seed=7)
    dst = published_from_artifacts(artifacts, data, tmp_path / "published.json", settings=s, onnx_of=onnx_of, report={}, reproduce=REPRODUCE)
    assert json.loads(dst.read_text()) == [str(s.repository.absolute() / n / "1") for n in ("tiny_fp32", "tiny_fp16")]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".published")] == []  # written atomically
    cfg = parse_config((s.repository / "tiny_fp32" / "config.pbtxt").read_text())
    warmup_file = s.repository / "tiny_fp32" / "warmup" / cfg.model_warmup[0].inputs["x"].input_data_file
    assert warmup_file.read_bytes() == data.inputs["x"][0].astype("<f4").tobytes()
    # the files whose presence lets the stage cache skip this stage next time
    assert published_configs(artifacts, s) == [s.repository / "tiny_fp32" / "config.pbtxt", s.repository / "tiny_fp16" / "config.pbtxt"]
    assert all(p.is_file() for p in published_configs(artifacts, s))
