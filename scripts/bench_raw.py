"""Raw-bytes requests vs tensor requests, side by side on one server in one run.

What is compared: the raw-input ensemble ``digits`` (``build --raw-inputs image``), whose input ``image_bytes``
takes the bytes of one JPEG/PNG file and which decodes, resizes and scales it on the server
(``digits_preprocess``: ONNX + onnxruntime-extensions) before running ``digits_fp32``; and ``digits_fp32``
itself, sent the float32 tensor a client has to make for itself. Three rows, each at every ``--concurrency``
(batch 1, so requests/s = samples/s):

- ``raw PNG → digits``: the 449 evaluation digits as the PNG files the build writes (``<workdir>/digits/raw_eval``);
- ``raw JPEG → digits``: the same digits re-encoded as RGB JPEG (quality 90, PIL) into a temporary folder, as a
  camera's files are colour; the run also sends one grayscale JPEG first and records the answer, ``grayscale_jpeg`` (the
  ensemble's guard refuses it: onnxruntime-extensions' DecodeImage 0.15.2 swaps a one-component JPEG's bytes);
- ``tensor FP32 → digits_fp32``: the float32 tensors of ``calibration/digits/eval.npz`` at batch 1.

How: the repository is built once (``pipeline.build.orchestrator.build`` with ``raw_inputs="image"``; reused when
``--repository`` is given), the embedded tritonserver is started once on it, and every row is measured against that
one server with the project's own load generator (``pipeline.loadtest.runner.run_loadtest``: a closed loop of C
requests in flight, its epoll HTTP/1.1 engine, binary tensor encoding; a warm-up, then ``--window-s`` windows until
the last three agree within ``--stability-percentage`` or ``--max-windows`` are run). Every distinct request is
encoded once before the load (``EngineSpec.targets``, here one per file / sample: ``--distinct-requests``); the
bytes per request are measured from those very byte strings: the whole HTTP request (request line, headers, body),
its body, and the tensor data in the body. For the raw rows Triton's per-step statistics (``PointResult.steps``)
split the server's time into the preprocessing model and the model itself; for the tensor row Triton's own
breakdown of ``digits_fp32``.

The tensor row's "client prep" column is what the ensemble moves to the server: the µs a Python client spends per
image to make the tensor itself (PIL decode + resize + scale: ``pipeline.data.raw_files.reference_tensor``, the
reference the build gates the served preprocessing against), timed over all the files, in this process, after
one pass to warm the file cache. Client and server share this machine's cores (nothing is pinned), as a client
beside its server does; the ratios (raw/tensor bytes per request and samples/s at the same concurrency) are taken
from the same run, within a round, and with ``--rounds`` > 1 the table shows the medians.

    .venv/bin/python scripts/bench_raw.py --out /tmp/bench_raw          # builds build/bench_raw/ if needed
    .venv/bin/python scripts/bench_raw.py --repository build/bench_raw/model_repository \\
        --workdir build/bench_raw/build --concurrency 1 4 16 --window-s 3 --out /tmp/bench_raw

Prints a table and writes ``DIR/bench_raw.json`` (rows, per-round rows, machine).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "digits"  # the bundled model's name: the ensemble
VARIANT = f"{MODEL}_fp32"
PREPROCESS = f"{MODEL}_preprocess"
GUARD = f"{MODEL}_guard"  # the Python step in front of the decoder
EVAL_NPZ = ROOT / "calibration" / "digits" / "eval.npz"


# -- bytes per request -------------------------------------------------------------------------------------------


def request_sizes(requests: list[bytes]) -> dict[str, float]:
    """Mean sizes over the pre-encoded HTTP/1.1 requests the load generator writes (``EngineSpec.targets``' bytes):
    ``request_bytes`` the whole request as sent (request line, headers, body), ``body_bytes`` its body (what
    ``Content-Length`` says), ``data_bytes`` the tensor data after the JSON header of Triton's binary extension
    (the body less ``Inference-Header-Content-Length``; the whole body for a JSON request)."""
    if not requests:
        raise ValueError("no requests")
    whole, bodies, data = [], [], []
    for request in requests:
        end = request.index(b"\r\n\r\n")
        head = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in request[:end].decode("ascii").split("\r\n")[1:])}
        body = len(request) - end - 4
        if int(head["content-length"]) != body:
            raise ValueError(f"Content-Length {head['content-length']} but {body} body bytes")
        whole.append(len(request))
        bodies.append(body)
        data.append(body - int(head.get("inference-header-content-length", 0)))
    return {"request_bytes": statistics.fmean(whole), "body_bytes": statistics.fmean(bodies), "data_bytes": statistics.fmean(data),
            "distinct_requests": len(requests)}


# -- the repository and the files ----------------------------------------------------------------------------------


def ensure_build(repository: Path | None, workdir: Path) -> tuple[Path, Path]:
    """The repository serving the ``digits`` ensemble and the folder of its evaluation PNG files: ``repository`` as
    given (its build's ``workdir`` must hold the PNGs), else ``<workdir>/../model_repository``, built when missing."""
    pngs = workdir / MODEL / "raw_eval"
    if repository is not None:
        if not (repository / MODEL / "config.pbtxt").is_file():
            raise SystemExit(f"{repository} serves no '{MODEL}' ensemble: build it with --raw-inputs image, or leave out --repository")
        if not pngs.is_dir():
            raise SystemExit(f"{pngs} does not exist: pass --workdir, the workdir of the build that published {repository}")
        return repository, pngs
    repository = workdir.parent / "model_repository"
    if (repository / MODEL / "config.pbtxt").is_file() and pngs.is_dir():
        return repository, pngs
    from pipeline.build.config import BuildConfig
    from pipeline.build.orchestrator import build

    print(f"building the bundled digits model with --raw-inputs image into {repository} (workdir {workdir}) ...", flush=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    build(BuildConfig(workdir=workdir, repository=repository, calibration_root=ROOT / "calibration", raw_inputs="image",
                      version_policy="replace"))
    return repository, pngs


def jpeg_copy(pngs: Path, dst: Path, quality: int, mode: str = "RGB") -> Path:
    """``pngs/<label>/*.png`` re-encoded as ``dst/<label>/*.jpg`` at ``quality``, as ``mode`` images (RGB: three
    components, as cameras and most encoders write JPEG; the served decoder refuses one-component JPEGs, see
    :func:`probe_grayscale_jpeg`)."""
    from PIL import Image

    for png in sorted(pngs.glob("*/*.png")):
        out = dst / png.parent.name / f"{png.stem}.jpg"
        out.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(png) as image:
            image.convert(mode).save(out, "JPEG", quality=quality)
    return dst


def probe_grayscale_jpeg(url: str, png: Path, dst: Path, quality: int) -> str:
    """What the ensemble answers to one grayscale (one-component) JPEG of ``png``: "ok", or Triton's error."""
    import http.client

    import numpy as np
    from PIL import Image

    from pipeline.data.raw_files import BYTES_INPUT
    from pipeline.loadtest.client import endpoint_from_url
    from pipeline.loadtest.payload import ModelIO, TensorInfo, encode_binary

    with Image.open(png) as image:
        image.convert("L").save(dst, "JPEG", quality=quality)
    io = ModelIO(MODEL, (TensorInfo(BYTES_INPUT, "BYTES", (1,)),), (), 0)
    body, head = encode_binary(io, {BYTES_INPUT: np.array([dst.read_bytes()], dtype=object)})
    endpoint = endpoint_from_url(url)
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=10)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=body,
                     headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(head)})
        response = conn.getresponse()
        text = response.read()
    finally:
        conn.close()
    return "ok" if response.status == 200 else f"HTTP {response.status}: {text[:300].decode('utf-8', 'replace')}"


