"""TensorRT plans built where they will run (``build --plans-at-deploy``).

A plan loads only on the TensorRT that built it, and no NGC tritonserver tag has a TensorRT version
the project could source (:mod:`pipeline.triton.ngc_releases`). So instead of a plan, the build
records, beside each GPU ONNX variant of the repository, what the deploy bundle needs to build the
plan with the serving release's own TensorRT, in the NGC TensorRT container of that release
(``nvcr.io/nvidia/tensorrt:YY.MM-py3``):

* ``plan/build.json``: the plan model's name, the optimization profiles (the build's, the ones its
  gate would run), TF32, the builder optimization level, and the golden check's tolerance;
* ``plan/config.pbtxt``: the plan model's Triton config (every profile named in its instance group,
  checked against the profiles as a built plan's would be);
* ``plan/golden/profile<i>.inputs.json`` / ``.outputs.json``: evaluation samples each profile
  admits (first admitting profile, as the build's gate picks) and the variant's own ONNX outputs on
  them (ONNX Runtime; Q/DQ evaluated exactly, as TensorRT computes INT8), in Polygraphy's JSON
  formats (``polygraphy run --load-inputs`` / ``--load-outputs``).

Triton ignores these files: a model directory's non-numeric folders are not versions. The deploy
bundle's init step (:func:`build_plans_script`) builds each plan with ``polygraphy convert``
(strongly typed, every profile: Polygraphy takes one ``--trt-*-shapes`` set per profile), checks
it with ``polygraphy run --load-inputs --load-outputs`` in every profile that has golden data, and
serves it only if every check passes; a plan that fails is left out and said in one line. The server loads the
plans after it starts (:mod:`pipeline.triton.plan_loader`), so one that its TensorRT cannot load takes no model down.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.backend.plan_runner import profile_for
from pipeline.core.errors import require
from pipeline.data.profiles import ShapeProfile, profiles_from_json, profiles_to_json
from pipeline.triton.plan_loader import LOADER, WHEEL_DIR

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from pipeline.accuracy.evaldata import EvalData

PLAN_DIR = "plan"
BUILD_JSON = f"{PLAN_DIR}/build.json"
PLAN_CONFIG = f"{PLAN_DIR}/config.pbtxt"
GOLDEN_BATCH = 8  # samples per golden iteration (fewer when a profile's max batch is smaller)
CONTAINER_PLANS = "/plans"  # the writable repository the init step fills and the server reads
SCRIPT = "build-plans.sh"


@dataclass(frozen=True)
class DeployPlans:
    """How plans are built at deploy (from BuildConfig): the build's profiles and engine settings."""

    profiles: tuple[ShapeProfile, ...]
    tf32: bool
    optimization_level: int
    atol: tuple[tuple[str, float], ...]  # (precision, the golden check's max abs error)
    rtol: float = 0.0


def plan_config(onnx_config: ModelConfig, name: str, profiles: Sequence[ShapeProfile], signature: Any) -> ModelConfig:
    """The Triton config of the plan built at deploy: the ONNX variant's config (I/O, batching, warmup, labels)
    as a ``tensorrt_plan`` on GPU instances naming every profile, checked like a built plan's."""
    from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

    from pipeline.triton.config import check_config_against_engine, triton_dtype

    cfg = ModelConfig()
    cfg.CopyFrom(onnx_config)
    cfg.name = name
    cfg.platform, cfg.backend, cfg.default_model_filename = "tensorrt_plan", "tensorrt", "model.plan"
    cfg.ClearField("optimization")  # ONNX Runtime's accelerators and graph level: not a plan's
    count = sum(g.count for g in onnx_config.instance_group) or 1
    del cfg.instance_group[:]
    used = [p for p in profiles if p.shapes]
    cfg.instance_group.add(kind=ModelInstanceGroup.Kind.KIND_GPU, count=count, profile=[str(i) for i in range(len(used))])
    metadata = {
        "inputs": [{"name": s.name, "dtype": triton_dtype(s.dtype), "shape": [d if isinstance(d, int) else -1 for d in s.shape]}
                   for s in signature.inputs],
        "outputs": [{"name": s.name, "dtype": triton_dtype(s.dtype), "shape": [d if isinstance(d, int) else -1 for d in s.shape]}
                    for s in signature.outputs],
        "profiles": profiles_to_json(tuple(used)),
    }
    check_config_against_engine(cfg, metadata)
    return cfg


