"""Run one zoo model the way a user would: write its data, `build --fp16 --int8` without
`--shape`, then serve the repository, `verify` it and load-test it once. Shared by the zoo tests
and ``scripts/zoo_table.py``; every step goes through the real CLI or the real server."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.conftest import cli
from tests.zoo.models import ZooModel, write_data

PRECISIONS = ("fp32", "fp16", "int8", "int8cpu")  # int8cpu: the CPU INT8, on by default with --int8
LOADTEST = ["--concurrency", "4", "--window-ms", "300", "--warmup-ms", "200", "--max-seconds", "3", "--timeout-ms", "10000"]


@dataclass
class ZooRun:
    """What happened to one zoo model (JSON-able; the README table is made from these)."""

    model: str
    data_seconds: float = 0.0
    build_seconds: float = 0.0
    build_error: str | None = None
    parity_max_abs: dict[str, float] = field(default_factory=dict)
    parity_passed: bool | None = None
    gates: dict[str, dict] = field(default_factory=dict)  # precision → {passed, drop, max_abs, ...}
    sizes: dict[str, int] = field(default_factory=dict)  # precision → ONNX bytes
    profiles: list[str] = field(default_factory=list)
    config_dims: dict[str, list[int]] = field(default_factory=dict)  # input → dims in the FP32 config
    served: list[dict] = field(default_factory=list)
    served_error: str | None = None
    loadtest: dict[str, dict] = field(default_factory=dict)  # Triton model → {throughput, p99_ms, errors}
    loadtest_error: str | None = None
    serve_seconds: float = 0.0
    per_length: dict[str, float] = field(default_factory=dict)  # "<model>@<length>" → max |served - in-process|
    figures: list[str] = field(default_factory=list)  # gate figures sitting on their limit, or a CPU INT8 far from the INT8 graph (empty: none)
    parser: dict[str, list[str]] | None = None  # variant → what TensorRT's parser refused (the manifest's tensorrt_parser)
    tensorrt: dict[str, dict] | None = None  # variant → what the TensorRT-RTX check built: {built, layers, seconds, errors}
    checker: str | None = None  # which builder checked (TensorRT-RTX and its version)

    def as_json(self) -> dict:
        return asdict(self)


def root_paths(root: Path) -> dict[str, Path]:
    return {"calibration": root / "calibration", "workdir": root / "build", "repository": root / "model_repository"}


def build_zoo_model(entry: ZooModel, root: Path) -> ZooRun:
    """Write the data and run ``build --fp16 --int8`` (no ``--shape``); record gates, sizes, time."""
    paths = root_paths(root)
    run = ZooRun(entry.name)
    began = time.perf_counter()
    write_data(entry, paths["calibration"] / entry.name)
    run.data_seconds = round(time.perf_counter() - began, 1)
    began = time.perf_counter()
    proc = cli(
        "build", "--model", entry.source, "--name", entry.name, "--fp16", "--int8",
        "--workdir", str(paths["workdir"]), "--repository", str(paths["repository"]),
        "--calibration-root", str(paths["calibration"]), *entry.build_args, timeout=1800,
    )
    run.build_seconds = round(time.perf_counter() - began, 1)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        run.build_error = errors[-1] if errors else proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    ws = paths["workdir"] / entry.name
    run.profiles = [line.split("optimization profile 0: ", 1)[1].strip() for line in proc.stderr.splitlines() if "optimization profile 0: " in line][:1]
    if (ws / "parity.json").is_file():
        parity = json.loads((ws / "parity.json").read_text())
        run.parity_passed = parity["passed"]
        run.parity_max_abs = {k: v["max_abs"] for k, v in parity["outputs"].items()}
    if (ws / "accuracy.json").is_file():
        run.gates = _gates(json.loads((ws / "accuracy.json").read_text()))
        run.figures = figure_problems(json.loads((ws / "accuracy.json").read_text()))
    if (ws / "manifest.json").is_file():
        results = json.loads((ws / "manifest.json").read_text()).get("results", {})
        run.parser = results.get("tensorrt_parser")
        check = results.get("tensorrt_check") or {}
        run.tensorrt = check.get("variants")
        run.checker = check.get("checker")
    run.sizes = {p: (ws / f"model.{p}.onnx").stat().st_size for p in PRECISIONS if (ws / f"model.{p}.onnx").is_file()}
    config = paths["repository"] / f"{entry.name}_fp32" / "config.pbtxt"
    if config.is_file():
        from pipeline.triton.config import parse_config

        run.config_dims = {i.name: list(i.dims) for i in parse_config(config.read_text()).input}
    return run


MARGIN = 0.9  # a passing figure's worse bound must sit below 90% of its limit: one on its limit passes one run and fails the next
CPU_TO_INT8 = 1.5  # the CPU INT8's figures against the TensorRT INT8 graph's
NEAR_ZERO = 0.1


def figure_problems(report: dict) -> list[str]:
    """What makes a zoo build's gates fragile or its CPU INT8 worse than the INT8 graph: every gated figure's worse
    bound must keep a tenth of the room its limit allows (under ``MARGIN`` × a limit on a drop or an error; above the
    limit by a tenth of the way to 1 on a similarity); every CPU INT8 figure within ``CPU_TO_INT8`` × the INT8 graph's same
    figure, or their bounds overlapping (the two cannot be told apart, as where both are near zero)."""
    problems = []
    rows = {v["precision"]: {(r["output"], r["metric"]): r for r in v.get("gates", [])} for v in report.get("variants", []) if v.get("kind") == "onnx"}
    for precision, figures in rows.items():
        for (output, metric), row in figures.items():
            if row["limit"] is None or row["verdict"] != "pass" or row["low"] is None:
                continue
            if row["worse"] == "higher":  # a drop, an error: room from 0 up to the limit
                on_limit = row["high"] > MARGIN * row["limit"]
            else:  # a similarity or agreement: room from the limit up to 1
                on_limit = row["low"] < row["limit"] + (1 - MARGIN) * (1 - row["limit"])
            if on_limit:
                problems.append(f"{precision} {output} {metric}: {row['value']:.3g} [{row['low']:.3g}, {row['high']:.3g}] sits on its limit {row['limit']:g}")
    for key, cpu in rows.get("int8cpu", {}).items():
        graph = rows.get("int8", {}).get(key)
        if graph is None or cpu["limit"] is None or cpu["low"] is None or graph["low"] is None or cpu["worse"] != "higher":
            continue
        overlap = cpu["low"] <= graph["high"] and graph["low"] <= cpu["high"]
        negligible = cpu["high"] <= NEAR_ZERO * cpu["limit"]  # both near zero: a tenth of the limit at most
        if not overlap and not negligible and cpu["value"] > CPU_TO_INT8 * max(graph["value"], 0.0):
            problems.append(f"int8cpu {key[0]} {key[1]}: {cpu['value']:.3g} [{cpu['low']:.3g}, {cpu['high']:.3g}] vs the INT8 graph's "
                            f"{graph['value']:.3g} [{graph['low']:.3g}, {graph['high']:.3g}]")
    return problems


def _gates(report: dict) -> dict[str, dict]:
    """precision → the variant's gate verdict and numbers, whatever the report's exact layout."""
    variants = report.get("variants", report.get("results", []))
    gates = {}
    for variant in variants if isinstance(variants, list) else []:
        name = str(variant.get("variant", ""))
        precision = variant.get("precision") or name.split("-")[0]
        comparison = variant.get("comparison", variant)
        if not isinstance(variant.get("passed"), bool):  # a report without its verdict passes nothing
            raise AssertionError(f"accuracy report variant '{name}' has no boolean 'passed' field (keys: {sorted(variant)})")
        gates[precision] = {
            "passed": variant["passed"],
            "failures": variant.get("failures", []),
            "accuracy": comparison.get("accuracy"),
            "reference_accuracy": comparison.get("reference_accuracy"),
            "top1_agreement": comparison.get("agreement"),
            "max_abs": max((o.get("max_abs", 0.0) for o in comparison.get("outputs", {}).values()), default=None),
            "drop": next(({"drop_points": r["value"], "low_points": r["low"], "high_points": r["high"]}
                          for r in variant.get("gates", []) if r.get("unit") == "points"), None),
        }
    return gates


def serve_zoo_model(entry: ZooModel, root: Path, run: ZooRun) -> ZooRun:
    """Start the embedded tritonserver on the repository, `verify` every variant, load-test once at c=4."""
    from pipeline.accuracy.gates import Gates
    from pipeline.core.errors import PipelineError
    from pipeline.triton.served_gate import SERVED_ATOL
    from pipeline.triton.server import TritonServer
    from pipeline.triton.verify import verify_repository

    paths = root_paths(root)
    began = time.perf_counter()
    models = [f"{entry.name}_{p}" for p in PRECISIONS if p in run.sizes]
    with TritonServer(paths["repository"]) as server:
        try:
            report = verify_repository(
                paths["repository"], url=server.http_url, models=models, calibration_root=paths["calibration"],
                batch_size=32, atol=SERVED_ATOL, gates=Gates(), report_path=root / "served.json",
            )
            run.served = report["models"]
        except PipelineError as exc:  # CheckFailed included: the served check said no
            run.served_error = str(exc)
            if (root / "served.json").is_file():
                run.served = json.loads((root / "served.json").read_text())["models"]
        if entry.sequence:
            for model in models:
                run.per_length.update(served_per_length(server.http_url, paths["repository"], model, paths["calibration"] / entry.name / "eval.npz"))
        proc = cli("loadtest", "--url", server.http_url, *[a for m in models for a in ("--model", m)],
                   "--calibration-root", str(paths["calibration"]), "--report-dir", str(root / "loadtest"), *LOADTEST)
        if proc.returncode != 0:
            run.loadtest_error = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        results = root / "loadtest" / "results.json"
        if results.is_file():
            for point in json.loads(results.read_text()).get("points", []):
                agg = point["aggregate"]
                run.loadtest[point["model"]] = {
                    "concurrency": point["load"], "requests": agg["requests"], "throughput_rps": round(agg["throughput_rps"], 1),
                    "p50_ms": agg["latency"]["p50_ms"], "p99_ms": agg["latency"]["p99_ms"], "errors": agg["error_count"],
                }
    run.serve_seconds = round(time.perf_counter() - began, 1)
    return run


def served_per_length(url: str, repository: Path, model: str, eval_npz: Path) -> dict[str, float]:
    """For each length bucket: 8 samples through Triton (HTTP) at that length, and the same
    through the model file in process; the max abs difference of every output, per length."""
    import numpy as np
    import tritonclient.http as http
    from tritonclient.utils import np_to_triton_dtype

    from pipeline.backend.onnxrt import session_from_onnx
    from pipeline.data.arrays import load_npz
    from pipeline.data.buckets import split_buckets
    from pipeline.data.tensors import signature_from_onnx

    version = max(int(p.name) for p in (repository / model).iterdir() if p.name.isdigit())
    model_file = repository / model / str(version) / "model.onnx"
    signature = signature_from_onnx(model_file)
    session = session_from_onnx(model_file, exact_qdq=model.endswith("_int8"))
    client = http.InferenceServerClient(url)
    diffs = {}
    try:
        for label, bucket in split_buckets(eval_npz, load_npz(eval_npz), signature, what="evaluation data").items():
            feed = {s.name: np.ascontiguousarray(bucket[s.name][:8], dtype=s.dtype) for s in signature.inputs}
            inputs = []
            for name, array in feed.items():
                tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            names = [s.name for s in signature.outputs]
            served = client.infer(model, inputs, outputs=[http.InferRequestedOutput(n) for n in names])
            local = session.run(names, feed)
            diffs[f"{model}@{label}"] = max(float(np.abs(served.as_numpy(n) - mine).max()) for n, mine in zip(names, local))
    finally:
        client.close()
    return diffs


def assert_tensorrt_built(run: ZooRun, summary: str) -> None:
    """The real builder (TensorRT-RTX, where scripts/setup.sh installed it: always in CI) built the fp32, fp16 and int8
    graphs; without it (a developer's machine), the hand-written parser rules refused none of them."""
    from tests.trt_standin import has_real_builder

    gpu = [p for p in PRECISIONS if p != "int8cpu"]  # the CPU INT8 is never checked: ONNX Runtime serves it
    assert run.parser == {p: [] for p in gpu}, summary
    if has_real_builder():
        assert run.tensorrt is not None and str(run.checker).startswith("TensorRT-RTX "), summary
        assert {p: (e["built"], e["errors"]) for p, e in run.tensorrt.items()} == {p: (True, []) for p in gpu}, summary
        assert all(e["layers"] > 0 for e in run.tensorrt.values()), summary
