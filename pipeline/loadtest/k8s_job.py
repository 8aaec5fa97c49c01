"""``loadtest --k8s-job DIR``: a Kubernetes Indexed Job whose pods are the shards of one load test.

Pod i runs ``python -m pipeline loadtest ... --shard i/N --start-at T --shard-output /results/<job>``
against the Triton Service, so all N pods start every point together (wall clock) and each writes
its raw results to the shared results volume (a ReadWriteMany PersistentVolumeClaim); a pod that
mounts it then runs ``loadtest --merge /results/<job>``. A failed pod is not retried
(``backoffLimit: 0``): a retry would run out of step with the others, so its points are merged
as incomplete instead. The pods spread over nodes (one load generator per machine where possible).
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.atomic import write_text_atomic
from pipeline.core.errors import require

RESULTS_MOUNT = "/results"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def iso_start(start_at: float) -> str:
    """Seconds since the epoch as the ``--start-at`` text the pods get (UTC, whole seconds)."""
    return _dt.datetime.fromtimestamp(start_at, _dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def job_manifests(name: str, image: str, pods: int, loadtest_args: list[str], start: str | None, results_claim: str) -> list[dict[str, Any]]:
    """The results PersistentVolumeClaim and the Indexed Job (pods × the shard command); ``start`` is the pods'
    ``--start-at`` (a time, or ``ready+SECONDS``: the barrier on the results volume they share). ``start`` None: one
    pod runs ``loadtest_args`` whole (an MLPerf scenario: LoadGen is one process), its reports and LoadGen's logs
    written to ``/results/<name>``."""
    require(bool(_DNS_LABEL.match(name)) and len(name) <= 52, f"--job-name '{name}' is not a Kubernetes name",
            "use lower-case letters, digits and '-', at most 52 characters, e.g. --job-name triton-loadtest")
    require(pods >= 1, f"--pods must be at least 1, got {pods}", "e.g. --pods 4")
    require(bool(image), "--k8s-job needs the image the pods run", "pass --image with an image that has this project installed")
    require(start is not None or pods == 1, f"an MLPerf scenario runs in one pod, not {pods}", "leave out --pods (or pass --pods 1)")
    labels = {"app.kubernetes.io/name": "triton-loadtest", "app.kubernetes.io/instance": name}
    if start is None:
        args = [*loadtest_args, "--report-dir", f"{RESULTS_MOUNT}/{name}"]
    else:
        args = [*loadtest_args, "--shard", f"$(SHARD_INDEX)/{pods}", "--start-at", start, "--shard-output", f"{RESULTS_MOUNT}/{name}"]
    container = {
        "name": "loadtest",
        "image": image,
        "command": ["python", "-m", "pipeline", "loadtest"],
        "args": args,
        "env": [{"name": "SHARD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": _INDEX_ANNOTATION}}}] if start is not None else [],
        # one load-generating process drives about one core
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_MOUNT}],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [{"name": "results", "persistentVolumeClaim": {"claimName": results_claim}}],
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": labels},
                    }],
                },
            },
        },
    }  # fmt: skip
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": results_claim, "labels": {"app.kubernetes.io/name": "triton-loadtest"}},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    return [claim, job]


def write_job(directory: Path, documents: list[dict[str, Any]]) -> list[Path]:
    """``results-pvc.yaml`` and ``loadtest-job.yaml`` in ``directory``."""
    claim, job = documents
    return [
        write_text_atomic(directory / "results-pvc.yaml", yaml.safe_dump(claim, sort_keys=False)),
        write_text_atomic(directory / "loadtest-job.yaml", yaml.safe_dump(job, sort_keys=False)),
    ]