def golden_sets(profiles: Sequence[ShapeProfile], data: EvalData) -> dict[int, list[dict[str, np.ndarray]]]:
    """Per profile, the golden feeds: each evaluation bucket's first samples, in the first profile admitting them."""
    sets: dict[int, list[dict[str, np.ndarray]]] = {}
    for bucket in data.buckets:
        count = bucket.num_samples
        for size in sorted({min(GOLDEN_BATCH, count), 1}, reverse=True):
            feed = {name: np.ascontiguousarray(array[:size]) for name, array in bucket.inputs.items()}
            index = profile_for(profiles, {name: tuple(a.shape) for name, a in feed.items()})
            if index is not None:
                sets.setdefault(index, []).append(feed)
                break
    return sets


def deploy_plan_files(onnx_path: Path, precision: str, cfg: ModelConfig, settings: DeployPlans, data: EvalData) -> dict[str, bytes]:
    """``{relative path: bytes}`` for the ONNX variant's model directory: ``plan/build.json``, ``plan/config.pbtxt``
    and the golden inputs/outputs (module docstring)."""
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.json import to_json

    from pipeline.backend.runners import runner_for_onnx
    from pipeline.triton.config import config_text

    used = tuple(p for p in settings.profiles if p.shapes)
    files: dict[str, bytes] = {PLAN_CONFIG: config_text(cfg).encode()}
    sets = golden_sets(used, data)
    runner_name = f"{cfg.name}-onnx-golden"
    with runner_for_onnx(onnx_path, exact_qdq=precision == "int8", name=runner_name) as runner:
        for index, feeds in sorted(sets.items()):
            results = RunResults([(runner_name, [IterationResult(runner.infer(feed), runner_name=runner_name) for feed in feeds])])
            files[f"{PLAN_DIR}/golden/profile{index}.inputs.json"] = to_json(feeds).encode()
            files[f"{PLAN_DIR}/golden/profile{index}.outputs.json"] = to_json(results).encode()
    build = {
        "plan_model": cfg.name,
        "precision": precision,
        "profiles": profiles_to_json(used),
        "tf32": settings.tf32,
        "optimization_level": settings.optimization_level,
        "atol": dict(settings.atol)[precision],
        "rtol": settings.rtol,
        "golden_profiles": sorted(sets),
    }
    files[BUILD_JSON] = (json.dumps(build, indent=2) + "\n").encode()
    return files


@dataclass(frozen=True)
class PlanBuild:
    """One plan the bundle builds: from ``onnx_model`` (its ``version``'s ``onnx_file``) into ``plan_model``."""

    onnx_model: str
    version: int
    onnx_file: str  # relative to the model directory: "1/model.onnx"
    plan_model: str
    precision: str
    profiles: tuple[ShapeProfile, ...]
    tf32: bool
    optimization_level: int
    atol: float
    rtol: float
    golden_profiles: tuple[int, ...]


