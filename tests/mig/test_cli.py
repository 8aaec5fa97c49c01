"""`mig-plan` end to end through its argparse registration (the lead wires it into pipeline.cli)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from pipeline.commands.mig_plan import register
from pipeline.core.errors import PipelineError
from pipeline.triton.config import config_text

from .conftest import NVIDIA_SMI_L_H200, tiny_mlp


def mig_plan(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="pipeline")
    register(parser.add_subparsers())
    args = parser.parse_args(["mig-plan", *argv])
    return args.handler(args)


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich reads it: no wrapped table cells


def test_plan_from_recorded_nvidia_smi_and_onnx(fixtures_dir: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = mig_plan(
        "--from-nvidia-smi", str(fixtures_dir / "nvidia-smi-query-h200.csv"),
        "--from-nvidia-smi", str(fixtures_dir / "nvidia-smi-mig-lgip-h200.txt"),
        "--onnx", str(tiny_onnx), "--max-batch", "8", "--layout", "3x2g.35gb,1x1g.18gb",
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "H200-141GB, layout 3x2g.35gb,1x1g.18gb" in out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]] for line in out.splitlines()
            if line.startswith("│")}
    assert rows["2g.35gb"][:3] == ["3", "32", "32.50"]
    assert rows["1g.18gb"][:3] == ["1", "16", "16.00"]
    assert rows["tiny"] == ["4", "2"]  # instances per device: 2g.35gb, 1g.18gb
    assert "SMs // 8" in out


def test_large_engine_is_excluded_from_small_profiles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hand-written engine metadata (TensorRT cannot build an engine on this machine)."""
    meta = tmp_path / "big.plan.json"
    meta.write_text(json.dumps({"device_memory_bytes": 20 << 30, "weights_bytes": 2 << 30}))
    assert mig_plan("--gpu", "H200-141GB", "--engine-metadata", str(meta)) == 0
    out = capsys.readouterr().out
    assert "excluded big from 1g.18gb: too large for 1g.18gb" in out
    assert "excluded big from 1g.35gb" not in out


def test_layout_from_nvidia_smi_l_and_bundle_with_uuids(tmp_path: Path, tiny_onnx: Path) -> None:
    listing = tmp_path / "L.txt"
    listing.write_text(NVIDIA_SMI_L_H200)
    bundle = tmp_path / "bundle"
    assert mig_plan("--gpu", "H200-141GB", "--from-nvidia-smi", str(listing), "--onnx", str(tiny_onnx),
                    "--max-batch", "8", "--bundle", str(bundle)) == 0
    script = bundle / "launch-mig.sh"
    assert script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True)
    compose = yaml.safe_load((bundle / "docker-compose.yml").read_text())
    ids = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0] for s in compose["services"].values()]
    assert ids[3] == "MIG-3d4e5f6a-7b8c-5d9e-9f0a-2b3c4d5e6f7a"
    assert sorted(p.name for p in (bundle / "k8s").glob("*.yaml")) == ["triton-mig-1g-18gb.yaml", "triton-mig-2g-35gb.yaml"]
    monitor = yaml.safe_load((bundle / "k8s" / "monitoring" / "servicemonitor.yaml").read_text())
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # what that chart selects by, by default
    assert mig_plan("--gpu", "H200-141GB", "--from-nvidia-smi", str(listing), "--onnx", str(tiny_onnx), "--max-batch", "8",
                    "--bundle", str(bundle), "--monitor-label", "release=prom", "--monitor-label", "team=ml",
                    "--engine-build-s", "900") == 0
    monitor = yaml.safe_load((bundle / "k8s" / "monitoring" / "servicemonitor.yaml").read_text())
    assert (monitor["metadata"]["labels"]["release"], monitor["metadata"]["labels"]["team"]) == ("prom", "ml")
    deployment = next(yaml.safe_load_all((bundle / "k8s" / "triton-mig-1g-18gb.yaml").read_text()))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 120 + 900  # one model on the profile
    with pytest.raises(PipelineError, match="is not KEY=VALUE"):
        mig_plan("--gpu", "H200-141GB", "--onnx", str(tiny_onnx), "--max-batch", "8", "--monitor-label", "release")
    with pytest.raises(PipelineError, match="differs from the MIG devices"):
        mig_plan("--gpu", "H200-141GB", "--from-nvidia-smi", str(listing), "--onnx", str(tiny_onnx),
                 "--max-batch", "8", "--layout", "7x1g.18gb")


