"""The build orchestrator: its body is the data flow from a Keras model to a Triton repository.

Each stage is one :class:`~pipeline.core.stagecache.Stage` value (function, inputs, settings, outputs)
that the stage cache hashes and calls, so a stage runs only when the hash of its inputs and
settings changed, and every run or skip is recorded in the manifest.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.accuracy.evaldata import EvalData
from pipeline.accuracy.outputkinds import (OutputKind, kinds_to_json, log_kinds, onnx_producers, primary_classes_output, read_description, signature_from_description)
from pipeline.backend.tensorrt_env import gpu_here
from pipeline.build.config import BuildConfig
from pipeline.build.publish import PublishSettings, published_configs, published_from_artifacts, require_publishable
from pipeline.build.raw import pixel_scaling, raw_input_stages, raw_inputs_of
from pipeline.build.support import (EVAL_BATCH, ISOLATE_OVER, decided_kinds, early_labels, ensure_default_data, eval_batch, note_needs,
                                    stage_budget_gib, tool_versions)
from pipeline.core.errors import PipelineError, require_creatable
from pipeline.core.fingerprint import hash_path
from pipeline.core.objectstore import S3Url
from pipeline.core.onnx_files import total_size
from pipeline.core.options import CALIBRATION_ROOT
from pipeline.core.stagecache import Manifest, Stage, run_stage
from pipeline.data.artifacts import PRECISIONS, WIRE_PRECISIONS, Artifact
from pipeline.data.profiles import ShapeProfile
from pipeline.data.tensors import ModelSignature, load_onnx, signature_from_onnx
from pipeline.data.workspace import ModelData, Workspace, bundled_model_data
from pipeline.stages.accuracy import accuracy_report_from_variants
from pipeline.stages.calibration import CalibrationData, calibration_from_path
from pipeline.stages.engine import EngineSettings, engine_from_onnx, metadata_path
from pipeline.stages.eval_data import eval_data_for
from pipeline.stages.fp16 import DEFAULT_FP32_OPS, fp16_onnx_from_onnx
from pipeline.stages.int8 import check_qdq_int8_symmetric
from pipeline.stages.int8_cpu import check_qdq_uint8_activations
from pipeline.stages.int8_fallback import describe_fallback, gated_int8_onnx_from_onnx
from pipeline.stages.mixed import mixed_format
from pipeline.stages.onnx_export import onnx_from_savedmodel, tf2onnx_command
from pipeline.stages.parity import parity_report_from_models
from pipeline.stages.savedmodel import savedmodel_from_source
from pipeline.stages.shapes import calibration_hints, profiles_from_args, seen_in_files, seen_shapes
from pipeline.stages.source import DEFAULT_MODEL, ModelSource, model_source
from pipeline.stages.uint8_input import uint8_input_onnx_from_onnx, uint8_parity_from_models
from pipeline.triton.deploy_plans import DeployPlans
from pipeline.triton.ensemble import RawInputs
from pipeline.triton.served_gate import SERVED_ATOL
from pipeline.triton.verify import verify_repository

log = logging.getLogger(__name__)


@dataclass
class BuildResult:
    """What a build produced: the workspace, the artifacts, and the manifest path."""

    name: str
    workspace: Workspace
    artifacts: list[Artifact]
    manifest: Path
    repository: Path | S3Url | None


@dataclass(frozen=True)
class BuildContext:
    """What every stage of one build shares: the settings, the model's name, its workspace and data, the manifest."""

    cfg: BuildConfig
    name: str
    ws: Workspace
    data_dir: ModelData
    manifest: Manifest

    def run(self, stage: Stage, reproduce: str | None = None) -> bool:
        """Run ``stage`` through the stage cache; in its own process once the FP32 model is large (each stage's peak is its own)."""
        return run_stage(self.manifest, stage, reproduce or self.cfg.command, isolated=total_size(self.ws.onnx("fp32")) >= ISOLATE_OVER)


