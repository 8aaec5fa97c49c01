"""NGC ``tritonserver:<YY.MM>-py3`` releases: what each runs, and whether a repository can load in it.

One table, :data:`RELEASES`, from 24.10 (the release the configs are written for: ``DEFAULT_TAG``)
to 26.08, the newest whose ONNX Runtime version could be read. Every optional field of a row is
either set or named in the row's ``unknown``; a set value is named in ``unverified`` unless it was
read in one of the sources below on 2026-12-02 (through the project's search index) or measured.

* ONNX Runtime: triton-inference-server/server ``docs/introduction/compatibility.md``, "ONNX
  Runtime Versions" (24.04 … 26.08), every row. One conflict: the 24.12 release notes (docs.nvidia.com
  archive ``triton-inference-server-2530``, "container also includes") list ONNX Runtime 1.19.2
  where that page says 1.20.1; the table keeps 1.20.1 — both have the same limits (below).
* Max ONNX IR version / ``ai.onnx`` opset (``ONNXRUNTIME_LIMITS``): measured, not read. Each
  listed ONNX Runtime version was installed from PyPI (the CPU wheel: same ONNX schema registry as
  the GPU build) and asked to load a one-node model per (opset, IR) pair
  (``scripts/ort_limits.py``); it refuses an opset or IR version past its own. ONNX Runtime's own
  compatibility page (microsoft/onnxruntime ``docs/reference/compatibility.md``, up to 1.20) agrees
  for 1.19/1.20 (ONNX 1.16.1, opset 21, IR 10). The earlier "from memory" values were wrong for
  1.20 (opset 22), 1.22 (IR 11 / opset 23) and 1.24+ (left out).
* Triton version, read: 24.12 = 2.53.0 (server PR #7864 "Update README and versions for 2.53.0 /
  24.12"; docs archive ``triton-inference-server-2530`` holds the 24.12 release notes); 25.01 =
  2.54.0 (docs archive ``triton-inference-server-2540``: its compatibility page's newest row is
  25.01); 25.03 = 2.56.0 (server ``build.py`` ``DEFAULT_TRITON_VERSION_MAP``: 2.56.0dev ↔
  25.03dev); 25.06 = 2.59.0 (server PR #8268 "Update README.md for 2.59.0 / 25.06 release");
  26.04 = 2.68.0 (server PR #8729: "the 26.04 container train and 2.68.0 release line").
  Unverified: 24.10 = 2.51.0 (the nvidia-pytriton 0.7.0 binary served here reports 2.51; not
  re-read); 25.07 = 2.59.1 (server PR #8428, a maintainer: "There was no 25.07 DLFW release, only
  PSIRT patches"; pytriton#108, a user: the fix "prior to 25.07, corresponding to 2.59.1"); the
  months between read ones by numbering — each bracket fits exactly (24.11; 25.02; 25.04–25.05;
  25.08–26.03: eight months for 2.60–2.67 under 2.68); 26.05 = 2.69.0 (a third-party wiki). 26.06
  on: unknown.
* CUDA, minimum driver and the data-center forward-compatibility drivers: the "Driver
  Requirements" paragraph of the release notes (docs.nvidia.com/deeplearning/triton-inference-server/
  release-notes/rel-YY-MM.html) for 24.10, 24.12, 25.01, 25.03, 25.04, 25.06, 25.08, 25.10, 25.12,
  26.02 (all naming R470/R525/R535/R545 for data-center GPUs), 26.06 and 26.08 (CUDA only: those
  notes name no driver). The notes' driver number is copied as written: from 25.03 on it is below
  what the CUDA release itself asks for (e.g. 575 for CUDA 13.0); not resolved here. Other months:
  no notes read (25.07 has none).
* TensorRT in the py3 image (:data:`TENSORRT_UNSOURCED`), searched again 2026-12-04 (docs, pages, issues and
  code corpora of the project's search index). Which image to take it from, read: Triton's QA builds the plans it
  tests for a release in the NGC TensorRT container of that same release — server ``qa/common/gen_qa_model_repository``
  (e.g. ``TRITON_VERSION=${TRITON_VERSION:=23.12}``) and ``qa/common/gen_qa_model_repository.v2``
  (``TRITON_VERSION=${TRITON_VERSION:=25.10}``) both set ``TENSORRT_IMAGE=${TENSORRT_IMAGE:=nvcr.io/nvidia/tensorrt:
  $TRITON_VERSION-py3}`` (.v2's header: "Update TENSORRT_IMAGE and PYTORCH_IMAGE to match what is being used by
  the tritonserver release being tested"); a maintainer (server#3904, 2022): "model generated with 22.01 TRT container will
  work with 22.01 Triton container". So the -py3 image of YY.MM runs the TensorRT of ``tensorrt:YY.MM-py3``
  (:func:`tensorrt_container`) — to major.minor at least: server#5975 found 8.6.1.2 in tritonserver:23.05 against
  8.6.1.6 in tensorrt:23.05. Which version that is, not read: the TensorRT Container Release Notes ("TensorRT
  container image version YY.MM is based on TensorRT X.Y.Z") are stored only as the table of contents of the
  tensorrt-1070 PDF (24.11 back) and per-release pages of 2018–2019 only; the Triton release notes' "container also
  includes" list is empty as stored (they refer to the Frameworks Support Matrix); no page of that matrix is
  stored; the compatibility page's TensorRT column is the ``trtllm-python-py3`` image's, a different build (10.4.0
  for 24.10-trtllm), not used. Third-party READMEs disagree (25.01: 10.8.0.43 in one, 10.7 in another), not used.
  So no row has a sourced TensorRT and no tag is offered for plans built elsewhere: ``build --triton-image`` and
  ``deploy`` refuse plans for it (:func:`check_plan_tensorrt`) and name ``--plans-at-deploy``, which builds them in
  that container. 24.10 keeps 10.5, unverified (the project's earlier parser data): below the engine stage's 10.8
  (``MIN_TENSORRT``) in any case. A row is offered once ``tensorrt`` is set from such a source (the full version,
  so the refusal can pin ``tensorrt==X.Y.Z.W``) and taken out of its ``unverified``/``unknown``.

What the configs need from the server, all read by 24.10 (Triton 2.51, which the project runs and
tests with ``--model-config-name``; onnxruntime_backend ``src/onnxruntime.cc`` parses the ``cuda``
accelerator and the ``trt_profile_*`` keys, which 24.03 still refused as "unknown parameter",
triton-inference-server/server#7156): an older tag is refused, with 24.10 named as the minimum.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

NGC_REPOSITORY = "nvcr.io/nvidia/tritonserver"
NGC_TENSORRT_REPOSITORY = "nvcr.io/nvidia/tensorrt"  # the NGC TensorRT container: the release's TensorRT (--plans-at-deploy builds there)
# Why a row's TensorRT is not sourced (module docstring, TensorRT): said by every refusal that rests on it.
TENSORRT_UNSOURCED = ("no NVIDIA source for it could be read: the release notes name none, and neither the Frameworks "
                      "Support Matrix nor the TensorRT container notes of that release are stored")
DEFAULT_TAG = "24.10"

# Newest ONNX IR version and ai.onnx opset each ONNX Runtime loads, measured (module docstring).
ONNXRUNTIME_LIMITS: dict[str, tuple[int, int]] = {
    "1.19.2": (10, 21), "1.20.1": (10, 21), "1.21.0": (10, 22), "1.22.0": (10, 22),
    "1.23.0": (11, 23), "1.23.1": (11, 23), "1.23.2": (11, 23),
    "1.24.1": (13, 25), "1.24.2": (13, 25), "1.24.4": (13, 25), "1.27.0": (13, 26), "1.28.0": (13, 26),
}


@dataclass(frozen=True)
class NgcRelease:
    """One NGC Triton release. A field named in ``unknown`` is ``None`` and not checked; one named in
    ``unverified`` was not read from a source (numbering, memory or a third party)."""

    tag: str  # YY.MM
    onnxruntime: str
    triton: str | None = None
    tensorrt: str | None = None  # in the -py3 image
    cuda: str | None = None
    min_driver: str | None = None  # as the release notes write it
    datacenter_drivers: str | None = None  # the notes' forward-compatible drivers for data-center GPUs
    max_ir: int | None = None
    max_opset: int | None = None
    unverified: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def image(self) -> str:
        """The image reference of this release."""
        return f"{NGC_REPOSITORY}:{self.tag}-py3"


OPTIONAL_FIELDS = tuple(f.name for f in fields(NgcRelease) if f.name not in ("tag", "onnxruntime", "unverified", "unknown"))


def _release(tag: str, onnxruntime: str, **values: Any) -> NgcRelease:
    limits = ONNXRUNTIME_LIMITS.get(onnxruntime.split("+")[0])
    max_ir, max_opset = limits if limits else (None, None)
    return NgcRelease(tag, onnxruntime, max_ir=max_ir, max_opset=max_opset, **values)


_DC = "470.57+ (R470), 525.85+ (R525), 535.86+ (R535), 545.23+ (R545)"
_NO_NOTES = ("cuda", "min_driver", "datacenter_drivers")
_NO_DRIVER = ("min_driver", "datacenter_drivers")
_TRT = ("tensorrt",)
_TRITON = ("triton",)


def _notes(cuda: str, driver: str) -> dict[str, str]:
    return {"cuda": cuda, "min_driver": driver, "datacenter_drivers": _DC}


RELEASES: tuple[NgcRelease, ...] = (
    _release("24.10", "1.19.2", triton="2.51.0", tensorrt="10.5", **_notes("12.6.2", "560"), unverified=("triton", "tensorrt")),
    _release("24.11", "1.19.2", triton="2.52.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("24.12", "1.20.1", triton="2.53.0", **_notes("12.6.3", "560"), unknown=_TRT),
    _release("25.01", "1.20.1", triton="2.54.0", **_notes("12.8.0.038", "560"), unknown=_TRT),
    _release("25.02", "1.20.1", triton="2.55.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("25.03", "1.21.0", triton="2.56.0", **_notes("12.8.1.012", "560"), unknown=_TRT),
    _release("25.04", "1.21.0", triton="2.57.0", **_notes("12.9.0", "575"), unverified=_TRITON, unknown=_TRT),
    _release("25.05", "1.22.0", triton="2.58.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("25.06", "1.22.0", triton="2.59.0", **_notes("12.9.1.010", "575"), unknown=_TRT),
    _release("25.07", "1.22.0", triton="2.59.1", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("25.08", "1.23.0+1d1712fdaf", triton="2.60.0", **_notes("13.0.0.044", "575"), unverified=_TRITON, unknown=_TRT),
    _release("25.09", "1.23.0", triton="2.61.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("25.10", "1.23.1", triton="2.62.0", **_notes("13.0.2.006", "575"), unverified=_TRITON, unknown=_TRT),
    _release("25.11", "1.23.2", triton="2.63.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("25.12", "1.23.2", triton="2.64.0", **_notes("13.1.0.36", "575"), unverified=_TRITON, unknown=_TRT),
    _release("26.01", "1.23.2", triton="2.65.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("26.02", "1.24.1", triton="2.66.0", **_notes("13.1.1", "575"), unverified=_TRITON, unknown=_TRT),
    _release("26.03", "1.24.2", triton="2.67.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("26.04", "1.24.4", triton="2.68.0", unknown=(*_TRT, *_NO_NOTES)),
    _release("26.05", "1.24.4", triton="2.69.0", unverified=_TRITON, unknown=(*_TRT, *_NO_NOTES)),
    _release("26.06", "1.24.4", cuda="13.3.0", unknown=(*_TRITON, *_TRT, *_NO_DRIVER)),
    _release("26.07", "1.27.0", unknown=(*_TRITON, *_TRT, *_NO_NOTES)),
    _release("26.08", "1.28.0", cuda="13.4.1", unknown=(*_TRITON, *_TRT, *_NO_DRIVER)),
)
_BY_TAG = {r.tag: r for r in RELEASES}
DEFAULT_RELEASE = _BY_TAG[DEFAULT_TAG]
DEFAULT_IMAGE = DEFAULT_RELEASE.image
_NGC_TAG = re.compile(rf"^{re.escape(NGC_REPOSITORY)}:(?P<tag>\d\d\.\d\d)-(?P<flavor>[\w.-]+)(?:@sha256:[0-9a-f]{{64}})?$")
_BARE_TAG = re.compile(r"^\d\d\.\d\d-[\w.-]+$")
# A container image reference as Docker reads it: lowercase repository path (an optional registry host:port first),
# an optional tag, an optional sha256 digest. Loose on purpose: it only catches what no registry could serve.
_IMAGE_REFERENCE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(?::[0-9]+/[a-z0-9._/-]+)?(?::\w[\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
# NGC tritonserver tags without a server: the client SDK (perf_analyzer, client libraries) only.
_NO_SERVER_FLAVORS = ("py3-sdk",)


def ngc_image(image: str) -> str:
    """``image`` as given, or the NGC tritonserver image when it is a bare NGC tag (``24.10-py3`` →
    ``nvcr.io/nvidia/tritonserver:24.10-py3``)."""
    return f"{NGC_REPOSITORY}:{image}" if _BARE_TAG.match(image) else image


def tensorrt_container(tag: str) -> str:
    """The NGC TensorRT container of release ``tag`` (``YY.MM``): the same monthly release's TensorRT."""
    return f"{NGC_TENSORRT_REPOSITORY}:{tag}-py3"