def test_repository_mode_writes_profile_configs(tmp_path: Path, tiny_onnx: Path) -> None:
    model_dir = tmp_path / "repo" / "tiny_fp32"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(tiny_onnx.read_bytes())
    base = ModelConfig(name="tiny_fp32", platform="onnxruntime_onnx", max_batch_size=16)
    base.input.add(name="image", data_type=DataType.TYPE_FP32, dims=[16])
    base.output.add(name="probs", data_type=DataType.TYPE_FP32, dims=[10])
    (model_dir / "config.pbtxt").write_text(config_text(base))
    bundle = tmp_path / "bundle"
    assert mig_plan("--gpu", "h200-141gb", "--layout", "1x3g.71gb,1x4g.71gb", "--repository", str(tmp_path / "repo"),
                    "--bundle", str(bundle)) == 0
    written = sorted(p.name for p in (model_dir / "configs").iterdir())
    assert written == ["3g.71gb.pbtxt", "4g.71gb.pbtxt"]
    three = text_format.Parse((model_dir / "configs" / "3g.71gb.pbtxt").read_text(), ModelConfig())
    assert three.instance_group[0].count == 7 and three.max_batch_size == 16
    k8s = list(yaml.safe_load_all((bundle / "k8s" / "triton-mig-3g-71gb.yaml").read_text()))
    assert "--model-config-name=3g.71gb" in k8s[0]["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "H200-141GB", "--layout", "8x1g.18gb", "--onnx", "{onnx}", "--max-batch", "8"], "at most 7"),
        (["--gpu", "H200-141GB", "--layout", "2x3g.71gb,1x2g.35gb", "--onnx", "{onnx}", "--max-batch", "8"],
         "8 compute slices"),
        (["--gpu", "H200-141GB"], "say what to plan"),
        (["--gpu", "H200-141GB", "--onnx", "{onnx}"], "dynamic batch axis"),
        (["--onnx", "{onnx}", "--max-batch", "8"], "no GPU given"),
        (["--gpu", "A100-40GB", "--from-nvidia-smi", "{query}", "--onnx", "{onnx}", "--max-batch", "8"],
         "disagrees with the nvidia-smi CSV"),
    ],
)
def test_user_errors(argv: list[str], message: str, tiny_onnx: Path, fixtures_dir: Path) -> None:
    filled = [a.format(onnx=tiny_onnx, query=fixtures_dir / "nvidia-smi-query-h200.csv") for a in argv]
    with pytest.raises(PipelineError, match=message):
        mig_plan(*filled)


def test_many_models_with_long_names_keep_their_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Models are rows of the instances table: 12 long model names are not cut to 'cnn_f…' in the
    160 columns the console uses off a terminal (the table with one column per model was)."""
    repo = tmp_path / "repo"
    names = [f"cnn_fashion_classifier_{i}_fp16" for i in range(12)]
    for name in names:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(tiny_mlp(tmp_path / "m.onnx").read_bytes())
        base = ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=8)
        (repo / name / "config.pbtxt").write_text(config_text(base))
    assert mig_plan("--gpu", "H200-141GB", "--layout", "3x2g.35gb,1x1g.18gb+me", "--repository", str(repo)) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 160
    flat = "".join(line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│"))
    assert all(name in flat for name in names)  # folded onto two lines at most, never cut


def test_nvidia_smi_l_names_the_gpu(tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "L.txt"
    listing.write_text(NVIDIA_SMI_L_H200)
    assert mig_plan("--from-nvidia-smi", str(listing), "--onnx", str(tiny_onnx), "--max-batch", "8") == 0
    assert "H200-141GB, layout 3x2g.35gb,1x1g.18gb" in capsys.readouterr().out
    a100 = tmp_path / "a100.txt"
    a100.write_text("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f6e7d8c-0000-1111-2222-333344445555)\n"
                    "  MIG 3g.20gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-5ccc-8ddd-eeeeeeeeeeee)\n")
    assert mig_plan("--from-nvidia-smi", str(a100), "--onnx", str(tiny_onnx), "--max-batch", "8") == 0
    assert "A100-40GB, layout 1x3g.20gb" in capsys.readouterr().out


def test_bundle_serves_the_given_repository_from_any_directory(tmp_path: Path, tiny_onnx: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """mig-plan --repository migrepo --bundle migbundle, relative to the current directory: the launch
    script (run from elsewhere) and the compose mount both point at migrepo, not ./model_repository."""
    work = tmp_path / "work"
    model_dir = work / "migrepo" / "tiny_fp32"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(tiny_onnx.read_bytes())
    (model_dir / "config.pbtxt").write_text(config_text(ModelConfig(name="tiny_fp32", platform="onnxruntime_onnx", max_batch_size=8)))
    monkeypatch.chdir(work)
    assert mig_plan("--gpu", "A100-40GB", "--layout", "3x2g.10gb,1x1g.5gb", "--repository", "migrepo", "--bundle", "migbundle") == 0
    compose = yaml.safe_load((work / "migbundle" / "docker-compose.yml").read_text())
    for service in compose["services"].values():
        assert (work / "migbundle" / service["volumes"][0]["source"]).resolve() == (work / "migrepo").resolve()
    listing = tmp_path / "L.txt"
    listing.write_text("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f6e7d8c-0000-1111-2222-333344445555)\n"
                       "  MIG 1g.5gb      Device  0: (UUID: MIG-aaaaaaaa-bbbb-5ccc-8ddd-eeeeeeeeeeee)\n")
    env = {"PATH": "/usr/bin:/bin", "TRITON_ADMIN_KEY": "k", "MIG_DEVICES_FILE": str(listing)}
    dry = subprocess.run(["bash", str(work / "migbundle" / "launch-mig.sh"), "--dry-run"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert f"--model-repository={(work / 'migrepo').resolve()} " in dry


def test_repository_mode_names_the_model_it_cannot_size(tmp_path: Path) -> None:
    """A sequence model's ONNX variant (dynamic length) cannot be sized: the one line names that model
    among the repository's, and the fix works in repository mode too."""
    import onnx

    model = onnx.load(str(tiny_mlp(tmp_path / "tiny.onnx")))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "length"
    model_dir = tmp_path / "repo" / "seq_fp32"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    base = ModelConfig(name="seq_fp32", platform="onnxruntime_onnx", max_batch_size=16)
    base.input.add(name="image", data_type=DataType.TYPE_FP32, dims=[-1])
    base.output.add(name="probs", data_type=DataType.TYPE_FP32, dims=[10])
    (model_dir / "config.pbtxt").write_text(config_text(base))
    with pytest.raises(PipelineError, match=r"^model seq_fp32: input 'image' has a dynamic axis 1 \('length'\)") as caught:
        mig_plan("--gpu", "H200-141GB", "--repository", str(tmp_path / "repo"))
    assert caught.value.fix and "--engine-metadata <plan>.json" in caught.value.fix
