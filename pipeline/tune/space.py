"""The search space of `tune`: the serving knobs of one model and the configs they make.

Knobs: ``instance_group`` count, ``max_batch_size`` (never above what the model file or the
TensorRT engine's optimization profile admits), dynamic batching's preferred batch sizes and
``max_queue_delay_microseconds``. Preferred sizes are given as rules relative to the candidate's
max batch (``none``: the batcher forms the largest batch it can; ``max``; ``half+max``, what the
build publishes) or as explicit sizes (``8+16``), so one rule serves every max batch.

Every knob's values always include the published config's own value, so the quick search can
start from it and the published config is one point of the space.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import PipelineError, require
from pipeline.triton.accelerators import refit_trt_profile

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

PREFERRED_RULES = ("none", "max", "half+max")
DEFAULT_INSTANCES = (1, 2, 4)
DEFAULT_QUEUE_DELAYS_US = (0, 100, 1000)
DEFAULT_PREFERRED = ("none", "half+max")
SMALLEST_DEFAULT_MAX_BATCH = 8
KNOBS = ("instance_count", "max_batch_size", "preferred_batch_sizes", "max_queue_delay_us")


@dataclass(frozen=True)
class Candidate:
    """One serving configuration: the four knobs, resolved to concrete values."""

    instance_count: int
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``config`` of a tune.json entry)."""
        return {
            "instance_count": self.instance_count,
            "max_batch_size": self.max_batch_size,
            "preferred_batch_sizes": list(self.preferred_batch_sizes),
            "max_queue_delay_us": self.max_queue_delay_us,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        """The candidate of a tune.json ``config``."""
        return cls(int(data["instance_count"]), int(data["max_batch_size"]),
                   tuple(int(b) for b in data["preferred_batch_sizes"]), int(data["max_queue_delay_us"]))

    @property
    def label(self) -> str:
        """A short human-readable form for tables and logs."""
        if self.max_batch_size == 0:
            return f"{self.instance_count} inst, no batching"
        preferred = ",".join(map(str, self.preferred_batch_sizes)) or "-"
        return f"{self.instance_count} inst, max {self.max_batch_size}, pref {preferred}, delay {self.max_queue_delay_us} µs"


def preferred_sizes(rule: str, max_batch: int) -> tuple[int, ...]:
    """The preferred batch sizes a rule gives for ``max_batch`` (explicit sizes above it are dropped)."""
    if max_batch <= 0 or rule == "none":
        return ()
    if rule == "max":
        return (max_batch,)
    if rule == "half+max":
        return tuple(sorted({max(1, max_batch // 2), max_batch}))
    try:
        sizes = [int(b) for b in rule.split("+")]
    except ValueError:
        sizes = [0]
    require(all(b >= 1 for b in sizes), f"preferred batch rule '{rule}' is neither {', '.join(PREFERRED_RULES)} nor sizes like 8+16",
            "e.g. --preferred none,half+max,8+16")
    return tuple(sorted({b for b in sizes if b <= max_batch}))


def rule_of(sizes: Sequence[int], max_batch: int) -> str:
    """The rule that gives ``sizes`` for ``max_batch`` (explicit sizes when no named rule does)."""
    for rule in PREFERRED_RULES:
        if preferred_sizes(rule, max_batch) == tuple(sorted(sizes)):
            return rule
    return "+".join(str(b) for b in sorted(sizes)) or "none"


@dataclass(frozen=True)
class SearchSpace:
    """The values of each knob, in search order (ascending; preferred rules as given)."""

    instances: tuple[int, ...]
    max_batch: tuple[int, ...]  # (0,) for a model without batching
    preferred: tuple[str, ...]
    queue_delay_us: tuple[int, ...]
    batch_limit: int | None  # what the model file / engine profile admits (None: any)

    @property
    def axes(self) -> tuple[tuple[Any, ...], ...]:
        """The knob values, in the order of :data:`KNOBS`."""
        return (self.instances, self.max_batch, self.preferred, self.queue_delay_us)

    @property
    def size(self) -> int:
        """Distinct candidates (rules that resolve alike for a max batch count once)."""
        return len({self.candidate(i) for i in self.all_indices()})

    def all_indices(self) -> list[tuple[int, ...]]:
        """Every point of the space as a tuple of indices into :attr:`axes`."""
        import itertools

        return list(itertools.product(*(range(len(a)) for a in self.axes)))

    def candidate(self, index: Sequence[int]) -> Candidate:
        """The candidate at ``index`` (preferred rules resolved for its max batch)."""
        i, b, p, q = index
        max_batch = self.max_batch[b]
        batching = max_batch > 0
        return Candidate(
            instance_count=self.instances[i],
            max_batch_size=max_batch,
            preferred_batch_sizes=preferred_sizes(self.preferred[p], max_batch),
            max_queue_delay_us=self.queue_delay_us[q] if batching else 0,
        )

    def index_of(self, candidate: Candidate) -> tuple[int, ...]:
        """Where ``candidate`` sits in the space (it must be one of its points)."""
        rule = rule_of(candidate.preferred_batch_sizes, candidate.max_batch_size)
        delay = candidate.max_queue_delay_us if candidate.max_batch_size > 0 else self.queue_delay_us[0]
        return (self.instances.index(candidate.instance_count), self.max_batch.index(candidate.max_batch_size),
                self.preferred.index(rule) if rule in self.preferred else 0, self.queue_delay_us.index(delay))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``config`` of a tune.json entry)."""
        return {"instance_count": list(self.instances), "max_batch_size": list(self.max_batch),
                "preferred_batch_sizes": list(self.preferred), "max_queue_delay_us": list(self.queue_delay_us),
                "batch_limit": self.batch_limit}


def _ints(text: str, option: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        raise PipelineError(f"{option} '{text}' is not a comma-separated list of integers ≥ {minimum}",
                            f"e.g. {option} {'1,2,4' if minimum else '0,100,1000'}")
    return values


def search_space(
    base: Candidate,
    batch_limit: int | None,
    *,
    instances: str | None = None,
    max_batch: str | None = None,
    preferred: str | None = None,
    queue_delay_us: str | None = None,
    model: str = "the model",
) -> SearchSpace:
    """The space around the published candidate ``base``; each option is a comma-separated override.

    Raises PipelineError for values the model cannot take (a max batch above ``batch_limit``,
    batching for a model published without it) and for an empty space."""
    inst = sorted(set(_ints(instances, "--instances", 1) if instances else DEFAULT_INSTANCES) | {base.instance_count})
    if base.max_batch_size == 0:
        require(max_batch is None or set(_ints(max_batch, "--max-batch", 0)) <= {0},
                f"{model} is published with max_batch_size 0 (no batch axis for Triton), so it cannot batch",
                "drop --max-batch, or rebuild the model with a dynamic batch axis")
        return SearchSpace(tuple(inst), (0,), ("none",), (0,), batch_limit)
    if max_batch:
        batches = sorted(set(_ints(max_batch, "--max-batch", 1)))
        over = [b for b in batches if batch_limit is not None and b > batch_limit]
        require(not over, f"--max-batch {','.join(map(str, over))} is above what {model} admits (batch ≤ {batch_limit}, "
                          "from its model file or TensorRT engine profile)",
                f"use --max-batch values up to {batch_limit}, or rebuild the engine with a larger profile")
    else:
        top = base.max_batch_size if batch_limit is None else min(base.max_batch_size, batch_limit)
        batches, b = [], SMALLEST_DEFAULT_MAX_BATCH
        while b < top:
            batches.append(b)
            b *= 2
    batches = sorted(set(batches) | {base.max_batch_size})
    rules = [r.strip() for r in (preferred.split(",") if preferred else DEFAULT_PREFERRED) if r.strip()]
    require(bool(rules), f"--preferred '{preferred}' names no rule", f"use {', '.join(PREFERRED_RULES)} or sizes like 8+16")
    for rule in rules:
        preferred_sizes(rule, 1)  # checks explicit sizes
    base_rule = rule_of(base.preferred_batch_sizes, base.max_batch_size)
    rules = list(dict.fromkeys([*rules, base_rule]))
    delays = sorted(set(_ints(queue_delay_us, "--queue-delay-us", 0) if queue_delay_us else DEFAULT_QUEUE_DELAYS_US) | {base.max_queue_delay_us})
    space = SearchSpace(tuple(inst), tuple(batches), tuple(rules), tuple(delays), batch_limit)
    require(space.size > 0, "the search space is empty", "give at least one value per knob")
    return space


# -- configs ---------------------------------------------------------------------------------------

def candidate_from_config(cfg: ModelConfig) -> Candidate:
    """The knobs of a published config (instances summed over its instance groups)."""
    count = sum(max(1, g.count) for g in cfg.instance_group) or 1
    batching = cfg.max_batch_size > 0 and cfg.HasField("dynamic_batching")
    return Candidate(
        instance_count=count,
        max_batch_size=cfg.max_batch_size,
        preferred_batch_sizes=tuple(sorted(cfg.dynamic_batching.preferred_batch_size)) if batching else (),
        max_queue_delay_us=int(cfg.dynamic_batching.max_queue_delay_microseconds) if batching else 0,
    )


def config_for_candidate(base: ModelConfig, candidate: Candidate) -> ModelConfig:
    """``base`` with the knobs of ``candidate``: one instance group of its kind, dynamic batching,
    and warmup entries remade for the new batch sizes (same sample files)."""
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    cfg = ModelConfig()
    cfg.CopyFrom(base)
    require(candidate.max_batch_size == 0 or base.max_batch_size > 0,
            f"model '{base.name}' is published without batching", "keep max_batch_size 0 for it")
    cfg.max_batch_size = candidate.max_batch_size
    kind = base.instance_group[0].kind if base.instance_group else None
    profiles = list(base.instance_group[0].profile) if base.instance_group else []  # a plan's profiles stay served
    del cfg.instance_group[:]
    group = cfg.instance_group.add(count=candidate.instance_count, profile=profiles)
    if kind is not None:
        group.kind = kind
    if candidate.max_batch_size > 0:
        cfg.dynamic_batching.Clear()
        cfg.dynamic_batching.SetInParent()
        cfg.dynamic_batching.preferred_batch_size.extend(candidate.preferred_batch_sizes)
        cfg.dynamic_batching.max_queue_delay_microseconds = candidate.max_queue_delay_us
    if base.model_warmup:
        template = base.model_warmup[0]
        del cfg.model_warmup[:]
        for batch in sorted({1, *candidate.preferred_batch_sizes, max(candidate.max_batch_size, 1)}):
            entry = cfg.model_warmup.add()
            entry.CopyFrom(template)
            entry.name, entry.batch_size = f"real_sample_batch_{batch}", batch
    refit_trt_profile(cfg)
    return cfg


def config_json(cfg: ModelConfig) -> str:
    """The config as the JSON a repository-API load override takes (``parameters.config``)."""
    from google.protobuf import json_format

    return json.dumps(json_format.MessageToDict(cfg, preserving_proto_field_name=True), sort_keys=True)


def config_from_json(data: dict[str, Any]) -> ModelConfig:
    """A ModelConfig from Triton's JSON (``GET /v2/models/<m>/config``)."""
    from google.protobuf import json_format
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    try:
        return json_format.ParseDict(data, ModelConfig(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise PipelineError(f"Triton returned a model config this client cannot read: {exc}",
                            "use a Triton whose config format matches tritonclient's") from None


def batch_limit(model_dir: Path, cfg: ModelConfig) -> int | None:
    """The largest batch the served file admits: an ONNX model's fixed batch dim (None when
    dynamic), or the smallest ``max`` batch of a TensorRT plan's profiles (from the engine metadata
    the publish recorded; the published max batch when there is none)."""
    from pipeline.triton.repository import REPORT, model_filename

    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0"))
    require(bool(versions), f"model directory {model_dir} has no version", "rebuild it with `python -m pipeline build`")
    path = model_dir / str(versions[-1]) / model_filename(cfg)
    if cfg.platform == "tensorrt_plan" or cfg.backend == "tensorrt":
        try:
            meta = json.loads((model_dir / REPORT).read_text())["versions"][str(versions[-1])]["engine_metadata"]
            return min(int(profile[name]["max"][0]) for profile in meta["profiles"] for name in profile)
        except (OSError, ValueError, KeyError, TypeError):
            return cfg.max_batch_size
    if path.suffix == ".onnx" and path.is_file():
        from pipeline.data.tensors import signature_from_onnx

        first = signature_from_onnx(path).inputs[0].shape
        return first[0] if first and isinstance(first[0], int) and first[0] > 0 else None
    return None