def ngc_tag(image: str) -> str | None:
    """``YY.MM`` when ``image`` is an NGC ``tritonserver:<YY.MM>-py3`` image, else None."""
    match = _NGC_TAG.match(image)
    return match["tag"] if match and match["flavor"] == "py3" else None


def _ngc_flavor(image: str) -> tuple[str, str] | None:
    """(``YY.MM``, flavor) of any NGC tritonserver image (``24.05-trtllm-python-py3`` → ("24.05",
    "trtllm-python-py3")), else None: the month decides what an image of any flavor can parse."""
    match = _NGC_TAG.match(image)
    return (match["tag"], match["flavor"]) if match else None


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
    from pipeline.backend.plan_binding import served_plan_metadata

    meta = served_plan_metadata(model_dir) or {}
    return str(meta.get("tensorrt_version") or "")


def minimum_tag(needs: ModelNeeds, releases: tuple[NgcRelease, ...] = RELEASES) -> str | None:
    """The oldest release in ``releases`` that can load ``needs`` (None: none the table knows)."""
    for release in releases:
        if release.max_ir is None or release.max_opset is None:
            return None
        if needs.ir_version <= release.max_ir and needs.opset <= release.max_opset:
            return release.tag
    return None


def sourced_tensorrt(release: NgcRelease) -> str | None:
    """The TensorRT of ``release``'s -py3 image when a source gives it (not guessed, not unverified), else None."""
    return release.tensorrt if release.tensorrt and "tensorrt" not in release.unverified else None


