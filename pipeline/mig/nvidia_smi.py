"""Parsers for what ``nvidia-smi`` prints about MIG: ``mig -lgip``, ``-L`` and ``--query-gpu`` CSV.

Formats follow the NVIDIA MIG User Guide ("Getting Started with MIG") and the H200 recording in
``shared/fixtures/``. Parsing is strict: a table row that looks like a profile but does not
parse is an error, never silently skipped.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from pipeline.core.errors import PipelineError
from pipeline.mig.profiles import (
    MEMORY_SLICES_BY_ID,
    PLACEMENTS_BY_ID,
    GpuMig,
    MigProfile,
    compute_slices_of,
)


@dataclass(frozen=True)
class LgipRow:
    """One GPU instance profile row of ``nvidia-smi mig -lgip`` (both of its lines)."""

    gpu: int
    name: str  # "1g.18gb+me"
    profile_id: int
    free: int
    total: int
    memory_gib: float
    p2p: bool
    sm: int
    dec: int
    enc: int
    ce: int | None  # second line; absent in some older drivers' output
    jpeg: int | None
    ofa: int | None


@dataclass(frozen=True)
class MigDevice:
    """A MIG device line of ``nvidia-smi -L``."""

    profile: str  # "1g.18gb"
    index: int  # "Device  0"
    uuid: str  # "MIG-..." (CUDA_VISIBLE_DEVICES accepts it as is)


@dataclass(frozen=True)
class GpuDevice:
    """A GPU line of ``nvidia-smi -L`` with the MIG devices listed under it."""

    index: int
    name: str
    uuid: str
    mig_devices: tuple[MigDevice, ...]


@dataclass(frozen=True)
class GpuQuery:
    """One row of ``--query-gpu=name,mig.mode.current,memory.total --format=csv``."""

    name: str
    mig_mode: str  # "Enabled" | "Disabled" | "[N/A]"
    memory_total_mib: int


_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<id>\d+)\s+(?P<free>\d+)/(?P<total>\d+)\s+"
    r"(?P<mem>\d+(?:\.\d+)?)\s+(?P<p2p>Yes|No)\s+(?P<sm>\d+)\s+(?P<dec>\d+)\s+(?P<enc>\d+)\s*\|\s*$"
)
_ROW_SECOND = re.compile(r"^\|\s+(?P<ce>\d+)\s+(?P<jpeg>\d+)\s+(?P<ofa>\d+)\s*\|\s*$")


def parse_lgip(text: str) -> list[LgipRow]:
    """Parse ``nvidia-smi mig -lgip``: one row per GPU and profile, ``+me`` profiles included."""
    rows: list[LgipRow] = []
    pending: dict[str, object] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if (m := _ROW.match(line)) is not None:
            if pending is not None:
                rows.append(_row(pending, None))
            pending = m.groupdict()
        elif (m2 := _ROW_SECOND.match(line)) is not None and pending is not None:
            rows.append(_row(pending, m2.groupdict()))
            pending = None
        elif re.search(r"\bMIG\s+\d+g\.", line):
            raise PipelineError(
                f"line {number} of the nvidia-smi mig -lgip output looks like a profile row but "
                f"does not parse: {line.strip()!r}",
                "pass the unmodified output of `nvidia-smi mig -lgip`",
            )
    if pending is not None:
        rows.append(_row(pending, None))
    if not rows:
        raise PipelineError(
            "no MIG profiles found in the nvidia-smi mig -lgip output",
            "run `nvidia-smi mig -lgip` on a MIG-capable GPU (A100/H100/H200) and pass its output",
        )
    return rows


def _row(first: dict[str, object], second: dict[str, object] | None) -> LgipRow:
    def opt(key: str) -> int | None:
        return None if second is None else int(str(second[key]))

    return LgipRow(
        gpu=int(str(first["gpu"])),
        name=str(first["name"]),
        profile_id=int(str(first["id"])),
        free=int(str(first["free"])),
        total=int(str(first["total"])),
        memory_gib=float(str(first["mem"])),
        p2p=first["p2p"] == "Yes",
        sm=int(str(first["sm"])),
        dec=int(str(first["dec"])),
        enc=int(str(first["enc"])),
        ce=opt("ce"),
        jpeg=opt("jpeg"),
        ofa=opt("ofa"),
    )


def gpu_from_lgip(rows: list[LgipRow], name: str, gpu_index: int = 0) -> GpuMig:
    """A :class:`GpuMig` from parsed ``-lgip`` rows of one GPU: the recorded numbers win.

    Placements and memory slices come from the profile ID (``nvidia-smi mig -lgipp`` is the
    same on A100/H100/H200); an unknown ID is an error rather than a guess.
    """
    mine = [r for r in rows if r.gpu == gpu_index]
    if not mine:
        raise PipelineError(
            f"the nvidia-smi mig -lgip output has no profiles for GPU {gpu_index}",
            f"GPUs present: {sorted({r.gpu for r in rows})}",
        )
    profiles = []
    for r in mine:
        if r.profile_id not in PLACEMENTS_BY_ID:
            raise PipelineError(
                f"MIG profile {r.name} has ID {r.profile_id}, whose placements are unknown",
                "extend PLACEMENTS_BY_ID in pipeline/mig/profiles.py from `nvidia-smi mig -lgipp`",
            )
        profiles.append(
            MigProfile(
                name=r.name,
                profile_id=r.profile_id,
                memory_gib=r.memory_gib,
                sm_count=r.sm,
                max_instances=r.total,
                compute_slices=compute_slices_of(r.name),
                memory_slices=MEMORY_SLICES_BY_ID[r.profile_id],
                placements=PLACEMENTS_BY_ID[r.profile_id],
            )
        )
    return GpuMig(name=name, profiles=tuple(profiles), source="nvidia-smi mig -lgip output")


_GPU_LINE = re.compile(r"^GPU\s+(?P<index>\d+):\s+(?P<name>.+?)\s+\(UUID:\s*(?P<uuid>GPU-[^)\s]+)\)\s*$")
_MIG_LINE = re.compile(
    r"^\s+MIG\s+(?P<profile>\S+)\s+Device\s+(?P<index>\d+):\s+\(UUID:\s*(?P<uuid>MIG-[^)\s]+)\)\s*$"
)


def parse_list_gpus(text: str) -> list[GpuDevice]:
    """Parse ``nvidia-smi -L``: GPUs and, indented under each, its MIG devices with UUIDs."""
    gpus: list[GpuDevice] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if (g := _GPU_LINE.match(line)) is not None:
            gpus.append(GpuDevice(int(g["index"]), g["name"], g["uuid"], ()))
        elif (m := _MIG_LINE.match(line)) is not None:
            if not gpus:
                raise PipelineError(f"line {number} of nvidia-smi -L lists a MIG device before any GPU")
            last = gpus[-1]
            device = MigDevice(m["profile"], int(m["index"]), m["uuid"])
            gpus[-1] = GpuDevice(last.index, last.name, last.uuid, last.mig_devices + (device,))
        else:
            raise PipelineError(
                f"line {number} of the nvidia-smi -L output does not parse: {line.strip()!r}",
                "pass the unmodified output of `nvidia-smi -L`",
            )
    if not gpus:
        raise PipelineError("the nvidia-smi -L output lists no GPU")
    return gpus


def parse_query_csv(text: str) -> list[GpuQuery]:
    """Parse ``nvidia-smi --query-gpu=name,mig.mode.current,memory.total --format=csv``.

    The header is required (it names the columns); ``nounits`` values are accepted.
    """
    reader = csv.reader(io.StringIO(text.strip()), skipinitialspace=True)
    header = [h.split("[", 1)[0].strip() for h in next(reader, [])]
    wanted = ("name", "mig.mode.current", "memory.total")
    if not all(w in header for w in wanted):
        raise PipelineError(
            f"the nvidia-smi CSV has columns {header}, not {list(wanted)}",
            "run `nvidia-smi --query-gpu=name,mig.mode.current,memory.total --format=csv`",
        )
    out = []
    for row in reader:
        if not row:
            continue
        cells = dict(zip(header, (c.strip() for c in row)))
        memory = cells["memory.total"].removesuffix("MiB").strip()
        if not memory.isdigit():
            raise PipelineError(f"memory.total '{cells['memory.total']}' is not a MiB count")
        out.append(GpuQuery(cells["name"], cells["mig.mode.current"], int(memory)))
    if not out:
        raise PipelineError("the nvidia-smi CSV has a header but no GPU rows")
    return out


def gpu_key_from_query(query: GpuQuery) -> str:
    """The built-in table name for a queried GPU: ``NVIDIA H200`` with 143771 MiB → ``H200-141GB``."""
    return gpu_key(query.name, query.memory_total_mib)


def gpu_key_from_list(gpu: GpuDevice) -> str:
    """The built-in table name for a GPU line of ``nvidia-smi -L`` (``NVIDIA A100-SXM4-40GB`` → ``A100-40GB``).

    ``-L`` prints no memory size; the name carries it for A100 and H100, and its MIG profiles do too
    (A100 40GB slices are ``1g.5gb``, 80GB ones ``1g.10gb``).
    """
    mib = None
    size = re.search(r"(\d+)\s*GB", gpu.name, re.IGNORECASE)
    if size:
        mib = int(size.group(1)) * 1024
    elif "A100" in gpu.name.upper() and gpu.mig_devices:
        mib = 40 * 1024 if any(d.profile.startswith("1g.5gb") for d in gpu.mig_devices) else 80 * 1024
    return gpu_key(gpu.name, mib)


def gpu_key(name: str, mib: int | None) -> str:
    """The built-in table name for a GPU model name and (if known) its memory in MiB."""
    upper = name.upper()
    if "H200" in upper:
        return "H200-141GB"
    if "H100" in upper and mib is not None and mib < 90_000:
        return "H100-80GB"
    if "A100" in upper and mib is not None:
        return "A100-40GB" if mib < 50_000 else "A100-80GB"
    raise PipelineError(
        f"no built-in MIG table for '{name}'" + (f" with {mib} MiB" if mib is not None else ""),
        "pass the GPU's `nvidia-smi mig -lgip` output with --from-nvidia-smi and name it with --gpu",
    )


def kind_of_output(text: str) -> str:
    """Which nvidia-smi output ``text`` is: ``"lgip"``, ``"list"`` (``-L``) or ``"query"`` (CSV)."""
    if "GPU instance profiles" in text:
        return "lgip"
    if re.search(r"^GPU\s+\d+:.*\(UUID:\s*GPU-", text, re.MULTILINE):
        return "list"
    first = text.strip().splitlines()[0] if text.strip() else ""
    if "mig.mode.current" in first or "memory.total" in first:
        return "query"
    raise PipelineError(
        "the file is not nvidia-smi output this tool reads",
        "pass the output of `nvidia-smi mig -lgip`, `nvidia-smi -L` or "
        "`nvidia-smi --query-gpu=name,mig.mode.current,memory.total --format=csv`",
    )
