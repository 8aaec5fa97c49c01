"""Quiet by default: piped, as a user runs them (no log-level variables set), `build --fp16 --int8`,
`verify`, `loadtest` and `tune` print no line of TensorFlow, absl, gRPC or Polygraphy; and the
reports go where the user said, nothing into the current directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import QUIET_UNSET, ROOT, Built, cli

# Lines third-party code prints: absl/glog-formatted native logs ("I1201 12:00:00.1 123 file.cc:1] …"),
# absl's preamble, TensorFlow's C++ and Python logs, Polygraphy's logger ("[I] …", "[W] …"), gRPC.
THIRD_PARTY = re.compile(
    r"absl::InitializeLog|^[IWEF]\d{4} \d\d:\d\d:\d\d|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |oneDNN|cpu_feature_guard"
    r"|^\[[VIWE!]\] |Streaming iteration|---- Inference|'colored' module|^(WARNING|INFO|ERROR):(absl|tensorflow|tf2onnx)"
    r"|Assets written to|grpc_|GRPC_|^\s*warnings\.warn|\w+Warning: "
)
SMALL_LOAD = ["--concurrency", "1", "--window-ms", "200", "--warmup-ms", "100", "--max-seconds", "2",
              "--calibration-root", str(ROOT / "calibration")]


def third_party_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if THIRD_PARTY.search(line)]


def test_the_pattern_catches_what_the_issue_saw() -> None:
    seen = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796154640.105140    6846 port.cc:153] oneDNN custom operations are on.",
        "[I] Streaming iteration 0",
        "[W] 'colored' module is not installed, will not use colors when logging.",
        "    ---- Inference Input(s) ----",
    ]
    assert third_party_lines("\n".join(seen)) == seen
    ours = ["parity TensorFlow vs ONNX: 8/8 batches in 4.9 s", "INT8 calibration (percentile): 8/8 batches in 0.0 s",
            "WARNING: TensorRT engine step not run: the Python module 'tensorrt' is not installed"]
    assert third_party_lines("\n".join(ours)) == []


@pytest.mark.slow
def test_commands_piped_print_no_third_party_line_and_write_only_where_told(built: Built, tmp_path: Path) -> None:
    assert built.output, "the shared build ran earlier in this session without its output"
    assert third_party_lines(built.output) == []
    # nor a warning of its own: on a CPU-only machine, no TensorRT is expected and the deploy bundle's several-GPU note
    # is the bundle's README's (deploy says it)
    assert [line for line in built.output.splitlines() if line.startswith("WARNING")] == [], built.output[-3000:]
    here = tmp_path / "cwd"
    here.mkdir()
    work = tmp_path / "work"
    served = ["--repository", str(built.repository), "--workdir", str(work)]
    runs = {
        "verify": cli("verify", *served, "--model", "digits_int8", cwd=here, env=QUIET_UNSET),
        "loadtest": cli("loadtest", *served, "--model", "digits_fp32", *SMALL_LOAD, "--report-dir", str(tmp_path / "lt"),
                        cwd=here, env=QUIET_UNSET),
        "tune": cli("tune", *served, "--model", "digits_fp32", "--slo-p99-ms", "100", "--instances", "1", "--max-batch", "8",
                    "--max-trials", "1", "--max-load", "2", *SMALL_LOAD[2:], "--report-dir", str(tmp_path / "tune"),
                    cwd=here, env=QUIET_UNSET),
    }
    for command, proc in runs.items():
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
        assert third_party_lines(proc.stdout + proc.stderr) == [], command
    # --report-dir X: the run and its page under X; server logs and the trial cache under the workdir.
    assert {"results.json", "index.html"} <= {p.name for p in (tmp_path / "lt").iterdir()}
    assert {"tune.json", "index.html"} <= {p.name for p in (tmp_path / "tune").iterdir()}
    assert (work / "verify.json").is_file() and (work / "reports" / "index.html").is_file()
    assert (work / "tune" / "trials.jsonl").is_file() and list((work / "triton").glob("tritonserver-*.log"))
    assert list(here.iterdir()) == []  # nothing in the current directory: every command wrote under the folders it was given