def tags_running_tensorrt(version: str, releases: tuple[NgcRelease, ...] = RELEASES) -> list[str]:
    """The tags whose -py3 image runs TensorRT ``version``'s major.minor by a source: the tags offered for such plans."""
    from pipeline.backend.plan_binding import same_tensorrt

    return [r.tag for r in releases if (v := sourced_tensorrt(r)) and same_tensorrt(version, v)]


def check_plan_tensorrt(image: str, version: str, releases: tuple[NgcRelease, ...] = RELEASES) -> None:
    """Refuse (PipelineError, one line) ``image`` for plans built with TensorRT ``version``: an image not in the
    table, a release whose TensorRT differs, or one whose TensorRT no source gives. The fix names the way out:
    the NGC TensorRT container of the same release, or a pinned wheel."""
    from pipeline.backend.plan_binding import same_tensorrt
    from pipeline.backend.tensorrt_env import MIN_TENSORRT, tensorrt_version_tuple

    tag = ngc_tag(image)
    release = next((r for r in releases if r.tag == tag), None)
    if release is None:
        raise PipelineError(
            f"{image} is not an NGC tritonserver -py3 tag of the release table ({releases[0].tag}…{releases[-1].tag}), so no "
            f"TensorRT {version} plan is known to load there",
            "pass an NGC tag of the table, or --no-engine to publish the ONNX variants only",
        )
    container = tensorrt_container(release.tag)
    if release.tensorrt and not same_tensorrt(version, release.tensorrt):
        runs = f"TensorRT {release.tensorrt}" + (" (not verified)" if "tensorrt" in release.unverified else "")
        wheel = f"pip install '{_wheel_pin(release.tensorrt)}'" \
            if tensorrt_version_tuple(release.tensorrt) >= MIN_TENSORRT else \
            f"a newer tag (TensorRT {_major_minor(release.tensorrt)} is older than {'.'.join(map(str, MIN_TENSORRT))}, the oldest the engine stage builds with)"
        raise PipelineError(
            f"plans built here with TensorRT {version} do not load in {image}, which runs {runs}",
            f"build them with that release's TensorRT: --plans-at-deploy (the deploy bundle builds them in {container}), or {wheel}; "
            "or pass --no-engine",
        )
    if sourced_tensorrt(release) is None:
        raise PipelineError(
            f"the TensorRT of {image} is not known from a source ({TENSORRT_UNSOURCED}), so no plan built here "
            f"(TensorRT {version}) is offered for it",
            f"build the plans with that release's own TensorRT: --plans-at-deploy (the deploy bundle builds them in {container}), "
            "or pass --no-engine",
        )


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _wheel_pin(version: str) -> str:
    """pip's requirement for TensorRT ``version``: exact when the table gives all four parts, else its major.minor."""
    return f"tensorrt=={version}" if len(version.split(".")) >= 4 else f"tensorrt=={_major_minor(version)}.*"


