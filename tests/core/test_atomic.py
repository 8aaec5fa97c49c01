"""pipeline/core/atomic.py: hidden temporaries beside the destination, renamed into place, leftovers cleared;
and the stages that write through it leave nothing half-written when they fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.core.atomic import atomic_path, clear_leftovers, write_bytes_atomic
from pipeline.core.errors import PipelineError


def test_write_replaces_atomically_with_a_hidden_temporary(tmp_path: Path) -> None:
    dst = tmp_path / "sub" / "model.plan"
    with atomic_path(dst) as tmp:
        assert tmp.parent == dst.parent and tmp.name.startswith(".model.plan.") and tmp.name.endswith(".tmp.plan")
        tmp.write_bytes(b"engine")
        assert not dst.exists()  # nothing under the real name until the end
    assert dst.read_bytes() == b"engine" and (dst.stat().st_mode & 0o777) == 0o644
    assert write_bytes_atomic(dst, memoryview(b"new")) == dst and dst.read_bytes() == b"new"
    assert sorted(p.name for p in dst.parent.iterdir()) == ["model.plan"]


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    dst = tmp_path / "model.onnx"
    dst.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"), atomic_path(dst) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert dst.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.onnx"]


def test_leftovers_of_a_killed_run_are_cleared_and_only_those(tmp_path: Path) -> None:
    dst = tmp_path / "model.onnx"
    (tmp_path / ".model.onnx.abc123.tmp.onnx").write_bytes(b"half")
    (tmp_path / ".model.onnx.dir").mkdir()
    (tmp_path / ".other.onnx.x.tmp").write_bytes(b"not ours")
    write_bytes_atomic(dst, b"full")
    assert sorted(os.listdir(tmp_path)) == [".other.onnx.x.tmp", "model.onnx"]
    clear_leftovers(tmp_path / "missing" / "x")  # no folder: nothing to do


@pytest.mark.slow
def test_failed_onnx_export_writes_nothing(tmp_path: Path) -> None:
    """tf2onnx fails on a folder that is no SavedModel: no model.onnx, no temporary left behind."""
    from pipeline.stages.onnx_export import onnx_from_savedmodel

    (tmp_path / "saved").mkdir()
    (tmp_path / ".model.onnx.old.tmp.onnx").write_bytes(b"from a killed run")
    with pytest.raises(PipelineError, match="tf2onnx failed"):
        onnx_from_savedmodel(tmp_path / "saved", tmp_path / "model.onnx", 17)
    assert sorted(os.listdir(tmp_path)) == ["saved"]