def build(cfg: BuildConfig) -> BuildResult:
    """Keras model → SavedModel → ONNX (parity-checked against TF) → … (see README)."""
    cfg.validate()
    check_plans_load_in_image(cfg)  # before any stage: a plan the serving image cannot load is not worth building
    require_creatable(cfg.workdir, "--workdir")
    require_publishable(cfg.repository)
    source = model_source(cfg.model, cfg.imports, cfg.allow_lambda)
    name = cfg.model_name(source)
    ws = Workspace(cfg.workdir / name)
    bundled = source.spec == DEFAULT_MODEL
    data_dir = bundled_model_data(cfg.calibration_root, CALIBRATION_ROOT, cfg.workdir, name) if bundled else ModelData.of(cfg.calibration_root, name)
    ctx = BuildContext(cfg, name, ws, data_dir, Manifest(ws.manifest, cfg.command, tool_versions()))
    ws.root.mkdir(parents=True, exist_ok=True)

    if bundled:
        ensure_default_data(ctx.data_dir)
    artifacts: list[Artifact] = []
    try:
        saved = _savedmodel_stage(source, ctx)
        described = read_description(saved)
        _check_labels_before_conversion(described, ctx)  # a bad label file costs seconds, not a conversion
        onnx_fp32 = _onnx_stage(saved, ctx)
        note_needs(onnx_fp32, cfg)  # before the stages that run it: a memory budget its weights cannot keep, a disk too small
        signature = signature_from_onnx(onnx_fp32)
        raw_in = raw_inputs_of(cfg, saved, signature, source, bundled, ctx)  # images or sentences, and Keras's preprocessing of them
        pixels = pixel_scaling(saved, cfg)  # how image files become inputs: --preprocess, or raw when the model scales itself
        calib = _calibration_data(signature, ctx, pixels) if cfg.calibrates else None
        if raw_in.tensor_data is not None:  # the tensor path is judged on Keras's preprocessing of the same raw inputs
            data = raw_in.tensor_data
        else:
            data, calib = eval_data_for(cfg.eval_data, cfg.calibration or ctx.data_dir.folder, ctx.data_dir.eval, signature, calib,
                                        preprocess=pixels)
        kinds, data = _output_kinds(signature, onnx_fp32, described, data, ctx)
        # Dynamic non-batch axes are sized from the real data (calibration and evaluation samples).
        seen = (seen_in_files(cfg.calibration or ctx.data_dir.folder, signature) if calib else []) + ([] if data.synthetic else seen_shapes(data.sample_shapes()))
        profiles = profiles_from_args(cfg.shapes, signature, max_batch=cfg.max_batch, seen=seen)
        _parity_stage(saved, onnx_fp32, data, kinds, ctx)
        variants = [Artifact("fp32", "onnx", onnx_fp32)]
        if cfg.fp16:
            variants.append(_fp16_stage(onnx_fp32, ctx))
        # INT8 graphs that pass their gate by construction: the costliest nodes kept float where needed (int8_fallback)
        if cfg.int8:
            variants.append(_int8_stage("int8", onnx_fp32, calib, data, kinds, ctx))
        if cfg.with_int8_cpu:
            variants += _unless_left_out("int8cpu", lambda: _int8_stage("int8cpu", onnx_fp32, calib, data, kinds, ctx), ctx)
        if cfg.uint8_input is not None:
            variants.append(_uint8_stage(onnx_fp32, data, ctx))
        gpu_variants = [v for v in variants if v.precision in PRECISIONS]
        _trt_check_stage(gpu_variants, profiles, ctx)  # before a GPU machine finds out
        engines = _engine_stages(gpu_variants, profiles, ctx)
        deploy_plans = _deploy_plans(profiles, cfg) if cfg.plans_at_deploy else None
        # the uint8-input variant computes as FP32 does: its gate is the parity one (_uint8_stage)
        _accuracy_stage(onnx_fp32, [v for v in variants[1:] if v.precision not in WIRE_PRECISIONS] + engines, data, kinds, ctx)
        variants = _without_left_out(variants, ctx)  # a variant nobody asked for that did not pass: one line, not a failed build
        artifacts = variants + engines
        ctx.manifest.artifacts = {f"{a.precision}.{a.kind}": str(a.path) for a in artifacts}
        _latency_stage(artifacts, data, ctx)
        raw = raw_input_stages(raw_in, variants, onnx_fp32, data, kinds, ctx, _publish_settings(ctx, kinds), saved) if cfg.raw_inputs else None
        repository = _publish_stage(artifacts, variants, data, kinds, ctx, deploy_plans, raw)
        if cfg.verify_served or cfg.verify_url:
            _served_stage(artifacts, data, ctx)
    finally:
        ctx.manifest.write()  # also for a failed build: which stage failed, and why
    return BuildResult(name, ctx.ws, artifacts, ctx.ws.manifest, repository)