def check_image(image: str, models: list[ModelNeeds], releases: tuple[NgcRelease, ...] = RELEASES) -> list[str]:
    """Refuse (PipelineError, one line) an image that cannot load ``models``; return what was not
    checked (empty when everything was).

    An NGC tag older than :data:`DEFAULT_TAG` is refused (the configs need 24.10's keys); a tag the
    table lists is checked for every ONNX model's IR version and opset and every plan's TensorRT
    (the same version on as many parts as the table gives, the refusal naming a tag whose TensorRT matches when the table knows one); any
    other image (a newer NGC tag, a private registry) is not refused — newer ONNX Runtime releases
    load older IR versions and opsets — and the returned lines say what went unchecked.
    ``releases`` is the table (:data:`RELEASES`; another one only to exercise the check).
    """
    if not _IMAGE_REFERENCE.match(image):
        raise PipelineError(f"image {image!r} is not a container image reference",
                            f"pass one such as {DEFAULT_IMAGE} (lowercase repository, optional :tag)")
    tag = ngc_tag(image)
    flavored = _ngc_flavor(image)
    if flavored and flavored[1] in _NO_SERVER_FLAVORS:
        raise PipelineError(f"{image} is NGC's client SDK image: it has no tritonserver to run",
                            f"use {NGC_REPOSITORY}:{flavored[0]}-py3 (the server image of the same release)")
    if flavored is not None and flavored[0] < DEFAULT_TAG:  # every flavor of an older month has the older backend
        raise PipelineError(
            f"{image} is older than {DEFAULT_TAG}: its onnxruntime backend refuses the configs' keys "
            "(the cuda accelerator, trt_profile_* shapes) and --model-config-name is not checked there",
            f"use {NGC_REPOSITORY}:{DEFAULT_TAG}-py3 or newer",
        )
    release = next((r for r in releases if r.tag == tag), None)
    if release is None:
        plan = next((n for n in models if n.is_plan), None)
        if plan is not None:
            raise PipelineError(
                f"model {plan.name} is a TensorRT plan, and {image} is not an NGC tritonserver -py3 tag of the release table "
                f"({releases[0].tag}…{releases[-1].tag}): which TensorRT it runs is not known, and a plan loads only on the TensorRT that built it",
                f"pass --image with an NGC tag of the table whose TensorRT is {plan.plan_tensorrt or 'the plan’s'}, or rebuild the plan with "
                "that image's own TensorRT",
            )
        return [f"{image} is not in the NGC release table ({releases[0].tag}…{releases[-1].tag}): "
                "ONNX IR version/opset limits were not checked"]
    unchecked = []
    for needs in models:
        if needs.is_plan:
            unchecked += _check_plan(release, needs, releases)
            continue
        if release.max_ir is None or release.max_opset is None:
            unchecked.append(f"{needs.name}: {image}'s ONNX Runtime {release.onnxruntime} limits are not in the table")
            continue
        if needs.ir_version > release.max_ir or needs.opset > release.max_opset:
            least = minimum_tag(needs, releases)
            fix = f"use {NGC_REPOSITORY}:{least}-py3 or newer, or export with a lower --opset" if least else \
                "export with a lower --opset"
            raise PipelineError(
                f"model {needs.name} has ONNX IR version {needs.ir_version} and opset {needs.opset}, but {image} "
                f"(ONNX Runtime {release.onnxruntime}) loads at most IR {release.max_ir} / opset {release.max_opset}",
                fix,
            )
    return unchecked