def plan_builds(repository: Path, models: Mapping[str, Any]) -> list[PlanBuild]:
    """The plans recorded in ``repository`` (``read_repository``'s ``models``) for the bundle to build."""
    from pipeline.triton.repository import model_filename

    builds = []
    for name, info in sorted(models.items()):
        spec = Path(info.path) / BUILD_JSON
        if not spec.is_file() or not info.versions:
            continue
        data = json.loads(spec.read_text())
        version = info.versions[-1]
        file = model_filename(info.config)
        onnx_file = f"{version}/{file}/model.onnx" if (Path(info.path) / str(version) / file).is_dir() else f"{version}/{file}"
        builds.append(PlanBuild(name, version, onnx_file, str(data["plan_model"]), str(data["precision"]),
                                tuple(profiles_from_json(data["profiles"])), bool(data["tf32"]), int(data["optimization_level"]),
                                float(data["atol"]), float(data["rtol"]), tuple(int(i) for i in data["golden_profiles"])))
    require(len({b.plan_model for b in builds}) == len(builds), f"two models of {repository} record the same plan model",
            "rebuild the repository with one build per model name")
    return builds


def _shapes_flag(flag: str, profile: ShapeProfile, level: int) -> str:
    return f"--trt-{flag}-shapes " + " ".join(f"{name}:[{','.join(map(str, levels[level]))}]" for name, levels in profile.shapes.items())


def build_command(build: PlanBuild, models_dir: str, out_dir: str) -> list[str]:
    """``polygraphy convert``: the strongly typed plan with every profile, into ``out_dir/1/model.plan``."""
    argv = ["polygraphy", "convert", f"{models_dir}/{build.onnx_model}/{build.onnx_file}", "--convert-to", "trt",
            "-o", f"{out_dir}/1/model.plan", "--strongly-typed", "--builder-optimization-level", str(build.optimization_level)]
    for profile in build.profiles:
        argv += [*shlex.split(_shapes_flag("min", profile, 0)), *shlex.split(_shapes_flag("opt", profile, 1)),
                 *shlex.split(_shapes_flag("max", profile, 2))]
    return argv + (["--tf32"] if build.tf32 else [])


def check_commands(build: PlanBuild, models_dir: str, out_dir: str) -> list[list[str]]:
    """``polygraphy run`` per profile with golden data: the plan's outputs against the recorded ones."""
    golden = f"{models_dir}/{build.onnx_model}/{PLAN_DIR}/golden"
    stat = ["--check-error-stat", "mean"] if build.precision == "int8" else []  # INT8: a rounding flip is not a wrong plan
    return [["polygraphy", "run", f"{out_dir}/1/model.plan", "--model-type", "engine", "--trt", "--optimization-profile", str(i),
             "--load-inputs", f"{golden}/profile{i}.inputs.json", "--load-outputs", f"{golden}/profile{i}.outputs.json",
             "--atol", str(build.atol), "--rtol", str(build.rtol), *stat] for i in build.golden_profiles]


def build_plans_script(builds: Sequence[PlanBuild], models_dir: str = "/models", plans_dir: str = CONTAINER_PLANS) -> str:
    """The init step run in the NGC TensorRT container: build, check, and publish into ``plans_dir`` each plan that
    passes (a model directory moved into place whole); exit 0 even when a plan fails, so the server still starts
    and serves every model that works (the failed plan named in one line)."""
    q = shlex.quote
    lines = [
        "#!/usr/bin/env bash",
        "# Build each TensorRT plan with this container's TensorRT (the serving release's), check it against the",
        "# golden outputs recorded at build time, and serve it only if every check passes. Written by the pipeline.",
        "set -uo pipefail",
        # the container's own Polygraphy, else the wheel shipped in the bundle (mounted at /wheels): never a network
        'command -v polygraphy >/dev/null || python3 -m pip install --no-index --no-deps --no-cache-dir /wheels/polygraphy-*.whl >/dev/null '
        '|| { echo "polygraphy is not available (not in this container, and the bundle\'s wheels/ did not install): no plan is built"; exit 0; }',
        f"mkdir -p {q(plans_dir)} && find {q(plans_dir)} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +",
        "failed=0",
        "plan() {  # name, source model dir, then the build and check commands joined by ' && '",
        '  local name="$1" src="$2"; shift 2',
        f'  local tmp={q(plans_dir)}/".$name.partial"',
        '  rm -rf "$tmp" && mkdir -p "$tmp/1" && cp "$src/plan/config.pbtxt" "$tmp/config.pbtxt" || return 1',
        '  for extra in warmup labels.txt; do [ -e "$src/$extra" ] && cp -r "$src/$extra" "$tmp/"; done',
        '  if bash -c "$1"; then mv "$tmp" ' + q(plans_dir) + '/"$name" && echo "plan $name: built and checked, served"; '
        'else rm -rf "$tmp"; echo "plan $name: not served (its build or its golden check failed, above)"; failed=1; fi',
        "}",
    ]
    for build in builds:
        out = f"{plans_dir}/.{build.plan_model}.partial"
        steps = [build_command(build, models_dir, out), *check_commands(build, models_dir, out)]
        joined = " && ".join(shlex.join(step) for step in steps)
        lines.append(f"plan {q(build.plan_model)} {q(f'{models_dir}/{build.onnx_model}')} {q(joined)}")
    lines += ['[ "$failed" = 0 ] || echo "some plans are not served; the server starts with the others"', "exit 0", ""]
    return "\n".join(lines)