def preprocess_spec(repository: Path) -> Any:
    """The preprocessing the served ``digits_preprocess`` records (its newest version's graph)."""
    from pipeline.data.raw_files import preprocess_of

    versions = sorted((p for p in (repository / PREPROCESS).iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return preprocess_of(versions[-1] / "model.onnx")


def client_prep_us(files: list[Path], pre: Any, passes: int = 3) -> float:
    """Mean µs per file of ``reference_tensor`` (PIL decode, convert, resize, scale: what a client of the tensor path
    does per image), the best of ``passes`` timed passes over ``files`` after one untimed pass."""
    from pipeline.data.raw_files import reference_tensor

    for path in files:
        reference_tensor(path, pre)
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        for path in files:
            reference_tensor(path, pre)
        best = min(best, (time.perf_counter() - started) / len(files) * 1e6)
    return best


# -- one row -------------------------------------------------------------------------------------------------------


def measure_row(row: str, model: str, data: Path, url: str, repository: Path, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    """One row at one concurrency through the product's load generator; bytes from the requests it pre-encodes."""
    from pipeline.loadtest.client import endpoint_from_url
    from pipeline.loadtest.measure import WindowSettings
    from pipeline.loadtest.policy import ClosedLoop
    from pipeline.loadtest.runner import LoadTestSettings, model_spec, run_loadtest

    windows = WindowSettings(window_s=args.window_s, warmup_s=args.warmup_s, max_s=args.warmup_s + args.max_windows * args.window_s + 0.05,
                             threshold=args.stability_percentage / 100)
    settings = LoadTestSettings(
        endpoints=(endpoint_from_url(url),), policies=(ClosedLoop(concurrency),), models=(model,), batch_size=1,
        windows=windows, data=data, calibration_dir=ROOT / "calibration", repository=repository,
        distinct_requests=args.distinct_requests,
    )
    spec = model_spec(settings, model)  # the requests exactly as run_loadtest encodes them (it encodes its own copy)
    sizes = request_sizes(spec.targets[0][1])
    result = run_loadtest(settings)
    if result.failures:
        raise RuntimeError(f"{row} c={concurrency}: {'; '.join(result.failures)}")
    point = result.points[0]
    agg = point.aggregate
    if agg.error_count:
        raise RuntimeError(f"{row} c={concurrency}: {agg.error_count} failed requests: {agg.errors}")

    def times(b: dict | None) -> dict[str, float]:
        keys = ("request_us", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us", "avg_batch_size")
        return {k: round(float(b[k]), 2 if k == "avg_batch_size" else 1) for k in keys if b and k in b}

    out: dict[str, Any] = {
        "row": row,
        "model": model,
        "concurrency": concurrency,
        "requests": agg.requests,
        "seconds": round(agg.seconds, 3),
        "stable": point.stable,
        "samples_per_s": round(agg.infer_per_s, 1),
        "requests_per_s": round(agg.throughput_rps, 1),
        "p50_ms": round(agg.latency.p50_ms, 3),
        "p99_ms": round(agg.latency.p99_ms, 3),
        **{k: round(v, 1) if isinstance(v, float) else v for k, v in sizes.items()},
        "client_cpu_us_per_request": round(point.client_cpu_us_per_request, 1),
        "triton_us": times(agg.server),  # the model loaded (the ensemble: end to end on the server) over the used windows
        "server_version": result.server.get("version"),
    }
    if point.steps:  # over the whole point, warm-up included (Triton counts per model)
        out["steps_us"] = {step: times(b) for step, b in point.steps.items()}
    return out


# -- machine and table ---------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor())

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "onnxruntime": v("onnxruntime"),
        "onnxruntime_extensions": v("onnxruntime-extensions"),
        "tritonclient": v("tritonclient"),
        "python": platform.python_version(),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def print_table(rows: list[dict[str, Any]], prep: dict[str, float], rounds: int, mach: dict[str, Any]) -> None:
    header = (f"{'row':<26} {'conc':>4} {'samples/s':>9} {'vs tensor':>9} {'p50 ms':>7} {'p99 ms':>7} {'req B':>6} {'body B':>6} "
              f"{'data B':>6} {'B vs tensor':>11} {'guard µs':>8} {'server prep µs':>14} {'model µs':>8} {'client prep µs/img':>20}")
    title = f"batch 1{'' if rounds == 1 else f', median of {rounds} rounds'}; ratios vs the tensor row at the same concurrency, same round"
    print(f"\n{title}\n{header}\n{'-' * len(header)}")
    for r in rows:
        steps = r.get("steps_us") or {}
        prep_us = steps.get(PREPROCESS, {}).get("compute_infer_us")
        guard_us = steps.get(GUARD, {}).get("compute_infer_us")
        model_us = (steps.get(VARIANT) or r["triton_us"]).get("compute_infer_us")
        client = "—" if r["row"].startswith("raw") else f"PNG {prep['png']:.0f} / JPEG {prep['jpeg']:.0f}"
        print(f"{r['row'] + ('' if r['stable'] else ' *'):<26} {r['concurrency']:>4} {r['samples_per_s']:>9.0f} {r['samples_ratio_vs_tensor']:>9.2f} {r['p50_ms']:>7.2f} "
              f"{r['p99_ms']:>7.2f} {r['request_bytes']:>6.0f} {r['body_bytes']:>6.0f} {r['data_bytes']:>6.0f} "
              f"{r['request_bytes_ratio_vs_tensor']:>11.2f} {'—' if guard_us is None else f'{guard_us:.0f}':>8} "
              f"{'—' if prep_us is None else f'{prep_us:.0f}':>14} "
              f"{'—' if model_us is None else f'{model_us:.0f}':>8} {client:>20}")
    print("req B: whole HTTP request as sent; body B: its body; data B: tensor bytes in the body (the file, or 8×8×1 float32). "
          "guard / server prep / model µs: Triton's compute_infer of digits_guard / digits_preprocess / digits_fp32 per request "
          "(digits_fp32 batches dynamically: avg batch in the JSON). *: not stable within --max-windows (last 3 windows used).")
    print(f"machine: {mach['cpu']}, {mach['cores']} cores; onnxruntime {mach['onnxruntime']}, onnxruntime-extensions "
          f"{mach['onnxruntime_extensions']}, tritonclient {mach['tritonclient']}, tritonserver {rows[0].get('server_version')}; {mach['date']}")


# -- main ----------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=None,
                        help="reuse this repository serving the 'digits' ensemble (built with --raw-inputs image); needs --workdir "
                             "of that build (default: build/bench_raw/model_repository, built there when missing)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "bench_raw" / "build",
                        help="build workdir: <workdir>/digits/raw_eval holds the PNG files; server logs go to <workdir>/triton "
                             "(default: %(default)s)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="requests in flight (default: 1 8)")
    parser.add_argument("--window-s", type=float, default=2.0, help="measurement window (default: %(default)g s)")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured load before the first window (default: %(default)g s)")
    parser.add_argument("--max-windows", type=int, default=4,
                        help="windows at most per point; the last three are used, stable or not (default: %(default)s)")
    parser.add_argument("--stability-percentage", type=float, default=10,
                        help="the last 3 windows' throughput and mean latency within this %% (default: %(default)g)")
    parser.add_argument("--distinct-requests", type=int, default=449,
                        help="distinct pre-encoded requests per row: the files (or samples) taken in turn (default: %(default)s, every digit)")
    parser.add_argument("--jpeg-quality", type=int, default=90, help="quality of the JPEG copies (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of all rows in turn; medians reported (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports", help="folder for bench_raw.json (default: %(default)s)")
    args = parser.parse_args()
    if args.max_windows < 3:
        parser.error("--max-windows must be at least 3")
    if min(args.concurrency) < 1 or args.rounds < 1 or args.distinct_requests < 1:
        parser.error("--concurrency, --rounds and --distinct-requests must be at least 1")

    import logging

    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    workdir = args.workdir.resolve()
    repository, pngs = ensure_build(args.repository.resolve() if args.repository else None, workdir)

    from pipeline.data.raw_files import image_files
    from pipeline.triton.server import TritonServer

    rounds: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as tmp:
        jpegs = jpeg_copy(pngs, Path(tmp) / "jpeg", args.jpeg_quality)
        pre = preprocess_spec(repository)
        prep = {"png": client_prep_us(list(image_files(pngs).files), pre), "jpeg": client_prep_us(list(image_files(jpegs).files), pre)}
        print(f"client prep (reference_tensor, µs/image): PNG {prep['png']:.1f}, JPEG {prep['jpeg']:.1f}", flush=True)
        cases = [("raw PNG → digits", MODEL, pngs), ("raw JPEG → digits", MODEL, jpegs), ("tensor FP32 → digits_fp32", VARIANT, EVAL_NPZ)]
        with TritonServer(repository, workdir=workdir) as server:
            missing = [m for m in (MODEL, PREPROCESS, VARIANT) if m not in server.ready_models]
            if missing:
                raise SystemExit(f"not served from {repository}: {', '.join(missing)} (skipped: {server.skipped_models})")
            gray_jpeg = probe_grayscale_jpeg(server.http_url, image_files(pngs).files[0], Path(tmp) / "gray.jpg", args.jpeg_quality)
            if gray_jpeg != "ok":
                print(f"note: the ensemble refuses a grayscale (one-component) JPEG: {gray_jpeg}; the JPEG row sends RGB JPEGs", flush=True)
            for k in range(args.rounds):
                rows = []
                for concurrency in args.concurrency:
                    measured = [measure_row(name, model, data, server.http_url, repository, concurrency, args) for name, model, data in cases]
                    tensor = measured[-1]
                    for r in measured:
                        r["samples_ratio_vs_tensor"] = round(r["samples_per_s"] / tensor["samples_per_s"], 3)
                        r["request_bytes_ratio_vs_tensor"] = round(r["request_bytes"] / tensor["request_bytes"], 3)
                        r["body_bytes_ratio_vs_tensor"] = round(r["body_bytes"] / tensor["body_bytes"], 3)
                        r["data_bytes_ratio_vs_tensor"] = round(r["data_bytes"] / tensor["data_bytes"], 3)
                    rows += measured
                print(f"round {k + 1}: " + ", ".join(f"{r['row']} c={r['concurrency']} {r['samples_per_s']:.0f}/s" for r in rows), flush=True)
                rounds.append(rows)

    medians = []
    for i, first in enumerate(rounds[0]):
        row = dict(first)
        for key in ("samples_per_s", "requests_per_s", "p50_ms", "p99_ms", "samples_ratio_vs_tensor"):
            row[key] = round(float(statistics.median(r[i][key] for r in rounds)), 3)
        medians.append(row)
    for row in medians:
        if row["model"] == VARIANT:
            row["client_prep_us_per_image"] = {k: round(v, 1) for k, v in prep.items()}

    mach = machine()
    print_table(medians, prep, args.rounds, mach)
    report = {
        "what": "raw-bytes requests (ensemble digits) vs float32 tensor requests (digits_fp32), batch 1, one server, one run",
        "repository": str(repository),
        "settings": {"concurrency": args.concurrency, "window_s": args.window_s, "warmup_s": args.warmup_s, "max_windows": args.max_windows,
                     "stability_percentage": args.stability_percentage, "distinct_requests": args.distinct_requests,
                     "jpeg_quality": args.jpeg_quality, "rounds": args.rounds},
        "client_prep_us_per_image": {k: round(v, 1) for k, v in prep.items()},
        "grayscale_jpeg": gray_jpeg,  # the ensemble's answer to one one-component JPEG ("ok" or its error)
        "machine": mach,
        "rows": medians,
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench_raw.json"
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
