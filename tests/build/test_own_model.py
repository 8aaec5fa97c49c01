"""A user's own model end to end, as a new user runs it: an own .keras file with own calibration and
evaluation .npz files, every command run from another directory with relative paths."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import cli

pytestmark = pytest.mark.slow


def _write_tabular(folder: Path) -> None:
    """A 12-feature, 3-class classifier trained for a few seconds, with 512 calibration and 600 labeled eval samples."""
    import keras

    rng = np.random.default_rng(0)
    weights = rng.normal(size=(12, 3))

    def samples(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(n, 12)).astype(np.float32)
        return x, (x @ weights).argmax(1).astype(np.int64)

    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,), name="features")
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="probs")(hidden))
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = samples(3000)
    model.fit(x, y, epochs=8, verbose=0)
    model.save(folder / "tabular.keras")
    (folder / "data").mkdir()
    np.savez(folder / "data" / "tab_calib.npz", features=samples(512)[0])
    x_eval, y_eval = samples(600)
    np.savez(folder / "data" / "tab_eval.npz", features=x_eval, labels=y_eval)


def test_own_model_build_verify_loadtest_and_mig_bundle_from_another_directory(tmp_path: Path) -> None:
    _write_tabular(tmp_path)
    work = tmp_path / "work"
    work.mkdir()

    build = cli("build", "--fp16", "--int8", "--model", "../tabular.keras", "--calibration", "../data/tab_calib.npz",
                "--eval-data", "../data/tab_eval.npz", "--verify-served", cwd=work)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "served through Triton vs in process" in build.stdout  # the summary is printed, served check included
    repository = work / "model_repository"
    models = ["tabular_fp16", "tabular_fp32", "tabular_int8", "tabular_int8cpu"]  # int8cpu: the CPU INT8, on by default with --int8
    assert sorted(p.name for p in repository.iterdir() if p.is_dir()) == models
    served = json.loads((work / "build" / "tabular" / "served.json").read_text())
    assert {m["model"]: m["samples"] for m in served["models"]} == dict.fromkeys(models, 600)

    # verify finds the evaluation data the build recorded: no --eval-data, no calibration/tabular/ folder.
    verify = cli("verify", cwd=work)
    assert verify.returncode == 0, verify.stderr[-3000:]
    report = json.loads((work / "build" / "verify.json").read_text())
    assert len(report["models"]) == 4 and all(m["passed"] and m["samples"] == 600 for m in report["models"])

    load = cli("loadtest", "--model", "tabular_int8", "--concurrency", "4", "--window-ms", "300", "--warmup-ms", "200",
               "--max-seconds", "6", "--report-dir", "reports/own", cwd=work)
    assert load.returncode == 0, load.stderr[-3000:]
    assert (work / "reports" / "own").is_dir()

    plan = cli("mig-plan", "--gpu", "A100-40GB", "--layout", "3x2g.10gb,1x1g.5gb", "--repository", "model_repository",
               "--bundle", "migbundle", cwd=work)
    assert plan.returncode == 0, plan.stderr[-3000:]
    script = work / "migbundle" / "launch-mig.sh"
    devices = tmp_path / "devices.txt"
    devices.write_text(
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n"
        "  MIG 2g.10gb      Device  0: (UUID: MIG-aaaaaaaa-0000-0000-0000-000000000001)\n"
        "  MIG 1g.5gb       Device  1: (UUID: MIG-aaaaaaaa-0000-0000-0000-000000000002)\n"
    )
    # The dry run from yet another directory: the bundle must point at this repository, not ./model_repository.
    dry = subprocess.run(["bash", str(script), "--dry-run"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "MIG_DEVICES_FILE": str(devices), "TRITON_ADMIN_KEY": "k"})
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert str(repository.resolve()) in dry.stdout
    compose_text = (work / "migbundle" / "docker-compose.yml").read_text()
    compose = yaml.safe_load(compose_text)
    sources = {volume["source"] for service in compose["services"].values() for volume in service["volumes"]}
    # the compose file mounts this repository, named relative to the bundle (it moves with it), never ./model_repository
    assert {(work / "migbundle" / source).resolve() for source in sources} == {repository.resolve()}, sources
    assert "admin-key=$${TRITON_ADMIN_KEY}" in compose_text  # the key comes from the container's environment, never the file