def plans_service(tag: str, rel_repo: str | None, devices: Mapping[str, Any]) -> dict[str, Any]:
    """The compose one-shot service that runs :data:`SCRIPT` in the release's NGC TensorRT container; the server
    ``depends_on`` it completing. It writes the plans to ``./plans`` beside the bundle (the server mounts it read-only)."""
    from pipeline.triton.bundle_files import COMPOSE_REPOSITORY, CONTAINER_REPOSITORY
    from pipeline.triton.ngc_releases import tensorrt_container

    return {
        "image": tensorrt_container(tag),
        "command": ["bash", f"/{SCRIPT}"],
        "volumes": [
            {"type": "bind", "source": rel_repo or COMPOSE_REPOSITORY, "target": CONTAINER_REPOSITORY, "read_only": True},
            {"type": "bind", "source": "./plans", "target": CONTAINER_PLANS},
            {"type": "bind", "source": f"./{SCRIPT}", "target": f"/{SCRIPT}", "read_only": True},
            {"type": "bind", "source": f"./{WHEEL_DIR}", "target": f"/{WHEEL_DIR}", "read_only": True},
        ],
        "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", **devices, "capabilities": ["gpu"]}]}}},
        "restart": "no",
    }


def with_plans(server: dict[str, Any]) -> dict[str, Any]:
    """The server service reading the plans: after the init step completed, with ``./plans`` and the plan loader
    (:mod:`pipeline.triton.plan_loader`) mounted read-only."""
    return {**server, "depends_on": {"plans": {"condition": "service_completed_successfully"}},
            "volumes": [*server["volumes"], {"type": "bind", "source": "./plans", "target": CONTAINER_PLANS, "read_only": True},
                        {"type": "bind", "source": f"./{LOADER}", "target": f"/{LOADER}", "read_only": True}]}


def docker_run_plans_lines(tag: str) -> list[str]:
    """docker-run.sh lines running the init step before the server (``$PLANS_DIR``, default ``plans/`` beside the script)."""
    from pipeline.triton.bundle_files import CONTAINER_REPOSITORY
    from pipeline.triton.ngc_releases import tensorrt_container

    return [
        'HERE="${HERE:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"',
        'PLANS_DIR="${PLANS_DIR:-$HERE/plans}" && mkdir -p "$PLANS_DIR"',
        f"# Build the TensorRT plans with the serving release's TensorRT ({tensorrt_container(tag)}); only checked plans are served.",
        'docker run --rm --gpus "${TRITON_GPUS:-all}" -v "${MODEL_REPOSITORY}:' + CONTAINER_REPOSITORY + ':ro" '
        f'-v "$PLANS_DIR:{CONTAINER_PLANS}" -v "$HERE/{SCRIPT}:/{SCRIPT}:ro" -v "$HERE/{WHEEL_DIR}:/{WHEEL_DIR}:ro" '
        f'{tensorrt_container(tag)} bash /{SCRIPT}',
    ]
