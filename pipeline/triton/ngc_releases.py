"""NGC ``tritonserver:<YY.MM>-py3`` releases: what each runs, and whether a repository can load in it.

One table, :data:`RELEASES`, from 24.10 (the release the configs are written for: ``DEFAULT_TAG``)
to the newest whose ONNX Runtime version could be read. Sources (read 2026-12-02 through the
project's search index):

* ONNX Runtime per release: triton-inference-server/server ``docs/introduction/compatibility.md``,
  section "ONNX Runtime Versions" (24.04 … 26.08). Every ``onnxruntime`` value is from there.
* Triton version: 24.10 = 2.51.0 (the nvidia-pytriton 0.7.0 binary served here reports 2.51 and is
  the 24.10 server); 25.03 = 2.56.0 (server ``build.py``: ``DEFAULT_TRITON_VERSION_MAP``
  release 2.56.0dev ↔ container 25.03dev). The months between follow the monthly numbering and are
  marked ``unverified``; later releases are left out (``None``).
* CUDA and minimum driver: the "Driver Requirements" paragraph of the release notes
  (docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-YY-MM.html) for 24.10,
  25.03, 25.08 and 25.10; ``None`` elsewhere. The notes' driver number is copied as written (for
  25.03/25.08/25.10 it is lower than what their CUDA release itself asks for; not resolved here).
* TensorRT: only 24.10 (10.5, as the project's parser data and README state it; not re-read here).
  The py3 image's TensorRT is not in the compatibility page (its TensorRT column is the
  ``trtllm`` image's), so other rows say ``None`` and a plan's TensorRT is then not checked.
* Newest ONNX IR version / ``ai.onnx`` opset ONNX Runtime loads: 1.19 → IR 10 / opset 21 (the
  project's earlier check for 24.10, ONNX 1.16). Later versions follow ONNX Runtime's
  compatibility table (1.20/1.21: ONNX 1.17, IR 10 / opset 22; 1.22/1.23: ONNX 1.18, IR 11 /
  opset 23) from memory, marked ``unverified``; 1.24 and later are left ``None`` (not checked).

What the configs need from the server, all read by 24.10 (Triton 2.51, which the project runs and
tests with ``--model-config-name``; onnxruntime_backend ``src/onnxruntime.cc`` parses the ``cuda``
accelerator and the ``trt_profile_*`` keys, which 24.03 still refused as "unknown parameter",
triton-inference-server/server#7156): an older tag is refused, with 24.10 named as the minimum.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

NGC_REPOSITORY = "nvcr.io/nvidia/tritonserver"
DEFAULT_TAG = "24.10"


@dataclass(frozen=True)
class NgcRelease:
    """One NGC Triton release (``None``: not verified, so not checked)."""

    tag: str  # YY.MM
    onnxruntime: str
    triton: str | None = None
    tensorrt: str | None = None
    cuda: str | None = None
    min_driver: str | None = None
    max_ir: int | None = None
    max_opset: int | None = None
    unverified: tuple[str, ...] = ()  # fields given from memory or by numbering, not read from a source

    @property
    def image(self) -> str:
        """The image reference of this release."""
        return f"{NGC_REPOSITORY}:{self.tag}-py3"


_MEMORY = ("max_ir", "max_opset")
RELEASES: tuple[NgcRelease, ...] = (
    NgcRelease("24.10", "1.19.2", "2.51.0", "10.5", "12.6.2", "560", 10, 21, ("tensorrt",)),
    NgcRelease("24.11", "1.19.2", "2.52.0", max_ir=10, max_opset=21, unverified=("triton",)),
    NgcRelease("24.12", "1.20.1", "2.53.0", max_ir=10, max_opset=22, unverified=("triton", *_MEMORY)),
    NgcRelease("25.01", "1.20.1", "2.54.0", max_ir=10, max_opset=22, unverified=("triton", *_MEMORY)),
    NgcRelease("25.02", "1.20.1", "2.55.0", max_ir=10, max_opset=22, unverified=("triton", *_MEMORY)),
    NgcRelease("25.03", "1.21.0", "2.56.0", None, "12.8.1.012", "560", 10, 22, _MEMORY),
    NgcRelease("25.04", "1.21.0", "2.57.0", max_ir=10, max_opset=22, unverified=("triton", *_MEMORY)),
    NgcRelease("25.05", "1.22.0", "2.58.0", max_ir=11, max_opset=23, unverified=("triton", *_MEMORY)),
    NgcRelease("25.06", "1.22.0", "2.59.0", max_ir=11, max_opset=23, unverified=("triton", *_MEMORY)),
    NgcRelease("25.07", "1.22.0", max_ir=11, max_opset=23, unverified=_MEMORY),
    NgcRelease("25.08", "1.23.0", cuda="13.0.0.044", min_driver="575", max_ir=11, max_opset=23, unverified=_MEMORY),
    NgcRelease("25.09", "1.23.0", max_ir=11, max_opset=23, unverified=_MEMORY),
    NgcRelease("25.10", "1.23.1", cuda="13.0.2.006", min_driver="575", max_ir=11, max_opset=23, unverified=_MEMORY),
    NgcRelease("25.11", "1.23.2", max_ir=11, max_opset=23, unverified=_MEMORY),
    NgcRelease("25.12", "1.23.2", max_ir=11, max_opset=23, unverified=_MEMORY),
    NgcRelease("26.01", "1.23.2", max_ir=11, max_opset=23, unverified=_MEMORY),
    NgcRelease("26.02", "1.24.1"),
    NgcRelease("26.03", "1.24.2"),
    NgcRelease("26.04", "1.24.4"),
    NgcRelease("26.05", "1.24.4"),
    NgcRelease("26.06", "1.24.4"),
    NgcRelease("26.07", "1.27.0"),
    NgcRelease("26.08", "1.28.0"),
)
_BY_TAG = {r.tag: r for r in RELEASES}
DEFAULT_RELEASE = _BY_TAG[DEFAULT_TAG]
DEFAULT_IMAGE = DEFAULT_RELEASE.image
_NGC_TAG = re.compile(rf"^{re.escape(NGC_REPOSITORY)}:(?P<tag>\d\d\.\d\d)-py3$")


def image_tag(image: str) -> str:
    """The tag of an image reference (``nvcr.io/nvidia/tritonserver:24.10-py3`` → ``24.10-py3``)."""
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else "latest"


def ngc_tag(image: str) -> str | None:
    """``YY.MM`` when ``image`` is an NGC ``tritonserver:<YY.MM>-py3`` image, else None."""
    match = _NGC_TAG.match(image)
    return match["tag"] if match else None


def release_for(image: str) -> NgcRelease | None:
    """The table's row for ``image``, or None when it is not an NGC py3 tag the table lists."""
    tag = ngc_tag(image)
    return _BY_TAG.get(tag) if tag else None