def check_plans_load_in_image(cfg: BuildConfig) -> None:
    """With ``--triton-image``, refuse (PipelineError, one line) when the plans this build would make cannot load
    in that image (:func:`pipeline.triton.ngc_releases.check_plan_tensorrt`). Only when plans will be built: where
    TensorRT cannot build here (not installed, no GPU) or with ``--no-engine`` the build publishes ONNX variants only,
    whose engines ONNX Runtime builds inside the serving image, so there is nothing to refuse."""
    if not cfg.engine or cfg.plans_at_deploy or cfg.triton_image is None:
        return
    platform = cfg.tensorrt.platform()
    if platform is not None:
        from pipeline.triton.ngc_releases import check_plan_tensorrt, ngc_image

        check_plan_tensorrt(ngc_image(cfg.triton_image), platform.tensorrt_version)


def workspace_of(cfg: BuildConfig) -> Workspace | None:
    """The workspace a build with ``cfg`` writes to; None when the model option itself is bad."""
    try:
        return Workspace(cfg.workdir / cfg.model_name(model_source(cfg.model)))
    except PipelineError:
        return None


def _savedmodel_stage(source: ModelSource, ctx: BuildContext) -> Path:
    if source.kind == "savedmodel":
        ctx.manifest.not_run("savedmodel", f"input is already a SavedModel: {source.path}")
        return Path(source.path)  # type: ignore[arg-type]
    ctx.run(Stage("savedmodel", savedmodel_from_source, inputs={"source": source}, environment={"model": source.spec},
                  outputs={"dst": ctx.ws.savedmodel}))
    return ctx.ws.savedmodel


def _onnx_stage(saved: Path, ctx: BuildContext) -> Path:
    dst = ctx.ws.onnx("fp32")
    ctx.run(Stage("onnx", onnx_from_savedmodel, inputs={"saved": saved}, settings={"opset": ctx.cfg.opset, "external_data": ctx.cfg.external_data},
                  outputs={"dst": dst}), reproduce=" ".join(tf2onnx_command(saved, dst, ctx.cfg.opset, ctx.cfg.external_data)))
    return dst


def _parity_stage(saved: Path, onnx_path: Path, data: EvalData, kinds: dict[str, OutputKind], ctx: BuildContext) -> None:
    gates = ctx.cfg.gates
    batch = eval_batch(onnx_path, data, ctx.cfg.max_memory_gib, runners=2)  # TensorFlow and ONNX Runtime
    # A mixed-precision model computes in float16 in TensorFlow: held to float16's spacing at each sample's scale, never tighter
    # than the FP16 gate's atol (a float32 softmax after float16 logits moves by a share of their rounding)
    reference = mixed_format(load_onnx(onnx_path, external_data=False))
    atol = max(gates.parity_atol, gates.fp16_atol or 0.0) if reference != "float32" else gates.parity_atol
    ctx.run(Stage("parity", parity_report_from_models, inputs={"saved": saved, "onnx_path": onnx_path, "data": data},
                  settings={"atol": atol, "rtol": gates.parity_rtol, "batch_size": batch, "reference_format": reference,
                            "ulps": gates.parity_ulps if reference != "float32" else 0.0, "kinds": kinds_to_json(kinds)},
                  outputs={"dst": ctx.ws.parity}))


