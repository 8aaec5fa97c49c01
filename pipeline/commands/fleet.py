"""``python -m pipeline build --fleet FILE``: many models, each built by
:func:`pipeline.build.orchestrator.build`, into one repository.

A fleet file lists the models as ``[[model]]`` tables whose keys are ``build``'s options (as in a
``--config`` file); each table's values override the command line's for that model::

    [[model]]
    name = "digits"
    fp16 = true

    [[model]]
    model = "models/resnet.keras"
    eval-data = "data/resnet_eval.npz"
    int8 = true
    calibration = "data/resnet_calib.npz"

The models are built one after another (each build keeps to ``--max-memory-gib``; side by side two
builds would need twice that), all publishing into the same ``--repository``. A model that fails
(its gate, its conversion, its data) is recorded and the next one is built; a summary table lists
every model, and the exit status is 1 naming the failed ones. ``--k8s-job FILE`` writes an Indexed
Job instead: one model per completion index, each pod running ``build --fleet ... --fleet-index
$(FLEET_INDEX)`` (the pod's completion index) and publishing into the shared ``s3://`` repository; when engines are built
its pods are pinned to the GPU they serve on (``--gpu-product``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import CheckFailed, PipelineError, require
from pipeline.core.objectstore import S3Url

if TYPE_CHECKING:
    from pipeline.build.config import BuildConfig

log = logging.getLogger(__name__)

FLEET_DIR = "/fleet"  # where the Job mounts the fleet file
_FLEET_OPTIONS = ("fleet", "fleet_index", "k8s_job")


def fleet_models(cfg: BuildConfig) -> list[BuildConfig]:
    """One BuildConfig per ``[[model]]`` of ``cfg.fleet``: the command line's settings with the table's over them."""
    from pipeline.commands.configfile import tomllib
    from pipeline.core.options import check_options, config_from_values, values_from_mapping

    assert cfg.fleet is not None
    require(cfg.fleet.is_file(), f"fleet file {cfg.fleet} does not exist", "pass a TOML file with one [[model]] table per model")
    try:
        tables = tomllib.loads(cfg.fleet.read_text()).get("model")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PipelineError(f"fleet file {cfg.fleet} is not valid TOML ({exc})", "fix the file") from None
    require(isinstance(tables, list) and bool(tables) and all(isinstance(t, dict) for t in tables),
            f"fleet file {cfg.fleet} lists no [[model]] tables", "add one [[model]] table of build options per model")
    models = []
    for i, table in enumerate(tables or []):
        values = values_from_mapping(type(cfg), table, f"{cfg.fleet} [[model]] {i}")
        unknown = sorted(set(values) & set(_FLEET_OPTIONS))
        require(not unknown, f"[[model]] {i} of {cfg.fleet} sets {', '.join(unknown)}", "set fleet options on the command line only")
        model = config_from_values(type(cfg), {**_flat(cfg), **values, "fleet": None, "fleet_index": None, "k8s_job": None})
        check_options(model)
        models.append(model)
    return models


def _flat(config: Any) -> dict[str, Any]:
    """Every field of ``config`` by name, nested option dataclasses (the gates) flattened, as config_from_values takes them."""
    from pipeline.core.options import nested

    flat: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        flat.update(_flat(value) if f.name in nested(type(config)) else {f.name: value})
    return flat


def run_fleet(cfg: BuildConfig) -> int:
    """Build every fleet model (or the one at ``--fleet-index``), print the summary; CheckFailed naming the failed ones."""
    from pipeline.build.orchestrator import build
    from pipeline.core.console import console

    models = fleet_models(cfg)
    if cfg.k8s_job is not None:
        return write_fleet_job(cfg, len(models))
    if cfg.fleet_index is not None:
        require(cfg.fleet_index < len(models), f"--fleet-index {cfg.fleet_index} is past the {len(models)} models of {cfg.fleet}",
                f"use 0 to {len(models) - 1}")
        models = [models[cfg.fleet_index]]
    rows: list[tuple[str, str, float, str]] = []
    for model in models:
        label = model.name or model.model
        started = time.perf_counter()
        try:
            result = build(model)
            rows.append((result.name, "published", time.perf_counter() - started, str(result.repository)))
        except PipelineError as exc:  # a gate, a conversion, bad data: the others still build
            log.warning("fleet: %s failed: %s", label, exc)
            rows.append((label, "failed", time.perf_counter() - started, str(exc)))
    console().print(_summary(rows))
    from pipeline.reports.dirs import page_dir
    from pipeline.reports.html import refresh_html_report

    page = refresh_html_report(cfg.workdir, page_dir(cfg.report_dir, cfg.workdir))  # one page: every model's build
    if page:
        console().print(f"report: {page}")
    failed = [name for name, status, _, _ in rows if status == "failed"]
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(rows)} fleet models failed: {', '.join(failed)}",
                          "see each one's line in the table above; the others were published")
    return 0


def _summary(rows: list[tuple[str, str, float, str]]) -> Any:
    from rich.table import Table

    table = Table(title="fleet")
    for column in ("model", "status", "seconds", "repository or reason"):
        table.add_column(column, overflow="fold")
    for name, status, seconds, note in rows:
        table.add_row(name, status, f"{seconds:.1f}", note)
    return table


def write_fleet_job(cfg: BuildConfig, count: int) -> int:
    """The Indexed Job (and the ConfigMap holding the fleet file) to ``cfg.k8s_job``."""
    import yaml

    from pipeline.core.atomic import write_text_atomic

    assert cfg.fleet is not None and cfg.k8s_job is not None
    require(isinstance(cfg.repository, S3Url), f"--k8s-job needs a repository every pod can publish into, not the folder {cfg.repository}",
            "pass --repository s3://BUCKET/PREFIX")
    require(cfg.gpu_product is not None or not cfg.engine, "--k8s-job builds TensorRT engines, which must be built on the GPU they serve on",
            "pass --gpu-product (the node label nvidia.com/gpu.product, e.g. NVIDIA-H200), or --no-engine")
    write_text_atomic(cfg.k8s_job, yaml.safe_dump_all(fleet_job(cfg, count), sort_keys=False))
    log.info("wrote the Indexed Job of %d models to %s: kubectl apply -f %s", count, cfg.k8s_job, cfg.k8s_job)
    return 0


def fleet_job(cfg: BuildConfig, count: int) -> list[dict[str, Any]]:
    """The ConfigMap with the fleet file and the Indexed Job building one model per index."""
    from pipeline.mig.k8s import K8S_S3_SECRET
    from pipeline.triton.bundle_files import AWS_SECRETS

    assert cfg.fleet is not None
    name = "pipeline-fleet"
    command = ["python", "-m", "pipeline", "build", "--fleet", f"{FLEET_DIR}/fleet.toml", "--fleet-index", "$(FLEET_INDEX)",
               "--repository", str(cfg.repository), *([] if cfg.engine else ["--no-engine"])]
    env = [{"name": "FLEET_INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
    env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": K8S_S3_SECRET, "key": key}}} for key in AWS_SECRETS]
    gpu = {"nodeSelector": {"nvidia.com/gpu.product": cfg.gpu_product}} if cfg.engine and cfg.gpu_product else {}
    container: dict[str, Any] = {"name": "build", "image": cfg.job_image, "command": command, "env": env,
                                 "volumeMounts": [{"name": "fleet", "mountPath": FLEET_DIR, "readOnly": True}]}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed", "completions": count, "parallelism": count,
            "backoffLimitPerIndex": 1,  # a failed model is retried once and never fails the other indexes
            "template": {"spec": {"restartPolicy": "Never", **gpu, "containers": [container],
                                  "volumes": [{"name": "fleet", "configMap": {"name": f"{name}-file"}}]}},
        },
    }
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-file"},
                  "data": {"fleet.toml": Path(cfg.fleet).read_text()}}
    return [config_map, job]
