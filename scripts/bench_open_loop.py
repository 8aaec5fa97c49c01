"""How promptly does the open loop send? Scheduled vs sent, and the send lag, against a loopback server.

The tests only check what holds on any machine (never more requests than scheduled, none sent
early, every send recorded); how close to the schedule the engine keeps is a speed, measured here.
A trivial keep-alive HTTP/1.1 server in a thread answers every POST at once, so the lag is the
engine's (epoll's 1 ms timeout grain, plus whatever else runs on the machine).

    python scripts/bench_open_loop.py                      # 200, 1000 and 4000 requests/s, 3 s each
    python scripts/bench_open_loop.py --rates 500 --seconds 10 --arrivals poisson
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.loadtest.client import Endpoint, post_request_bytes
from pipeline.loadtest.engine import HttpEngine
from pipeline.loadtest.policy import OpenLoop


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Triton

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def measure(port: int, rate: float, seconds: float, arrivals: str) -> dict[str, float]:
    endpoint = Endpoint("127.0.0.1", port)
    engine = HttpEngine([(endpoint, [post_request_bytes(endpoint, "/infer", b"{}")])], OpenLoop(rate, arrivals, 0), timeout_s=10.0)
    began = time.perf_counter_ns()
    engine.start()
    engine.run_until(began + int(seconds * 1e9))
    engine.finish(5.0)
    r = engine.recorders[0]
    lag_ms = np.frombuffer(r.lag_ns, dtype=np.int64) / 1e6
    return {
        "scheduled": rate * seconds, "sent": r.sent, "unsent": engine.unsent[0], "errors": r.error_count,
        "lag_p50_ms": float(np.median(lag_ms)) if len(lag_ms) else float("nan"),
        "lag_p99_ms": float(np.percentile(lag_ms, 99)) if len(lag_ms) else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="200,1000,4000", help="requests/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--arrivals", choices=("constant", "poisson"), default="constant")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        print(f"{'rate/s':>8} {'scheduled':>10} {'sent':>8} {'unsent':>7} {'errors':>7} {'lag p50 ms':>11} {'lag p99 ms':>11}")
        for rate in (float(r) for r in args.rates.split(",")):
            m = measure(server.server_address[1], rate, args.seconds, args.arrivals)
            print(f"{rate:8g} {m['scheduled']:10.0f} {m['sent']:8d} {m['unsent']:7d} {m['errors']:7d} {m['lag_p50_ms']:11.3f} {m['lag_p99_ms']:11.3f}")
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
