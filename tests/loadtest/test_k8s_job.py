"""``loadtest --k8s-job``: the Indexed Job and its results claim validate offline against the
Kubernetes 1.37 schemas, and every pod runs the same load as a shard of one schedule."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pipeline.core.errors import PipelineError

from .test_cli import run_cli

K8S_VERSION = "1.37.0"


def test_job_manifests_validate_and_run_every_pod_as_a_shard(tmp_path: Path) -> None:
    status = run_cli("--k8s-job", str(tmp_path), "--url", "triton-mig-1g-18gb:8000", "--image", "registry.example/pipeline:1",
                     "--pods", "3", "--model", "digits_int8", "--concurrency", "16,64", "--start-at", "2026-12-01T21:00:00Z")
    assert status == 0
    claim = yaml.safe_load((tmp_path / "results-pvc.yaml").read_text())
    job = yaml.safe_load((tmp_path / "loadtest-job.yaml").read_text())
    for doc in (claim, job):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError naming the field
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimit"] == 0  # a retried pod would run out of step with the others
    (container,) = spec["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--shard") + 1] == "$(SHARD_INDEX)/3"
    assert args[args.index("--start-at") + 1] == "2026-12-01T21:00:00Z"
    assert args[args.index("--concurrency") + 1] == "16,64" and args[args.index("--url") + 1] == "triton-mig-1g-18gb:8000"
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].endswith("['batch.kubernetes.io/job-completion-index']")
    assert spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_the_pods_can_start_through_the_ready_barrier_on_their_shared_volume(tmp_path: Path) -> None:
    assert run_cli("--k8s-job", str(tmp_path), "--url", "svc:8000", "--image", "img", "--pods", "4", "--start-at", "ready+30") == 0
    job = yaml.safe_load((tmp_path / "loadtest-job.yaml").read_text())
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--start-at") + 1] == "ready+30"  # forwarded as is: each pod waits for the others
    assert args[args.index("--shard-output") + 1].startswith("/results/")  # the volume every pod shares


def test_an_mlperf_scenario_runs_in_one_pod_that_writes_loadgen_logs_to_the_results_volume(tmp_path: Path) -> None:
    assert run_cli("--k8s-job", str(tmp_path), "--url", "triton:8000", "--image", "img", "--model", "digits_int8", "--scenario", "server",
                   "--target-qps", "500", "--latency-bound-ms", "15", "--min-duration-s", "600") == 0
    job = yaml.safe_load((tmp_path / "loadtest-job.yaml").read_text())
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    spec = job["spec"]
    assert spec["completions"] == spec["parallelism"] == 1  # LoadGen is one process
    (container,) = spec["template"]["spec"]["containers"]
    args = container["args"]
    assert "--shard" not in args and "--start-at" not in args and container["env"] == []
    assert [args[args.index(flag) + 1] for flag in ("--scenario", "--target-qps", "--latency-bound-ms", "--min-duration-s", "--report-dir")] == [
        "server", "500.0", "15.0", "600.0", "/results/triton-loadtest"]
    # accuracy mode judges against the served model files: the pod is told where the repository is, and the gates
    assert run_cli("--k8s-job", str(tmp_path / "acc"), "--url", "triton:8000", "--image", "img", "--scenario", "offline", "--mode", "accuracy",
                   "--repository", "s3://models-bucket/repo", "--accuracy-target", "99.9%", "--int8-max-drop", "0.5") == 0
    args = yaml.safe_load((tmp_path / "acc" / "loadtest-job.yaml").read_text())["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[args.index(flag) + 1] for flag in ("--mode", "--repository", "--accuracy-target", "--int8-max-drop")] == [
        "accuracy", "s3://models-bucket/repo", "0.999", "0.5"]
    assert "--fp16-max-drop" not in args  # not given: the pod keeps the default
    with pytest.raises(PipelineError, match="an MLPerf scenario runs in one pod, not 3"):
        run_cli("--k8s-job", str(tmp_path / "x"), "--url", "t:8000", "--image", "img", "--scenario", "offline", "--target-qps", "9", "--pods", "3")


def test_the_validator_catches_a_broken_job(tmp_path: Path) -> None:
    run_cli("--k8s-job", str(tmp_path), "--url", "svc:8000", "--image", "img", "--start-at", "+60")
    job = yaml.safe_load((tmp_path / "loadtest-job.yaml").read_text())
    job["spec"]["completionMode"] = "Indexed"
    job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPaht"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError, match="mountPaht"):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("argv", "problem"), [
    (["--url", "svc:8000"], "needs the image"),
    (["--url", "svc:8000", "--image", "img", "--job-name", "Load_Test"], "is not a Kubernetes name"),
    (["--image", "img"], "needs the address of the servers"),
    (["--url", "svc:8000", "--image", "img", "--start-at", "tomorrow"], "is not a time with a zone"),
    (["--url", "svc:8000", "--image", "img", "--start-at", "ready+soon"], "is not ready\\+SECONDS"),
])  # fmt: skip
def test_bad_job_options_are_one_line_errors(tmp_path: Path, argv: list[str], problem: str) -> None:
    with pytest.raises(PipelineError, match=problem):
        run_cli("--k8s-job", str(tmp_path), *argv)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("shard", "ok"), [("0/3", True), ("2/3", True), ("3/3", False), ("1", False), ("-1/2", False)])
def test_shard_option(shard: str, ok: bool) -> None:
    from pipeline.loadtest.shards import parse_shard

    if ok:
        assert parse_shard(shard)[1] == 3
    else:
        with pytest.raises(PipelineError, match="INDEX/COUNT"):
            parse_shard(shard)