@dataclass(frozen=True)
class ModelNeeds:
    """What one published model asks of the server image."""

    name: str
    ir_version: int = 0
    opset: int = 0
    plan_tensorrt: str | None = None  # the TensorRT a plan was built with ("" when it records none)
    is_plan: bool = False


def needs_of(name: str, info: Any, model_file: Path | None) -> ModelNeeds:
    """The needs of one model of ``read_repository`` (its ONNX file read without external data)."""
    config = info.config
    if config.platform == "tensorrt_plan" or config.backend == "tensorrt":
        return ModelNeeds(name, is_plan=True, plan_tensorrt=_plan_tensorrt(info.path))
    if model_file is None:
        return ModelNeeds(name)
    import onnx

    proto = onnx.load(str(model_file), load_external_data=False)
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return ModelNeeds(name, proto.ir_version, opset)


def repository_needs(models: dict[str, Any], names: list[str]) -> list[ModelNeeds]:
    """The needs of ``names`` among ``models`` (``read_repository``), one per version file."""
    from pipeline.triton.repository import model_filename

    needs = []
    for name in names:
        info = models[name]
        if info.config.platform != "onnxruntime_onnx" and info.config.backend != "onnxruntime":
            needs.append(needs_of(name, info, None))
            continue
        for version in info.versions:
            path = info.path / str(version) / model_filename(info.config)
            needs.append(needs_of(name, info, path / "model.onnx" if path.is_dir() else path))
    return needs