def _fp16_stage(onnx_fp32: Path, ctx: BuildContext) -> Artifact:
    dst = ctx.ws.onnx("fp16")
    cfg = ctx.cfg
    ctx.run(Stage("fp16", fp16_onnx_from_onnx, inputs={"src": onnx_fp32},
                  settings={"keep_op_types": cfg.fp16_keep_op_types, "keep_nodes": cfg.fp16_keep_nodes}, outputs={"dst": dst},
                  environment={"always_fp32": DEFAULT_FP32_OPS}))
    return Artifact("fp16", "onnx", dst)


def _uint8_stage(onnx_fp32: Path, data: EvalData, ctx: BuildContext) -> Artifact:
    dst = ctx.ws.onnx("u8")
    gates = ctx.cfg.gates
    ctx.run(Stage("uint8", uint8_input_onnx_from_onnx, inputs={"src": onnx_fp32}, settings={"scale": ctx.cfg.uint8_input}, outputs={"dst": dst}))
    ctx.run(Stage("uint8_parity", uint8_parity_from_models, inputs={"fp32": onnx_fp32, "u8": dst, "data": data},
                  settings={"atol": gates.parity_atol, "rtol": gates.parity_rtol, "batch_size": EVAL_BATCH}, outputs={"dst": ctx.ws.uint8_parity}))
    return Artifact("u8", "onnx", dst)


def _calibration_data(signature: ModelSignature, ctx: BuildContext, pixels: str) -> CalibrationData:
    cfg, path = ctx.cfg, ctx.cfg.calibration or ctx.data_dir.folder
    # Arrays keep their own sizes; only images of a dynamic H×W need a size to be resized to.
    hints = {} if seen_in_files(path, signature) else calibration_hints(cfg.shapes, signature, max_batch=cfg.max_batch)
    return calibration_from_path(path, signature, preprocess=pixels, shape_hint=hints, resize=cfg.resize)


def _int8_stage(recipe: str, onnx_fp32: Path, calib: CalibrationData | None, data: EvalData, kinds: dict[str, OutputKind],
                ctx: BuildContext) -> Artifact:
    cfg, dst, record = ctx.cfg, ctx.ws.onnx(recipe), ctx.ws.fallback_record(recipe)
    assert calib is not None  # cfg.calibrates
    ctx.run(Stage(recipe, gated_int8_onnx_from_onnx, inputs={"src": onnx_fp32, "calibration": calib, "data": data},
                  settings={"recipe": recipe, "method": cfg.calibration_method, "max_memory_gib": stage_budget_gib(onnx_fp32, cfg.max_memory_gib),
                            "keep_nodes": cfg.int8_keep_nodes, "table_min_mib": cfg.int8_table_min_mib, "fallback": cfg.fallback, "gates": cfg.gates, "kinds": kinds_to_json(kinds),
                            "batch_size": eval_batch(onnx_fp32, data, cfg.max_memory_gib, runners=2)},
                  outputs={"dst": dst, "record": record}))
    # also on a cache hit: what is published must be what its runtime takes
    (check_qdq_int8_symmetric if recipe == "int8" else check_qdq_uint8_activations)(dst)
    summary = json.loads(record.read_text())
    ctx.manifest.results.setdefault("int8_fallback", {})[recipe] = {**summary, "line": describe_fallback(summary)}
    if summary.get("needed"):
        log.warning("%s", describe_fallback(summary))  # every build, a cache hit too: what runs in float matters for speed
    return Artifact(recipe, "onnx", dst)


def _unless_left_out(precision: str, make: Callable[[], Artifact], ctx: BuildContext) -> list[Artifact]:
    """``[make()]``; for a variant the user did not ask for, a failure to make it (a model with nothing the recipe
    quantizes, say) leaves it out with one line instead of failing the build."""
    if precision not in ctx.cfg.optional_precisions:
        return [make()]
    try:
        return [make()]
    except PipelineError as exc:
        model = f"{ctx.name}_{precision}"
        log.warning("%s left out: it could not be made (%s) and it was not asked for", model, exc.problem)
        ctx.manifest.results.setdefault("left_out", []).append({"variant": precision, "model": model, "reason": f"could not be made: {exc.problem}"})
        return []


