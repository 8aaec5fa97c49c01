"""``k8s/preflight.sh`` of the MIG bundle: shellcheck-clean, and run against a stubbed ``kubectl`` (no cluster exists
here: the stub answers the script's read-only ``get`` calls from a described cluster) for a cluster that has what the
pods need, and for each thing missing: a Secret, the mixed MIG strategy, a claim other nodes can mount, a tolerated taint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.mig.bundle import bundle_files
from pipeline.mig.layout import parse_layout
from pipeline.mig.memory import MemoryEstimate, memory_from_onnx
from pipeline.mig.plan import MigPlan, plan_instances
from pipeline.mig.profiles import builtin_gpu
from pipeline.mig.servers import BundleSettings

GIB = 1 << 30

# The stub: every answer comes from $CLUSTER (JSON): nodes with labels, allocatable and taints; secrets; claims.
STUB = r'''#!/usr/bin/env python3
import json, os, sys
cluster = json.load(open(os.environ["CLUSTER"]))
args = [a for a in sys.argv[1:]]
with open(os.environ["CALLS"], "a") as log:
    log.write(" ".join(args) + "\n")
if args[0] != "get":
    sys.exit("stub kubectl: only get is expected, got " + args[0])
kind, rest = args[1], args[2:]
path = next((a.split("=", 1)[1] for a in rest if a.startswith("jsonpath=")), None)
if path is None and "-o" in rest:
    fmt = rest[rest.index("-o") + 1]
    path = fmt.split("=", 1)[1] if fmt.startswith("jsonpath=") else fmt
nodes = cluster["nodes"]
if kind == "nodes" and path == "name":
    print("\n".join("node/" + n for n in nodes))
elif kind == "nodes" and "mig" in path:
    print("\n".join(n + " " + v.get("labels", {}).get("nvidia.com/mig.strategy", "") for n, v in nodes.items()))
elif kind == "nodes" and "allocatable" in path:
    print("\n".join(json.dumps(v.get("allocatable", {})) for v in nodes.values()))
elif kind == "node":
    print("\n".join(t for t in nodes[rest[0]].get("taints", [])))
elif kind == "secret":
    if rest[0] not in cluster["secrets"]:
        sys.exit('Error from server (NotFound): secrets "' + rest[0] + '" not found')
    print(json.dumps({k: "c2VjcmV0" for k in cluster["secrets"][rest[0]]}))
elif kind == "pvc":
    if rest[0] not in cluster["claims"]:
        sys.exit('Error from server (NotFound): persistentvolumeclaims "' + rest[0] + '" not found')
    print(json.dumps(cluster["claims"][rest[0]]))
else:
    sys.exit("stub kubectl: unexpected " + " ".join(args))
'''

GOOD = {
    "nodes": {
        "gpu-a": {"labels": {"nvidia.com/mig.strategy": "mixed"}, "allocatable": {"nvidia.com/mig-2g.35gb": "3", "nvidia.com/mig-1g.18gb.me": "1"},
                  "taints": ["nvidia.com/gpu=present:NoSchedule"]},
        "cpu-b": {"labels": {}, "allocatable": {"cpu": "8"}, "taints": []},
    },
    "secrets": {"triton-admin": ["admin-key"]},
    "claims": {"triton-model-repository": ["ReadOnlyMany"]},
}


@pytest.fixture
def plan(tiny_onnx: Path) -> MigPlan:
    h200 = builtin_gpu("H200-141GB")
    memory = {"tiny_fp32": memory_from_onnx(tiny_onnx, 8), "big": MemoryEstimate("hand-written", GIB, 20 * GIB)}
    return plan_instances(h200, memory, parse_layout("3x2g.35gb,1x1g.18gb+me", h200))


@pytest.fixture
def script(plan: MigPlan, tmp_path: Path) -> Path:
    path = tmp_path / "preflight.sh"
    path.write_text(bundle_files(plan, BundleSettings())["k8s/preflight.sh"])
    return path


def _run(script: Path, cluster: dict, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "kubectl").write_text(STUB)
    (stubs / "kubectl").chmod(0o755)
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", CLUSTER=str(tmp_path / "cluster.json"), CALLS=str(calls), NAMESPACE="serving")
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    return done, calls.read_text().splitlines()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck; scripts/setup.sh does where it can)")
def test_preflight_passes_shellcheck(script: Path) -> None:
    done = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_a_cluster_with_what_the_pods_need_passes_with_read_only_calls(script: Path, tmp_path: Path) -> None:
    done, calls = _run(script, GOOD, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "preflight passed" and not [line for line in lines if line.startswith("FAIL")]
    assert "ok: nvidia.com/mig-1g.18gb.me is advertised" in lines and "ok: node gpu-a: taint nvidia.com/gpu=present:NoSchedule is tolerated" in lines
    assert calls and all(call.startswith("get ") for call in calls)  # read-only: nothing but get
    assert any("secret triton-admin -n serving" in call for call in calls)  # in $NAMESPACE


@pytest.mark.parametrize("break_it, expected", [
    (lambda c: c["secrets"].pop("triton-admin"), "FAIL: secret triton-admin is missing: kubectl create secret generic triton-admin --from-literal=admin-key=..."),
    (lambda c: c["nodes"]["gpu-a"]["labels"].update({"nvidia.com/mig.strategy": "single"}), "FAIL: node gpu-a: MIG strategy single;"),
    (lambda c: c["claims"].update({"triton-model-repository": ["ReadWriteOnce"]}), 'FAIL: claim triton-model-repository has access modes ["ReadWriteOnce"]'),
    (lambda c: c["nodes"]["gpu-a"]["taints"].append("dedicated=ml:NoSchedule"), "FAIL: node gpu-a: taint dedicated=ml:NoSchedule keeps the pods off"),
    (lambda c: c["nodes"]["gpu-a"]["allocatable"].pop("nvidia.com/mig-1g.18gb.me"), "FAIL: no node advertises nvidia.com/mig-1g.18gb.me"),
], ids=["missing secret", "single strategy", "RWO claim", "untolerated taint", "no such MIG device"])
def test_each_thing_missing_fails_in_one_line(script: Path, tmp_path: Path, break_it, expected: str) -> None:  # type: ignore[no-untyped-def]
    cluster = json.loads(json.dumps(GOOD))
    break_it(cluster)
    done, _ = _run(script, cluster, tmp_path)
    fails = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert done.returncode == 1 and len(fails) == 1 and fails[0].startswith(expected), done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("preflight failed")