def _check_plan(release: NgcRelease, needs: ModelNeeds, releases: tuple[NgcRelease, ...]) -> list[str]:
    from pipeline.backend.plan_binding import same_tensorrt

    if not needs.plan_tensorrt:
        raise PipelineError(
            f"model {needs.name} is a TensorRT plan, and a plan only loads on the TensorRT version that built it",
            "rebuild it so its metadata records the TensorRT version, and pass --image the NGC tag with that TensorRT",
        )
    matching = tags_running_tensorrt(needs.plan_tensorrt, releases)
    if release.tensorrt is None:
        known = f"pass --image {NGC_REPOSITORY}:{matching[-1]}-py3, which runs TensorRT {_major_minor(needs.plan_tensorrt)}" \
            if matching else f"build with --plans-at-deploy instead: the bundle builds the plan with that release's own TensorRT ({tensorrt_container(release.tag)})"
        raise PipelineError(
            f"model {needs.name} is a TensorRT plan built with TensorRT {needs.plan_tensorrt}, and the TensorRT of {release.image} "
            f"is not known from a source ({TENSORRT_UNSOURCED})", known)
    if not same_tensorrt(needs.plan_tensorrt, release.tensorrt):
        from pipeline.backend.tensorrt_env import MIN_TENSORRT, tensorrt_version_tuple

        # A plan loads only on the TensorRT that built it; compared on as many parts as the table gives.
        runs = f"TensorRT {release.tensorrt}" + (" (the table's value, not verified)" if "tensorrt" in release.unverified else "")
        fix = f"pass --image {NGC_REPOSITORY}:{matching[-1]}-py3, which runs TensorRT {_major_minor(needs.plan_tensorrt)}" \
            if matching else f"no tag in the table is known to run TensorRT {_major_minor(needs.plan_tensorrt)}"
        # The engine stage builds only with MIN_TENSORRT or newer: an image below it cannot run any plan of this pipeline.
        rebuild = f"or rebuild the plan with TensorRT {release.tensorrt} for this image" \
            if tensorrt_version_tuple(release.tensorrt) >= MIN_TENSORRT else \
            f"this image's TensorRT is older than {'.'.join(map(str, MIN_TENSORRT))}, the oldest the engine stage builds with, " \
            "so serve the plan from a newer tag whose TensorRT is the build host's"
        raise PipelineError(
            f"model {needs.name} is a TensorRT plan built with TensorRT {needs.plan_tensorrt}, but {release.image} runs {runs}",
            f"{fix}; {rebuild}",
        )
    if sourced_tensorrt(release) is None:
        raise PipelineError(
            f"model {needs.name} is a TensorRT plan built with TensorRT {needs.plan_tensorrt}; the table's TensorRT {release.tensorrt} "
            f"for {release.image} is not verified ({TENSORRT_UNSOURCED})",
            f"build with --plans-at-deploy instead: the bundle builds the plan with that release's own TensorRT ({tensorrt_container(release.tag)})",
        )
    return []