def _without_left_out(variants: list[Artifact], ctx: BuildContext) -> list[Artifact]:
    """``variants`` less the ones the user did not ask for whose gate did not pass, each said in one line."""
    judged = {v["precision"]: v for v in (ctx.manifest.results.get("accuracy") or {}).get("variants", []) if v.get("kind") == "onnx"}
    left_out = []
    for variant in variants:
        verdict = judged.get(variant.precision)
        if variant.precision in ctx.cfg.optional_precisions and verdict is not None and not verdict["passed"]:
            reason = f"its gate did not pass ({'; '.join(verdict['failures'])}) and it was not asked for"
            log.warning("%s left out: %s (--int8-cpu asks for it and fails the build instead; --no-int8-cpu leaves it out unbuilt)",
                        variant.triton_name(ctx.name), reason)
            left_out.append({"variant": variant.precision, "model": variant.triton_name(ctx.name), "reason": reason})
    ctx.manifest.results["left_out"] = ctx.manifest.results.get("left_out", []) + left_out
    return [v for v in variants if v.precision not in {x["variant"] for x in left_out}]


def _engine_stages(variants: list[Artifact], profiles: list[ShapeProfile], ctx: BuildContext) -> list[Artifact]:
    if not ctx.cfg.engine:
        ctx.manifest.not_run("engine", "disabled with --no-engine")
        return []
    if ctx.cfg.plans_at_deploy:
        ctx.manifest.not_run("engine", "--plans-at-deploy: the deploy bundle builds the plans with the serving release's TensorRT")
        return []
    cfg = ctx.cfg
    available, reason = cfg.tensorrt.status()
    if not available:
        (log.warning if gpu_here() else log.info)("%s", reason)  # on a CPU-only machine the ONNX variants are all there is
        ctx.manifest.not_run("engine", reason)
        return []
    log.info("%s", reason)
    engines = []
    for variant in variants:
        plan = ctx.ws.plan(variant.precision)
        plan.parent.mkdir(parents=True, exist_ok=True)
        settings = _engine_settings(variant.precision, profiles, cfg)
        ctx.run(Stage(
            f"engine-{variant.precision}", engine_from_onnx,
            inputs={"onnx_path": variant.path},
            settings={"settings": settings},
            outputs={"plan_path": plan},
            context={"timing_cache": ctx.ws.timing_cache, "tensorrt": cfg.tensorrt},
            environment={"device": reason},
            also_writes=[metadata_path(plan)],
        ))
        engines.append(Artifact(variant.precision, "plan", plan, metadata=metadata_path(plan)))
    return engines


def _engine_settings(precision: str, profiles: list[ShapeProfile], cfg: BuildConfig) -> EngineSettings:
    return EngineSettings(precision=precision, profiles=tuple(profiles), optimization_level=cfg.optimization_level, workspace_mib=cfg.workspace,
                          tf32=cfg.tf32, hardware_compatible=cfg.hardware_compatible, allow_host_code=cfg.allow_plan_host_code)


