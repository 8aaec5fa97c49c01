"""Triton's Prometheus metrics around each load point: parsed with prometheus_client, reported as deltas."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

import pytest

from pipeline.commands.loadtest import register
from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.metrics import NO_GPU_METRICS, parse_metrics, point_metrics, scrape

FAST = ["--window-ms", "300", "--warmup-ms", "200", "--max-seconds", "2", "--timeout-ms", "2000"]

# The GPU gauges as Triton's metrics documentation names them; no GPU exists here, so this text is
# written after the documented format (names, labels, units) rather than recorded.
GPU_SERVER_TEXT = """\
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="clf",version="1"} 100
nv_inference_count{model="clf",version="2"} 20
nv_inference_count{model="other",version="1"} 7
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="clf",reason="REJECTED",version="1"} 2
nv_inference_request_failure{model="clf",reason="BACKEND",version="1"} 1
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="clf",version="1"} 60
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="clf",version="1"} 6000
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-a"} 0.5
nv_gpu_utilization{gpu_uuid="GPU-b"} 0.25
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1073741824
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 85899345920
"""


def test_counters_are_summed_over_versions_and_reasons_and_gpus_kept_apart() -> None:
    snap = parse_metrics(GPU_SERVER_TEXT)
    assert snap.models["clf"].inferences == 120 and snap.models["clf"].failure == 3 and snap.models["other"].inferences == 7
    assert [(g.uuid, g.utilization) for g in snap.gpus] == [("GPU-a", 0.5), ("GPU-b", 0.25)]
    assert snap.gpus[0].memory_total_bytes == 85899345920 and snap.gpus[1].memory_used_bytes is None


def test_point_metrics_are_deltas_with_per_request_averages() -> None:
    before = parse_metrics(GPU_SERVER_TEXT)
    after = parse_metrics(GPU_SERVER_TEXT.replace("} 100", "} 140").replace("} 60", "} 100").replace("} 6000", "} 10000"))
    m = point_metrics(before, after, "clf")
    assert m["inferences"] == 40 and m["success"] == 40 and m["failure"] == 0
    assert m["queue_us"] == pytest.approx(100.0)  # 4000 µs of queueing over 40 requests
    assert m["gpu_note"] == "" and len(m["gpus"]) == 2  # type: ignore[arg-type]


def test_without_gpu_metrics_the_report_says_why_instead_of_zeros() -> None:
    cpu_only = "\n".join(line for line in GPU_SERVER_TEXT.splitlines() if "gpu" not in line) + "\n"
    m = point_metrics(parse_metrics(cpu_only), parse_metrics(cpu_only), "clf")
    assert m["gpus"] == [] and m["gpu_note"] == NO_GPU_METRICS and "MIG" in NO_GPU_METRICS


def test_a_port_that_is_not_prometheus_is_an_oserror() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    with pytest.raises(OSError, match="Connection refused|refused"):
        scrape(Endpoint("127.0.0.1", port))


@pytest.mark.slow
def test_loadtest_reports_metrics_deltas_beside_the_statistics_extension(server: object, workspace: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args([
        "loadtest", "--url", server.http_url, "--metrics-url", server.metrics_url, "--model", "add",  # type: ignore[attr-defined]
        "--calibration-root", str(workspace / "calibration"), "--concurrency", "1,2", *FAST, "--report-dir", str(tmp_path),
    ])  # fmt: skip
    assert args.handler(args) == 0
    points = json.loads((tmp_path / "results.json").read_text())["points"]
    assert len(points) == 2
    for point in points:
        agg = point["aggregate"]
        metrics = agg["metrics"]
        # Both read before the point starts and after it drained, so both count the same requests.
        assert metrics["success"] == agg["server_successes_total"] > 0
        assert metrics["inferences"] == metrics["success"]  # batch 1
        assert metrics["queue_us"] is not None and metrics["compute_infer_us"] > 0
        assert metrics["gpus"] == [] and "no GPU metrics" in metrics["gpu_note"]
    csv_text = (tmp_path / "results.csv").read_text()
    assert "metrics_inferences" in csv_text.splitlines()[0]


@pytest.mark.slow
def test_a_wrong_metrics_address_is_noted_not_fatal(server: object, workspace: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args([
        "loadtest", "--url", server.http_url, "--metrics-url", server.http_url, "--model", "add",  # type: ignore[attr-defined]
        "--calibration-root", str(workspace / "calibration"), "--concurrency", "1", *FAST, "--report-dir", str(tmp_path),
    ])  # fmt: skip
    assert args.handler(args) == 0
    [point] = json.loads((tmp_path / "results.json").read_text())["points"]
    assert point["aggregate"]["metrics"] is None
    assert point["aggregate"]["metrics_note"].startswith(f"Prometheus metrics at {server.http_url} unavailable")  # type: ignore[attr-defined]
