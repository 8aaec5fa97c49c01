"""Artifacts → Triton model repository: configs, labels, warmup samples, MIG per-profile configs,
the atomic publish, and the production deploy bundle beside the repository."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.accuracy.evaldata import EvalData
from pipeline.core.errors import require_creatable
from pipeline.core.objectstore import S3Url, local_only
from pipeline.data.artifacts import PRECISIONS, Artifact
from pipeline.data.tensors import signature_from_onnx
from pipeline.data.workspace import ModelData
from pipeline.triton.deploy_plans import DeployPlans
from pipeline.triton.ensemble import RawInputs

log = logging.getLogger(__name__)

LABELS_FILE = ModelData.LABELS  # the labels file keeps its name in the Triton model directory


@dataclass(frozen=True)
class PublishSettings:
    """How the repository is written (from BuildConfig)."""

    model: str
    repository: Path | S3Url  # a folder, or s3://BUCKET/PREFIX (pipeline/triton/s3repository.py)
    max_batch: int
    version_policy: str
    labels: Path | None  # a labels.txt for the classifier output, if any
    classifier_output: str | None
    mig: str | None  # "GPU[:LAYOUT]", e.g. "H200-141GB:3x2g.35gb,1x1g.18gb"
    image: str | None  # NGC tritonserver image for the deploy bundle (None: the default, 24.10)
    deploy_plans: DeployPlans | None = None  # --plans-at-deploy: what the bundle builds plans with
    bundle: bool = True  # write the deploy bundle beside the repository (not for the raw-input gate's own repository)


def preferred_batch_sizes(max_batch: int) -> list[int]:
    """Half and full max batch: the batcher waits briefly to fill one, never blocks on it."""
    return sorted({max(1, max_batch // 2), max_batch})


def repository_from_artifacts(
    artifacts: Sequence[Artifact],
    onnx_of: Mapping[str, Path],
    warmup: Mapping[str, np.ndarray],
    settings: PublishSettings,
    report: Mapping[str, Any],
    reproduce: str,
    golden: EvalData | None = None,
    raw: RawInputs | None = None,
) -> list[Path] | list[str]:
    """Publish one Triton model per artifact; return the new version folders (URLs in S3).

    ``onnx_of`` maps a precision to its ONNX variant, whose I/O a plan of that precision must match.
    With ``settings.deploy_plans``, each GPU ONNX variant also gets what the deploy bundle builds its plan
    from, golden outputs computed on ``golden`` (:mod:`pipeline.triton.deploy_plans`). With ``raw``, the
    preprocessing model and the ensemble that answer raw requests go beside them (:mod:`pipeline.triton.ensemble`).
    """
    from pipeline.data.uint8_wire import quantized, uint8_scales
    from pipeline.triton.config import model_config_from_artifact, warmup_files
    from pipeline.triton.deploy import DEFAULT_IMAGE, write_deploy_bundle
    from pipeline.triton.repository import publish_repository

    check_repository_plans(artifacts, settings)
    configs = {}
    extra: dict[str, dict[str, bytes]] = {}
    for artifact in artifacts:
        name = artifact.triton_name(settings.model)
        signature = signature_from_onnx(onnx_of[artifact.precision])
        samples = quantized(warmup, uint8_scales(onnx_of[artifact.precision]))  # what a client sends a uint8-input variant
        configs[name] = model_config_from_artifact(
            artifact,
            name=name,
            signature=signature,
            max_batch=settings.max_batch,
            labels_file=LABELS_FILE if settings.labels else None,
            classifier_output=settings.classifier_output if settings.labels else None,
            warmup=samples,
            preferred_batch_sizes=preferred_batch_sizes(settings.max_batch),
        )
        extra[name] = dict(warmup_files(signature, samples, settings.max_batch))
        if settings.labels:
            extra[name][LABELS_FILE] = settings.labels.read_bytes()
        if settings.deploy_plans is not None and golden is not None and artifact.kind == "onnx" and artifact.precision in PRECISIONS:
            extra[name].update(_deploy_plan_files(artifact, configs[name], signature, settings, golden))
    riders: dict[str, str] = {}
    if raw is not None:
        from pipeline.triton.ensemble import raw_input_models

        models, raw_configs, raw_files = raw_input_models(raw, settings.model, signature_from_onnx(onnx_of[raw.variant.precision]),
                                                          settings.labels.read_bytes() if settings.labels else None,
                                                          settings.classifier_output, settings.max_batch)
        riders = {m.triton_name(settings.model): raw.variant.triton_name(settings.model) for m in models}
    if settings.mig:
        if settings.deploy_plans is not None:
            from pipeline.mig.bundle import PLANS_NOT_BUILT

            log.warning("%s", PLANS_NOT_BUILT.format("the GPU ONNX variants"))
        for name, files in _mig_files(artifacts, configs, settings, riders, raw).items():
            extra[name].update(files)
    if raw is not None:
        artifacts = [*artifacts, *models]
        configs.update(raw_configs)
        extra.update(raw_files)
    published: list[Path] | list[str]
    if isinstance(settings.repository, S3Url):
        from pipeline.triton.s3repository import publish_s3_repository

        published = publish_s3_repository(artifacts, model=settings.model, url=settings.repository, configs=configs, extra_files=extra,
                                          version_policy=settings.version_policy, report=report, reproduce=reproduce)
    else:
        published = publish_repository(artifacts, model=settings.model, repository=settings.repository, configs=configs, extra_files=extra,
                                       version_policy=settings.version_policy, report=report, reproduce=reproduce)
    if not settings.bundle:
        pass
    elif settings.image is None and any(a.kind == "plan" for a in artifacts):
        # A plan loads only on the TensorRT that built it, and which NGC tag ships that TensorRT is the user's call.
        log.warning("deploy bundle not written: TensorRT plans need --triton-image naming the NGC tag with the TensorRT that built them")
    else:
        from pipeline.triton.ngc_releases import ngc_image

        image = ngc_image(settings.image or DEFAULT_IMAGE)  # a bare NGC tag (24.10-py3) names the NGC image
        write_deploy_bundle(settings.repository, deploy_dir(settings.repository), image=image, quiet=True)  # logs where it went
    return published


def require_publishable(repository: Path | S3Url) -> None:
    """PipelineError now, before any work, when the build could not publish to ``repository``: a folder that
    cannot be created, a bucket that does not exist or cannot be reached."""
    if isinstance(repository, S3Url):
        from pipeline.triton.s3repository import S3Repository

        S3Repository(repository)  # reaches the bucket
    else:
        require_creatable(repository, "--repository")


def _deploy_plan_files(artifact: Artifact, config: Any, signature: Any, settings: PublishSettings, data: EvalData) -> dict[str, bytes]:
    from pipeline.triton.deploy_plans import deploy_plan_files, plan_config

    assert settings.deploy_plans is not None
    name = Artifact(artifact.precision, "plan", artifact.path).triton_name(settings.model)
    cfg = plan_config(config, name, settings.deploy_plans.profiles, signature)
    return deploy_plan_files(artifact.path, artifact.precision, cfg, settings.deploy_plans, data)


def check_repository_plans(artifacts: Sequence[Artifact], settings: PublishSettings) -> None:
    """One server loads a repository: the plans already published there (other models' newest versions)
    must load where this build's plans load (same TensorRT major.minor, a GPU they run on); PipelineError
    (one line) naming the first that cannot."""
    from pipeline.backend.plan_binding import PlanBinding, check_plan_models
    from pipeline.stages.engine import read_engine_metadata
    from pipeline.triton.repository import read_repository

    plans = [a for a in artifacts if a.kind == "plan" and a.metadata is not None]
    if isinstance(settings.repository, S3Url):
        log.warning("the plans already in %s are not checked against this build's TensorRT (only a local repository is)", settings.repository)
        return
    if not plans or not any(Path(settings.repository).glob("*/config.pbtxt")):
        return
    binding = PlanBinding.of(read_engine_metadata(plans[0].metadata), f"the metadata of {plans[0].path}")  # type: ignore[arg-type]
    ours = {a.triton_name(settings.model) for a in artifacts}
    others = {name: model.path for name, model in read_repository(settings.repository).items()
              if name not in ours and (model.config.platform == "tensorrt_plan" or model.config.backend == "tensorrt")}
    gpu = binding.compute_capability if binding.hardware_compatibility == "NONE" else None
    check_plan_models(others, tensorrt_version=binding.tensorrt_version, compute_capability=gpu,
                      target=f"the server of {settings.repository} (this build's plans: TensorRT {binding.tensorrt_version}, {binding.gpu_name})")


def published_from_artifacts(
    artifacts: Sequence[Artifact],
    data: EvalData,
    dst: Path,
    *,
    settings: PublishSettings,
    onnx_of: Mapping[str, Path],
    report: Mapping[str, Any],
    reproduce: str,
    raw: RawInputs | None = None,
) -> Path:
    """The publish stage: :func:`repository_from_artifacts` with the first evaluation sample as warmup,
    then the list of new version folders to ``dst`` (JSON)."""
    import json

    from pipeline.core.atomic import write_text_atomic

    published = repository_from_artifacts(artifacts, onnx_of, data.head(1), settings, report, reproduce, golden=data, raw=raw)
    return write_text_atomic(dst, json.dumps([str(p) for p in published]) + "\n")


def published_configs(artifacts: Sequence[Artifact], settings: PublishSettings, raw: RawInputs | None = None) -> list[Path]:
    """The ``config.pbtxt`` of every model a publish writes (they must exist for the stage to be skipped);
    none to check locally for an ``s3://`` repository."""
    if isinstance(settings.repository, S3Url):
        return []
    names = [a.triton_name(settings.model) for a in artifacts]
    if raw is not None:
        from pipeline.triton.ensemble import ensemble_name, preprocess_name, tokenize_name

        from pipeline.triton.ensemble import guard_name

        names += [settings.model, tokenize_name(settings.model)] if raw.kind == "text" else [
            settings.model, guard_name(settings.model), preprocess_name(settings.model), ensemble_name(settings.model, True),
            preprocess_name(settings.model, True)]
    return [Path(settings.repository) / name / "config.pbtxt" for name in names]


def deploy_dir(repository: Path | S3Url) -> Path:
    """Where the deploy bundle goes: ``deploy/`` beside the repository (in the current folder for ``s3://``)."""
    if isinstance(repository, S3Url):
        return Path("deploy").absolute()
    return Path(repository).absolute().parent / "deploy"


def _mig_files(artifacts: Sequence[Artifact], configs: Mapping[str, Any], settings: PublishSettings, riders: Mapping[str, str],
               raw: RawInputs | None) -> dict[str, dict[str, bytes]]:
    """Per-profile configs of the GPU variants and the MIG bundle; a raw-input ensemble and its CPU step ride with the
    variant they serve (unless its custom-op library needs libpython: then they are left out, saying why)."""
    from pipeline.mig.bundle import write_bundle
    from pipeline.mig.configs import mig_configs_for_repository
    from pipeline.mig.memory import memory_for_artifact
    from pipeline.mig.plan import with_riders
    from pipeline.mig.servers import BundleSettings

    gpu, _, layout = (settings.mig or "").partition(":")
    on_gpu = [a for a in artifacts if not a.cpu_only]  # CPU-only variants take no MIG slice
    memory = {a.triton_name(settings.model): memory_for_artifact(a, settings.max_batch) for a in on_gpu}
    plan, files = mig_configs_for_repository({name: configs[name] for name in memory}, gpu, layout or None, memory)
    if riders and raw is not None and raw.library is not None:
        from pipeline.backend.extensions import STANDALONE_HOWTO, python_symbols

        if python_symbols(raw.library):
            from pipeline.triton.ensemble import guard_name, preprocess_name

            log.warning("MIG bundle: %s is not loaded: its custom-op library is onnxruntime-extensions' CPython module, which the C++ "
                        "onnxruntime backend cannot load — %s", settings.model, STANDALONE_HOWTO)
            needs_library = {settings.model, guard_name(settings.model), preprocess_name(settings.model)}
            riders = {m: anchor for m, anchor in riders.items() if m not in needs_library}
    plan = with_riders(plan, dict(riders))
    bundle = BundleSettings(image=settings.image) if settings.image else BundleSettings()
    out = deploy_dir(settings.repository) / "mig"
    write_bundle(out, plan, bundle, repository=local_only(settings.repository, "build --mig"))
    log.info("MIG plan for %s: per-profile configs and launch bundle in %s", gpu, out)
    return files