def _trt_check_stage(variants: list[Artifact], profiles: list[ShapeProfile], ctx: BuildContext) -> None:
    """Where TensorRT cannot build here, build each GPU variant with TensorRT-RTX and the engine stage's settings, else
    check the hand-written parser rules (pipeline/stages/trt_check.py); a refusal is fatal only with --require-tensorrt."""
    from pipeline.backend.trt_rtx import RtxTensorRT
    from pipeline.stages.trt_check import CHECK_FILE, parser_problems, refusal, trt_check_from_onnx

    cfg = ctx.cfg
    if cfg.engine and cfg.tensorrt.status()[0]:
        ctx.manifest.not_run("trt-check", "TensorRT builds the plans here (the engine stage)")
        return
    available, reason = RtxTensorRT(cfg.check_compute_capability).status()
    if available:
        ctx.run(Stage("trt-check", trt_check_from_onnx, inputs={"onnx_paths": [v.path for v in variants]},
                      settings={"engines": tuple(_engine_settings(v.precision, profiles, cfg) for v in variants),
                                "compute_capability": cfg.check_compute_capability},
                      outputs={"dst": ctx.ws.root / CHECK_FILE}, environment={"checker": reason}))
        ctx.manifest.results["tensorrt_check"] = json.loads((ctx.ws.root / CHECK_FILE).read_text())
    else:
        ctx.manifest.not_run("trt-check", f"{reason}; hand-written parser rules used instead")
    problems, checker = parser_problems(ctx.manifest.results.get("tensorrt_check"), {v.precision: v.path for v in variants})
    ctx.manifest.results["tensorrt_parser"] = problems
    if cfg.require_tensorrt:
        refusal(problems, checker)


def _output_kinds(signature: ModelSignature, onnx_path: Path, described: list[dict] | None, data: EvalData,
                  ctx: BuildContext) -> tuple[dict[str, OutputKind], EvalData]:
    """Each output's kind (printed and recorded), and the evaluation data with plain ``labels`` given to their output."""
    producers = onnx_producers(load_onnx(onnx_path, external_data=False))
    targets = [dict(b.targets) for b in data.buckets]
    kinds, owner = decided_kinds(signature, described, producers, targets, ctx.cfg, where=data.source)
    if owner:
        data = data.with_targets_named(owner)
    log_kinds(kinds)
    ctx.manifest.results["output_kinds"] = kinds_to_json(kinds)
    return kinds, data


def _check_labels_before_conversion(described: list[dict] | None, ctx: BuildContext) -> None:
    """The evaluation labels against the outputs the Keras model describes (no description, e.g. a
    SavedModel source: they are checked once the ONNX model exists)."""
    path = ctx.cfg.eval_data or ctx.data_dir.eval
    labels = early_labels(path)
    if described and labels:
        decided_kinds(signature_from_description(described), described, {}, labels, ctx.cfg, where=str(path))


def _accuracy_stage(onnx_fp32: Path, candidates: list[Artifact], data: EvalData, kinds: dict[str, OutputKind], ctx: BuildContext) -> None:
    if not candidates:
        ctx.manifest.not_run("accuracy", "no variant besides FP32 ONNX (add --fp16 or --int8)")
        return
    ctx.run(Stage("accuracy", accuracy_report_from_variants,
                  inputs={"fp32_onnx": onnx_fp32, "candidates": candidates, "data": data},
                  settings={"gates": ctx.cfg.gates, "kinds": kinds_to_json(kinds),
                            "batch_size": eval_batch(onnx_fp32, data, ctx.cfg.max_memory_gib, runners=1 + len(candidates)),
                            "tf32": ctx.cfg.tf32, "allow_host_code": ctx.cfg.allow_plan_host_code,
                            "optional": sorted(ctx.cfg.optional_precisions),
                            "fallback": {p: f["line"] for p, f in (ctx.manifest.results.get("int8_fallback") or {}).items() if f.get("needed")}},
                  context={"tensorrt": ctx.cfg.tensorrt},
                  outputs={"dst": ctx.ws.accuracy}))
    ctx.manifest.results["accuracy"] = json.loads(ctx.ws.accuracy.read_text())


def _latency_stage(artifacts: list[Artifact], data: EvalData, ctx: BuildContext) -> None:
    from pipeline.stages.latency import cpu_name, cpu_threads, latency_batches, latency_report_from_variants

    cfg = ctx.cfg
    batches = latency_batches(artifacts[0].path, data, cfg.max_batch, cfg.max_memory_gib)
    ctx.run(Stage("latency", latency_report_from_variants, inputs={"variants": artifacts, "data": data},
                  settings={"batches": batches, "threads": cpu_threads(), "allow_host_code": cfg.allow_plan_host_code},
                  context={"tensorrt": cfg.tensorrt}, environment={"cpu": cpu_name()}, outputs={"dst": ctx.ws.latency}))
    ctx.manifest.results["latency"] = json.loads(ctx.ws.latency.read_text())


