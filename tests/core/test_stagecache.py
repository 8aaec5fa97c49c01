"""The stage cache (pipeline/core/stagecache.py): a stage runs unless its outputs exist and the hash of its
inputs, settings, environment and tool versions equals the one recorded beside them.

Real files and real hashing; the stage functions are small Python functions that write their output.
"""

from __future__ import annotations

import json
from datetime import datetime
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.core.stagecache import Manifest, Stage, input_hash, run_stage


@dataclass(frozen=True)
class Knobs:
    """A settings value given as a dataclass (hashed by its fields)."""

    scale: int
    mode: str = "fast"


class Recorder:
    """A stage function that writes ``dst`` from ``src`` and remembers every call's arguments."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, *, src: Path, dst: Path, factor: int = 1, **rest: object) -> Path:
        self.calls.append({"src": src, "dst": dst, "factor": factor, **rest})
        dst.write_text(src.read_text() * factor)
        return dst


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "in.txt").write_text("abc")
    return tmp_path / "in.txt", tmp_path / "out.txt"


def manifest(tmp_path: Path, **versions: str) -> Manifest:
    return Manifest(tmp_path / "manifest.json", "python -m pipeline build", versions=dict(versions) or {"tool": "1.0"})


def stage(fn: Recorder, src: Path, dst: Path, **changes: object) -> Stage:
    values: dict[str, object] = {"name": "copy", "fn": fn, "inputs": {"src": src}, "settings": {"factor": 2}, "outputs": {"dst": dst}}
    values.update(changes)
    return Stage(**values)  # type: ignore[arg-type]


def statuses(m: Manifest) -> list[tuple[str, str]]:
    return [(r.name, r.status) for r in m.stages]


def test_first_run_writes_the_output_and_a_sidecar_with_the_key(tmp_path: Path, files: tuple[Path, Path]) -> None:
    src, dst = files
    fn, m = Recorder(), manifest(tmp_path)
    assert run_stage(m, stage(fn, src, dst), "python -m pipeline build --factor 2") is True
    assert dst.read_text() == "abcabc"
    assert fn.calls == [{"src": src, "dst": dst, "factor": 2}]  # the hashed values are the ones passed
    sidecar = json.loads((tmp_path / "out.txt.stage.json").read_text())
    assert sidecar["stage"] == "copy" and sidecar["settings"] == {"factor": 2}
    assert sidecar["inputs"] == {"src": input_hash(src)} and sidecar["reproduce"] == "python -m pipeline build --factor 2"
    [record] = m.stages
    assert (record.name, record.status, record.key, record.outputs) == ("copy", "ran", sidecar["key"], [str(dst)])
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_unchanged_stage_is_skipped_without_calling_it(tmp_path: Path, files: tuple[Path, Path]) -> None:
    src, dst = files
    fn, m = Recorder(), manifest(tmp_path)
    run_stage(m, stage(fn, src, dst), "r")
    assert run_stage(m, stage(fn, src, dst), "r") is False
    assert len(fn.calls) == 1 and statuses(m) == [("copy", "ran"), ("copy", "skipped")]
    assert m.stages[1].key == m.stages[0].key


@pytest.mark.parametrize(
    "change",
    ["input content", "setting", "dataclass setting", "environment", "tool version", "output deleted", "also_writes missing", "sidecar corrupt"],
)
def test_any_change_to_what_the_key_covers_runs_the_stage_again(tmp_path: Path, files: tuple[Path, Path], change: str) -> None:
    src, dst = files
    fn = Recorder()
    extra = tmp_path / "extra.txt"
    base: dict[str, object] = {"settings": {"factor": 2, "knobs": Knobs(1)}, "environment": {"gpu": "none"}}
    run_stage(manifest(tmp_path), stage(fn, src, dst, **base), "r")
    m, kwargs = manifest(tmp_path), dict(base)
    if change == "input content":
        src.write_text("abd")
    elif change == "setting":
        kwargs["settings"] = {"factor": 3, "knobs": Knobs(1)}
    elif change == "dataclass setting":
        kwargs["settings"] = {"factor": 2, "knobs": Knobs(1, "exact")}
    elif change == "environment":
        kwargs["environment"] = {"gpu": "H200"}
    elif change == "tool version":
        m = manifest(tmp_path, tool="1.1")
    elif change == "output deleted":
        dst.unlink()
    elif change == "also_writes missing":
        kwargs["also_writes"] = [extra]
    elif change == "sidecar corrupt":
        (tmp_path / "out.txt.stage.json").write_text("{not json")
    assert run_stage(m, stage(fn, src, dst, **kwargs), "r") is True, change
    assert len(fn.calls) == 2 and statuses(m) == [("copy", "ran")]


def test_context_is_passed_but_not_keyed(tmp_path: Path, files: tuple[Path, Path]) -> None:
    src, dst = files
    fn = Recorder()
    run_stage(manifest(tmp_path), stage(fn, src, dst, context={"hint": "a"}), "r")
    assert fn.calls[0]["hint"] == "a"
    # derived from the inputs, or a speed-up only: a different value must not invalidate the output
    assert run_stage(manifest(tmp_path), stage(fn, src, dst, context={"hint": "b"}), "r") is False
    assert len(fn.calls) == 1


def test_a_failed_stage_is_recorded_and_runs_again_next_time(tmp_path: Path, files: tuple[Path, Path]) -> None:
    src, dst = files
    fn, m = Recorder(), manifest(tmp_path)
    run_stage(m, stage(fn, src, dst), "r")
    src.write_text("new")

    def fails(*, src: Path, dst: Path, factor: int) -> None:
        assert not (tmp_path / "out.txt.stage.json").exists()  # a stage killed now must not look finished
        raise RuntimeError("calibration blew up")

    with pytest.raises(RuntimeError, match="calibration blew up"):
        run_stage(m, stage(fails, src, dst), "r")  # type: ignore[arg-type]
    assert statuses(m) == [("copy", "ran"), ("copy", "failed")] and m.stages[1].note == "calibration blew up"
    assert not (tmp_path / "out.txt.stage.json").exists()
    assert run_stage(m, stage(fn, src, dst), "r") is True and dst.read_text() == "newnew"


def test_input_hashes() -> None:
    @dataclass(frozen=True)
    class WithMethod:
        value: str

        def fingerprint(self) -> str:
            return f"m:{self.value}"

    @dataclass(frozen=True)
    class WithAttribute:
        fingerprint: str

    assert input_hash("sha-given") == "sha-given"  # strings are hashes already
    assert input_hash(WithMethod("x")) == "m:x" and input_hash(WithAttribute("a:1")) == "a:1"
    assert input_hash(["a", "b"]) != input_hash(["b", "a"]) and input_hash(["a", "b"]) == input_hash(("a", "b"))
    with pytest.raises(TypeError, match="stage input of type int has no fingerprint"):
        input_hash(3)


def test_file_and_folder_inputs_hash_their_content(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("same")
    (tmp_path / "b.txt").write_text("same")
    assert input_hash(tmp_path / "a.txt") == input_hash(tmp_path / "b.txt")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x").write_text("1")
    before = input_hash(tmp_path / "dir")
    (tmp_path / "dir" / "x").write_text("2")
    assert input_hash(tmp_path / "dir") != before


def test_manifest_is_written_whole(tmp_path: Path, files: tuple[Path, Path]) -> None:
    src, dst = files
    m = manifest(tmp_path)
    run_stage(m, stage(Recorder(), src, dst), "r")
    m.ran("verify", 1.5, "served")
    m.not_run("engine", "no TensorRT here")
    m.artifacts["fp32.onnx"] = str(dst)
    data = json.loads(m.write().read_text())
    assert data["command"] == "python -m pipeline build" and data["versions"] == {"tool": "1.0"}
    assert [(s["name"], s["status"], s["note"]) for s in data["stages"]] == [("copy", "ran", ""), ("verify", "ran", "served"), ("engine", "not run", "no TensorRT here")]
    assert data["artifacts"] == {"fp32.onnx": str(dst)}
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_stage_key_covers_the_pipelines_own_code(tmp_path: Path) -> None:
    import shutil

    from pipeline.core.fingerprint import code_hash

    package = tmp_path / "pipeline"
    shutil.copytree(Path(__file__).resolve().parents[2] / "pipeline", package, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_hash(package)
    gates = package / "accuracy" / "gates.py"
    gates.write_text(gates.read_text().replace("0.95", "0.9", 1))  # a changed gate default
    assert code_hash(package) != before
    # By default the key is the whole package's (gates, stages, ...), although fingerprint.py sits in core/.
    assert code_hash() == code_hash(Path(__file__).resolve().parents[2] / "pipeline")
    assert code_hash() != code_hash(Path(__file__).resolve().parents[2] / "pipeline" / "core")


def test_a_skip_keeps_the_time_and_date_of_the_run_that_made_the_outputs(tmp_path: Path, files: tuple[Path, Path]) -> None:
    src, dst = files
    first, again = manifest(tmp_path), manifest(tmp_path)
    run_stage(first, stage(Recorder(), src, dst), "r")
    run_stage(again, stage(Recorder(), src, dst), "r")
    [ran], [skipped] = first.stages, again.stages
    sidecar = json.loads((tmp_path / "out.txt.stage.json").read_text())
    assert (ran.status, skipped.status) == ("ran", "skipped")
    assert skipped.ran_seconds == ran.ran_seconds == sidecar["seconds"] and skipped.ran_at == ran.ran_at == sidecar["finished"]
    assert datetime.fromisoformat(ran.ran_at).tzinfo is not None  # a date with its UTC offset
    first.not_run("engine", "no TensorRT here")
    assert (first.stages[-1].ran_seconds, first.stages[-1].ran_at) == (None, "")
