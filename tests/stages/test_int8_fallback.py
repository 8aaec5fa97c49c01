"""The accuracy-aware fallback's search, on a scripted judge: how many nodes it keeps, what it tries, where it stops.
(The real thing, on a real model with a quantization-hostile layer, is tests/build/test_int8_user_models.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.stages.int8_fallback import FallbackSearch, describe_fallback, max_kept, ranked_nodes
from pipeline.stages.node_costs import NodeCost


@dataclass
class Verdict:
    passed: bool
    failures: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)


def search(passes_from: int | None, candidates: int = 10, bound: int = 8) -> tuple[FallbackSearch, Path | None]:
    """A search over ``candidates`` nodes whose judge passes once at least ``passes_from`` nodes are kept float."""
    ranked = [NodeCost(f"n{i:02d}", "Conv", cost=1.0 / (i + 1), jump=0.1) for i in range(candidates)]

    def quantize(kept: list[NodeCost]) -> Path:
        assert kept == ranked[: len(kept)]  # always a prefix of the ranking
        return Path(f"kept-{len(kept)}.onnx")

    def judge(path: Path) -> Verdict:
        count = int(path.stem.split("-")[1])
        return Verdict(True) if passes_from is not None and count >= passes_from else Verdict(False, [f"drop with {count}"])

    found = FallbackSearch(quantize, judge, ranked, bound)  # type: ignore[arg-type]
    return found, found.run()


@pytest.mark.parametrize("passes_from, tried, chosen", [
    (1, [1], 1),
    (2, [1, 2], 2),
    (3, [1, 2, 4, 3], 3),  # doubling to 4 passes, the bisection finds 3
    (5, [1, 2, 4, 8, 6, 5], 5),
    (8, [1, 2, 4, 8, 6, 7], 8),
])
def test_it_keeps_the_fewest_costliest_nodes_that_pass(passes_from: int, tried: list[int], chosen: int) -> None:
    found, path = search(passes_from)
    assert [t.kept for t in found.tried] == tried
    assert path == Path(f"kept-{chosen}.onnx") and [n.node for n in found.kept] == [f"n{i:02d}" for i in range(chosen)]


def test_it_stops_at_the_bound_and_says_so() -> None:
    found, path = search(None, candidates=10, bound=5)
    assert path is None and [t.kept for t in found.tried] == [1, 2, 4, 5]
    summary = {"variant": "int8", "needed": True, "enabled": True, **found.summary(10, 0.5, {"x": [0, 1, 2]})}
    assert summary["passed"] is False and summary["kept"] == [] and summary["ranked_on"] == "3 calibration samples"
    assert describe_fallback(summary) == "int8: no set of up to 5 of 10 quantized nodes kept in float passes the gate (sets of 1, 2, 4, 5 tried)"
    summary["judged_on"] = "300 samples of eval.npz"
    assert describe_fallback(summary).endswith("(nodes ranked on 3 calibration samples, each set judged on 300 samples of eval.npz)")
    none = {"variant": "int8", "needed": True, "enabled": True, "candidates": 1, "bound": 0, "kept": [], "tried": []}
    assert describe_fallback(none) == ("int8: the gate did not pass, and with 1 quantized node(s) none can be kept in float without "
                                       "leaving no INT8 at all")
    found, path = search(9, candidates=10, bound=8)  # would pass beyond the bound only
    assert path is None and max(t.kept for t in found.tried) == 8


def test_bound_ranking_and_the_record_line() -> None:
    # never every quantized node: a 1-node model keeps none in float, a 2-node model one
    assert [max_kept(n, 0.5) for n in (0, 1, 2, 3, 5, 10, 41)] == [0, 0, 1, 2, 2, 5, 20]
    assert max_kept(40, 0.1) == 4 and max_kept(40, 1.0) == 39
    costs = [NodeCost("b", "Conv", 0.2, 0.0), NodeCost("a", "Conv", 0.2, 0.1), NodeCost("c", "Gemm", 0.5, -0.1),
             NodeCost("d", "Gemm", 0.0, 0.0), NodeCost("e", "Gemm", -0.1, 0.3), NodeCost("kept", "Conv", 9.0, 9.0)]
    assert [c.node for c in ranked_nodes(costs, exclude={"kept"})] == ["c", "a", "b", "e"]  # by cost, then jump, then name
    found, _ = search(2)
    summary = {"variant": "int8cpu", "needed": True, "enabled": True, **found.summary(10, 0.5, {})}
    assert describe_fallback(summary) == "int8cpu: gate passes with 2 of 10 quantized nodes kept in float: n00 (1.000), n01 (0.500)"
    assert describe_fallback({"variant": "int8", "needed": True, "enabled": False}) == \
        "int8: gate did not pass and the fallback is off (--no-int8-fallback)"
    assert describe_fallback({"variant": "int8", "needed": False}) == "int8: gate passed fully quantized"


def test_an_optional_variant_that_fails_its_gate_is_marked_left_out_not_raised(digits_convnet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The accuracy stage on real models: a CPU INT8 held to an atol it cannot meet is marked ``left_out`` when it is
    optional (the build drops it), and fails the stage when it was asked for."""
    import json

    from pipeline.accuracy.evaldata import EvalData
    from pipeline.accuracy.gates import Gates
    from pipeline.accuracy.outputkinds import decide_kinds, kinds_to_json
    from pipeline.core.errors import CheckFailed
    from pipeline.data.artifacts import Artifact
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.stages.accuracy import accuracy_report_from_variants
    from pipeline.stages.calibration import calibration_from_path
    from pipeline.stages.int8_cpu import cpu_int8_onnx_from_onnx

    signature = signature_from_onnx(digits_convnet.model)
    cpu = cpu_int8_onnx_from_onnx(digits_convnet.model, tmp_path / "int8cpu.onnx", calibration_from_path(digits_convnet.calib, signature))
    data = EvalData.single({"image": digits_convnet.eval_images}, digits_convnet.eval_labels, "eval", "fp")
    kinds = kinds_to_json(decide_kinds(signature, described=None, producers={"probs": "Softmax"}, overrides={}, targets={"probs": digits_convnet.eval_labels}))
    strict = Gates(int8_atol=1e-9)
    candidates = [Artifact("int8cpu", "onnx", cpu)]
    results = accuracy_report_from_variants(digits_convnet.model, candidates, data, tmp_path / "a.json", gates=strict, kinds=kinds,
                                            batch_size=64, optional=("int8cpu",))
    assert not results[0].passed
    assert [v["left_out"] for v in json.loads((tmp_path / "a.json").read_text())["variants"]] == [True]
    with pytest.raises(CheckFailed, match="accuracy gate failed: int8cpu-onnx: output 'probs' .*max abs error"):
        accuracy_report_from_variants(digits_convnet.model, candidates, data, tmp_path / "b.json", gates=strict, kinds=kinds, batch_size=64)