def _deploy_plans(profiles: list[ShapeProfile], cfg: BuildConfig) -> DeployPlans:
    """What the deploy bundle builds plans with (--plans-at-deploy): this build's profiles and engine settings, and per
    precision the golden check's max abs error (the gate's engine tolerance; INT8 without one: FP16's)."""
    from pipeline.accuracy.gates import tolerance_for

    atol = {p: tolerance_for(p, cfg.gates, engine=True, tf32=cfg.tf32).atol for p in PRECISIONS}
    fallback = cfg.gates.fp16_atol if cfg.gates.fp16_atol is not None else 1e-2
    return DeployPlans(tuple(profiles), cfg.tf32, cfg.optimization_level,
                       tuple((p, a if a is not None else fallback) for p, a in atol.items()))


def _publish_settings(ctx: BuildContext, kinds: dict[str, OutputKind], deploy_plans: DeployPlans | None = None) -> PublishSettings:
    cfg, labels = ctx.cfg, ctx.data_dir.labels
    return PublishSettings(
        model=ctx.name,
        repository=cfg.repository,
        max_batch=cfg.max_batch,
        version_policy=cfg.version_policy,
        labels=labels if labels.exists() else None,
        classifier_output=primary_classes_output(kinds),
        mig=cfg.mig,
        image=cfg.triton_image,
        deploy_plans=deploy_plans,
    )


def _publish_stage(artifacts: list[Artifact], variants: list[Artifact], data: EvalData, kinds: dict[str, OutputKind], ctx: BuildContext,
                   deploy_plans: DeployPlans | None = None, raw: RawInputs | None = None) -> Path | S3Url:
    cfg = ctx.cfg
    labels = ctx.data_dir.labels
    settings = _publish_settings(ctx, kinds, deploy_plans)
    # Later commands (verify, loadtest) find the evaluation data the build used through this report.
    eval_path = cfg.eval_data or ctx.data_dir.eval
    report = {"manifest": str(ctx.ws.manifest.absolute()), "eval_data": str(eval_path.absolute()) if eval_path.is_file() else None, "accuracy": ctx.manifest.results.get("accuracy"),
              "output_kinds": kinds_to_json(kinds), "gates": asdict(cfg.gates), "versions": ctx.manifest.versions,
              "raw_inputs": {k: v for k, v in (ctx.manifest.results.get("raw_inputs") or {}).items() if k != "rows"} or None}
    ctx.run(Stage("publish", published_from_artifacts,
                  inputs={"artifacts": artifacts, "data": data, **({"raw": raw} if raw else {})},
                  settings={"settings": settings},
                  outputs={"dst": ctx.ws.published},
                  # the command is recorded beside the artifacts, not keyed: a reordered command line republishes nothing
                  context={"onnx_of": {v.precision: v.path for v in variants}, "report": report, "reproduce": cfg.command},
                  environment={"labels": hash_path(labels) if settings.labels else None},
                  also_writes=published_configs(artifacts, settings, raw)))
    return cfg.repository


def _served_stage(artifacts: list[Artifact], data: EvalData, ctx: BuildContext) -> None:
    cfg = ctx.cfg
    started = time.perf_counter()
    report = verify_repository(
        cfg.repository,
        url=cfg.verify_url,
        models=[a.triton_name(ctx.name) for a in artifacts if a.kind == "onnx"],
        calibration_root=cfg.calibration_root,
        eval_data={ctx.name: data},
        batch_size=EVAL_BATCH,
        atol=SERVED_ATOL,
        gates=cfg.gates,
        report_path=ctx.ws.served,
        workdir=cfg.workdir,
        tensorrt=cfg.tensorrt,
    )
    ctx.manifest.results["served"] = report
    ctx.manifest.ran("served", time.perf_counter() - started, f"through {cfg.verify_url or 'the embedded tritonserver'}")