def _plan_tensorrt(model_dir: Path) -> str:
    from pipeline.triton.repository import REPORT

    try:
        versions = json.loads((model_dir / REPORT).read_text())["versions"]
        meta = versions[max(versions, key=int)].get("engine_metadata") or {}
        return str(meta.get("tensorrt_version") or meta.get("trt_version") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def minimum_tag(needs: ModelNeeds) -> str | None:
    """The oldest release in the table that can load ``needs`` (None: none the table knows)."""
    for release in RELEASES:
        if release.max_ir is None or release.max_opset is None:
            return None
        if needs.ir_version <= release.max_ir and needs.opset <= release.max_opset:
            return release.tag
    return None


def check_image(image: str, models: list[ModelNeeds]) -> list[str]:
    """Refuse (PipelineError, one line) an image that cannot load ``models``; return what was not
    checked (empty when everything was).

    An NGC tag older than :data:`DEFAULT_TAG` is refused (the configs need 24.10's keys); a tag the
    table lists is checked for every ONNX model's IR version and opset and every plan's TensorRT;
    any other image (a newer NGC tag, a private registry) is not refused — newer ONNX Runtime
    releases load older IR versions and opsets — and the returned lines say what went unchecked.
    """
    tag = ngc_tag(image)
    if tag is not None and tag < DEFAULT_TAG:
        raise PipelineError(
            f"{image} is older than {DEFAULT_TAG}: its onnxruntime backend refuses the configs' keys "
            "(the cuda accelerator, trt_profile_* shapes) and --model-config-name is not checked there",
            f"use {NGC_REPOSITORY}:{DEFAULT_TAG}-py3 or newer",
        )
    release = _BY_TAG.get(tag) if tag else None
    if release is None:
        return [f"{image} is not in the NGC release table ({RELEASES[0].tag}…{RELEASES[-1].tag}): "
                "ONNX IR version/opset limits and TensorRT plan versions were not checked"]
    unchecked = []
    for needs in models:
        if needs.is_plan:
            unchecked += _check_plan(release, needs)
            continue
        if release.max_ir is None or release.max_opset is None:
            unchecked.append(f"{needs.name}: {image}'s ONNX Runtime {release.onnxruntime} limits are not in the table")
            continue
        if needs.ir_version > release.max_ir or needs.opset > release.max_opset:
            least = minimum_tag(needs)
            fix = f"use {NGC_REPOSITORY}:{least}-py3 or newer" if least else "export with a lower --opset"
            raise PipelineError(
                f"model {needs.name} has ONNX IR version {needs.ir_version} and opset {needs.opset}, but {image} "
                f"(ONNX Runtime {release.onnxruntime}) loads at most IR {release.max_ir} / opset {release.max_opset}",
                f"{fix}, or export with a lower --opset",
            )
    return unchecked


def _check_plan(release: NgcRelease, needs: ModelNeeds) -> list[str]:
    if not needs.plan_tensorrt:
        raise PipelineError(
            f"model {needs.name} is a TensorRT plan, and a plan only loads on the TensorRT version that built it",
            "rebuild it so its metadata records the TensorRT version, and pass --image the NGC tag with that TensorRT",
        )
    if release.tensorrt is None:
        return [f"{needs.name}: built with TensorRT {needs.plan_tensorrt}; {release.image}'s TensorRT is not in the table"]
    built = needs.plan_tensorrt.split(".")[:2]
    if built != release.tensorrt.split(".")[:2]:
        raise PipelineError(
            f"model {needs.name} is a TensorRT plan built with TensorRT {needs.plan_tensorrt}, but {release.image} "
            f"runs TensorRT {release.tensorrt}",
            "pass --image the NGC tag whose release notes list the plan's TensorRT, or rebuild the plan there",
        )
    return []