def test_an_undecided_gate_after_the_fallback_is_a_gate_failure_that_names_what_would_decide_it(tmp_path: Path) -> None:
    """Exit 1 (CheckFailed), not a usage error: the limit, the bounds, the samples that would decide it, and what the
    fallback tried on which samples."""
    import numpy as np

    from pipeline.accuracy.compare import new_comparison
    from pipeline.accuracy.gates import Gates, tolerance_for
    from pipeline.accuracy.judging import judge_comparison
    from pipeline.accuracy.outputkinds import OutputKind
    from pipeline.core.errors import CheckFailed
    from pipeline.stages.accuracy import raise_for_failures

    kinds = {"segment": OutputKind("segment", "classes", "test", classes=3)}
    rng = np.random.default_rng(0)
    fp32 = rng.random((300, 3)).astype(np.float32)
    int8 = fp32.copy()
    int8[0, (fp32[0].argmax() + 1) % 3] = 2.0  # one answer of 300 changes
    comparison = new_comparison("int8-onnx", kinds, 0.5)
    comparison.add({"segment": fp32}, {"segment": int8}, {})
    result = judge_comparison("int8-onnx", "int8", "onnx", comparison, tolerance_for("int8", Gates()), kinds)
    assert result.undecided and not result.failures
    line = "int8: no set of up to 1 of 2 quantized nodes kept in float passes the gate (sets of 1 tried)"
    with pytest.raises(CheckFailed) as caught:
        raise_for_failures([result], tmp_path / "accuracy.json", fallback_notes={"int8-onnx": line})
    problem = caught.value.problem
    assert problem.startswith("accuracy gate undecided: int8-onnx: not enough evaluation data to judge a 1-point limit: output 'segment' "
                              "(classes): top-1 disagreement 0.33 points ["), problem
    assert "(95% bounds, 300 samples); at this top-1 disagreement, about" in problem and "samples would decide it" in problem, problem
    assert problem.count(line) == 1, problem


def test_the_fallbacks_measurements_are_the_same_with_the_weights_in_a_data_file(digits_convnet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Layer errors and node costs run sessions over changed graphs: with a data file ONNX Runtime reads the weights from it
    (nothing is serialized again, as a model over 2 GB could not be), and the numbers do not change."""
    import onnx

    from pipeline.core.onnx_files import has_external_data, save_onnx
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.stages.calibration import calibration_from_path
    from pipeline.stages.int8 import qdq_onnx_from_onnx
    from pipeline.stages.layer_errors import layer_errors_from_models
    from pipeline.stages.node_costs import node_costs_from_models

    signature = signature_from_onnx(digits_convnet.model)
    inline = qdq_onnx_from_onnx(digits_convnet.model, tmp_path / "inline" / "int8.onnx", calibration_from_path(digits_convnet.calib, signature))
    (tmp_path / "external").mkdir()
    fp32 = save_onnx(onnx.load(str(digits_convnet.model)), tmp_path / "external" / "fp32.onnx", external=True)
    external = save_onnx(onnx.load(str(inline)), tmp_path / "external" / "int8.onnx", external=True)
    assert has_external_data(fp32) and has_external_data(external)
    feed = {"image": digits_convnet.eval_images[:32]}
    assert layer_errors_from_models(fp32, external, feed) == layer_errors_from_models(digits_convnet.model, inline, feed)
    assert node_costs_from_models(fp32, external, feed) == node_costs_from_models(digits_convnet.model, inline, feed)
