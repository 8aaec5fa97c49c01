"""Is our load generator as fast as wrk? Same server, same request, back to back.

Starts the embedded tritonserver with a trivial ONNX model (``add``: x float32 [batch,4] → x + 1),
then for each concurrency runs our HTTP engine (closed loop) and ``wrk`` POSTing the identical
KServe v2 JSON request (wrk -s with a Lua script), for the same duration each, alternating which
goes first. Prints throughput of each, the ratio ours/wrk, and the client CPU per request of
each (ours: this process; wrk: its rusage). Target: ours/wrk ≥ 0.9 at concurrency 16 and 64.

    python scripts/bench_loadgen.py                       # c = 1, 4, 16, 64; 5 s per run
    python scripts/bench_loadgen.py --seconds 3 --repeats 2 --pin

Both clients share the machine with the server, so a client's CPU per request is taken from the
server: on a small machine that, more than raw client speed, decides the ratio. ``--pin`` puts
the server on the first CPU and the clients on the others, which isolates them instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2 as mc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.loadtest.client import Endpoint, endpoint_from_url, post_request_bytes
from pipeline.loadtest.engine import HttpEngine
from pipeline.loadtest.policy import ClosedLoop
from pipeline.triton.server import TritonServer

MODEL = "add"
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 1.5, 2.5, 3.5]}]}).encode()


def write_repository(root: Path, instances: int = 1) -> Path:
    """``root/model_repository/add``: ONNX Add model, config from a ModelConfig protobuf (``instances`` CPU instances)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "add_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.ones(4, dtype=np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    config = mc.ModelConfig(name=MODEL, platform="onnxruntime_onnx", max_batch_size=8)
    config.input.add(name="x", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="y", data_type=mc.TYPE_FP32, dims=[4])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=instances)
    repo = root / "model_repository"
    (repo / MODEL / "1").mkdir(parents=True)
    onnx.save(model, str(repo / MODEL / "1" / "model.onnx"))
    (repo / MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    return repo


def run_ours(endpoint: Endpoint, concurrency: int, seconds: float) -> dict[str, float]:
    """Our closed loop for ``seconds``: successful requests/s and CPU µs per request."""
    request = post_request_bytes(endpoint, f"/v2/models/{MODEL}/infer", BODY)
    engine = HttpEngine([(endpoint, [request])], ClosedLoop(concurrency), timeout_s=10.0)
    cpu0, t0 = time.process_time(), time.perf_counter_ns()
    engine.start()
    engine.run_until(t0 + int(seconds * 1e9))
    elapsed = (time.perf_counter_ns() - t0) / 1e9
    cpu = time.process_time() - cpu0
    engine.finish(2.0)
    recorder = engine.recorders[0]
    done = len(recorder.latency_ns)
    return {"rps": done / elapsed, "cpu_us": cpu / max(done, 1) * 1e6, "errors": recorder.error_count}


def run_wrk(endpoint: Endpoint, concurrency: int, seconds: float, threads: int, script: Path, cpus: list[int] | None) -> dict[str, float]:
    """wrk with the same request: requests/s from its summary, CPU µs per request from rusage."""
    command = ["wrk", f"-t{min(threads, concurrency)}", f"-c{concurrency}", f"-d{seconds:g}s", "-s", str(script),
               f"http://{endpoint.address}/v2/models/{MODEL}/infer"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=seconds + 30,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    ).stdout  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = next(int(line.split()[0]) for line in out.splitlines() if "requests in" in line)
    rps = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("Requests/sec"))
    errors = sum(int(line.split(":")[1]) for line in out.splitlines() if "Non-2xx" in line)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rps": rps, "cpu_us": cpu / max(total, 1) * 1e6, "errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16,64", help="comma-separated (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each run (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="pairs per concurrency; the best of each is shown (default: %(default)s)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (default: %(default)s, like our one loop)")
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, clients on the other CPUs")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = client_cpus = None
    if args.pin and len(cpus) >= 2:
        server_cpus, client_cpus = cpus[:1], cpus[1:]
    levels = [int(c) for c in args.concurrency.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp:
        root = Path(tmp)
        script = root / "post.lua"
        # Lua long brackets: the body goes in verbatim, byte for byte the one our engine sends.
        script.write_text(f'wrk.method = "POST"\nwrk.body = [==[{BODY.decode()}]==]\n'
                          f'wrk.headers["Content-Type"] = "application/json"\n')  # fmt: skip
        with TritonServer(write_repository(root), log_path=root / "tritonserver.log", cpus=server_cpus) as server:
            endpoint = endpoint_from_url(server.http_url)
            if client_cpus:
                os.sched_setaffinity(0, client_cpus)
            run_ours(endpoint, 4, 1.0)  # warm both the server and this process
            for c in levels:
                ours, wrk = [], []
                for r in range(args.repeats):
                    order = ("ours", "wrk") if r % 2 == 0 else ("wrk", "ours")
                    for who in order:
                        if who == "ours":
                            ours.append(run_ours(endpoint, c, args.seconds))
                        else:
                            wrk.append(run_wrk(endpoint, c, args.seconds, args.wrk_threads, script, client_cpus))
                best_ours, best_wrk = max(ours, key=lambda x: x["rps"]), max(wrk, key=lambda x: x["rps"])
                rows.append({"concurrency": c, "ours": best_ours, "wrk": best_wrk, "ratio": best_ours["rps"] / best_wrk["rps"]})
                print(f"  c={c}: ours {best_ours['rps']:.0f}/s, wrk {best_wrk['rps']:.0f}/s", flush=True)
    print()
    print(f"{'concurrency':>11} {'ours req/s':>11} {'wrk req/s':>10} {'ours/wrk':>9} {'ours CPU µs/req':>16} {'wrk CPU µs/req':>15} {'errors':>7}")
    for row in rows:
        o, w = row["ours"], row["wrk"]
        print(f"{row['concurrency']:>11} {o['rps']:>11.0f} {w['rps']:>10.0f} {row['ratio']:>9.2f} {o['cpu_us']:>16.1f} "
              f"{w['cpu_us']:>15.1f} {int(o['errors'] + w['errors']):>7}")  # fmt: skip
    target = [r for r in rows if r["concurrency"] in (16, 64)]
    met = all(r["ratio"] >= 0.9 for r in target)
    print(f"\ntarget ours/wrk ≥ 0.9 at c=16 and c=64: {'met' if met else 'NOT met'}"
          f" ({args.seconds:g} s per run, best of {args.repeats}, {len(cpus)} CPUs{', pinned' if client_cpus else ''})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "seconds": args.seconds, "repeats": args.repeats, "pinned": bool(client_cpus)}, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
