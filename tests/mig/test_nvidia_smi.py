"""Parsers for nvidia-smi output: the real H200 recordings and a hand-written `-L` sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.mig.nvidia_smi import (
    GpuQuery,
    gpu_key_from_query,
    kind_of_output,
    parse_lgip,
    parse_list_gpus,
    parse_query_csv,
)

from .conftest import NVIDIA_SMI_L_H200


def test_parse_lgip_h200_fixture(fixtures_dir: Path) -> None:
    rows = parse_lgip((fixtures_dir / "nvidia-smi-mig-lgip-h200.txt").read_text())
    assert [r.name for r in rows] == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    assert [r.profile_id for r in rows] == [19, 20, 15, 14, 9, 5, 0]
    assert [(r.free, r.total) for r in rows] == [(7, 7), (1, 1), (4, 4), (3, 3), (2, 2), (1, 1), (1, 1)]
    assert [r.memory_gib for r in rows] == [16.0, 16.0, 32.5, 32.5, 69.75, 69.75, 140.0]
    assert [r.sm for r in rows] == [16, 16, 26, 32, 60, 64, 132]
    assert all(r.gpu == 0 and not r.p2p for r in rows)
    me, full = rows[1], rows[6]
    # the second line of each row: CE, JPEG, OFA; the media extension brings the OFA
    assert (me.dec, me.enc, me.ce, me.jpeg, me.ofa) == (1, 0, 1, 1, 1)
    assert (rows[0].ce, rows[0].jpeg, rows[0].ofa) == (1, 1, 0)
    assert (full.dec, full.ce, full.jpeg, full.ofa) == (7, 8, 7, 1)


def test_parse_lgip_without_second_lines_or_separators() -> None:
    """Some drivers print one line per profile and no +---+ between rows."""
    text = (
        "| GPU instance profiles:                                                        |\n"
        "|   7  MIG 1g.10gb         19     7/7        9.50       No     14     0     0   |\n"
        "|   7  MIG 7g.80gb          0     0/1        79.00      No     98     5     0   |\n"
    )
    rows = parse_lgip(text)
    assert [(r.gpu, r.name, r.total, r.ce) for r in rows] == [(7, "1g.10gb", 7, None), (7, "7g.80gb", 1, None)]


def test_parse_lgip_refuses_a_mangled_row() -> None:
    text = "| GPU instance profiles: |\n|   0  MIG 1g.18gb   19   7/7   sixteen   No  16  1  0 |\n"
    with pytest.raises(PipelineError, match="does not parse"):
        parse_lgip(text)
    with pytest.raises(PipelineError, match="no MIG profiles"):
        parse_lgip("No devices were found\n")


def test_parse_list_gpus_with_mig_devices() -> None:
    gpus = parse_list_gpus(NVIDIA_SMI_L_H200)
    assert len(gpus) == 1
    gpu = gpus[0]
    assert (gpu.index, gpu.name, gpu.uuid) == (0, "NVIDIA H200", "GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901")
    assert [(d.profile, d.index) for d in gpu.mig_devices] == [("2g.35gb", 0), ("2g.35gb", 1), ("2g.35gb", 2), ("1g.18gb", 3)]
    assert gpu.mig_devices[3].uuid == "MIG-3d4e5f6a-7b8c-5d9e-9f0a-2b3c4d5e6f7a"


def test_parse_list_gpus_old_uuid_form_and_plain_gpus() -> None:
    """R450 drivers printed MIG-GPU-<gpu uuid>/<gi>/<ci>; GPUs without MIG have no device lines."""
    text = (
        "GPU 0: A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
        "  MIG 1g.5gb Device 0: (UUID: MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0)\n"
        "GPU 1: NVIDIA H200 (UUID: GPU-0000aaaa-1111-2222-3333-444455556666)\n"
    )
    gpus = parse_list_gpus(text)
    assert gpus[0].mig_devices[0].uuid == "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0"
    assert gpus[1].mig_devices == ()
    with pytest.raises(PipelineError, match="does not parse"):
        parse_list_gpus(text + "  MIG 1g.5gb Device 1: no uuid here\n")


def test_parse_query_csv_fixture(fixtures_dir: Path) -> None:
    rows = parse_query_csv((fixtures_dir / "nvidia-smi-query-h200.csv").read_text())
    assert rows == [GpuQuery("NVIDIA H200", "Disabled", 143771)]
    assert gpu_key_from_query(rows[0]) == "H200-141GB"


def test_query_csv_nounits_and_gpu_keys() -> None:
    rows = parse_query_csv("name, mig.mode.current, memory.total [MiB]\nNVIDIA A100-SXM4-40GB, Enabled, 40960\n")
    assert gpu_key_from_query(rows[0]) == "A100-40GB"
    assert gpu_key_from_query(GpuQuery("NVIDIA A100-SXM4-80GB", "Enabled", 81920)) == "A100-80GB"
    assert gpu_key_from_query(GpuQuery("NVIDIA H100 80GB HBM3", "Enabled", 81559)) == "H100-80GB"
    with pytest.raises(PipelineError, match="no built-in MIG table"):
        gpu_key_from_query(GpuQuery("NVIDIA H100 NVL", "Enabled", 95830))
    with pytest.raises(PipelineError, match="columns"):
        parse_query_csv("name, memory.total [MiB]\nNVIDIA H200, 143771 MiB\n")


def test_kind_of_output(fixtures_dir: Path) -> None:
    assert kind_of_output((fixtures_dir / "nvidia-smi-mig-lgip-h200.txt").read_text()) == "lgip"
    assert kind_of_output((fixtures_dir / "nvidia-smi-query-h200.csv").read_text()) == "query"
    assert kind_of_output(NVIDIA_SMI_L_H200) == "list"
    with pytest.raises(PipelineError, match="not nvidia-smi output"):
        kind_of_output("hello\n")
