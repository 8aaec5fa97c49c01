"""Tiny real models for the repository tests, and a publisher that loops until it is killed.

``python tests/triton/publish_harness.py REPO WORKDIR`` publishes two models (fp32 and fp16 names of
one ONNX file padded to a few MB, so a publish takes long enough to be interrupted), alternating
the ``new`` and ``replace`` version policies, forever. It prints ``ready`` once imports are done and
``published N`` after each publish. The test kills it with SIGKILL at random moments and checks that
the repository it leaves behind is complete.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LABELS = "\n".join(f"digit_{i}" for i in range(10)).encode() + b"\n"


def two_io_onnx(path: Path, *, pad_bytes: int = 0, image_type: int = TensorProto.FLOAT) -> Path:
    """image float [batch,8,8,1] + ids int64 [batch,seq] → probs float [batch,10] + count int64 [batch].

    ``pad_bytes`` adds an unused initializer so the file is big enough to take a while to copy.
    """
    nodes = [
        helper.make_node("Cast", ["image"], ["image_f"], to=TensorProto.FLOAT),
        helper.make_node("Flatten", ["image_f"], ["flat"], axis=1),
        helper.make_node("Slice", ["flat", "start", "end", "axis"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
        helper.make_node("ReduceSum", ["ids", "axis"], ["count"], keepdims=0),
    ]
    initializers = [
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array([10], np.int64), "end"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
    ]
    if pad_bytes:
        initializers.append(numpy_helper.from_array(np.arange(pad_bytes // 4, dtype=np.float32), "padding"))
    graph = helper.make_graph(
        nodes,
        "two_io",
        [helper.make_tensor_value_info("image", image_type, ["batch", 8, 8, 1]), helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10]), helper.make_tensor_value_info("count", TensorProto.INT64, ["batch"])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def warmup_data(samples: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"image": rng.random((samples, 8, 8, 1)), "ids": rng.integers(0, 5, (samples, 4), dtype=np.int64)}


def publish_two(onnx_path: Path, repo: Path, policy: str, *, labels: bool = True, report: dict | None = None,
                delay_us: int = 100) -> list[Path]:
    """Publish ``onnx_path`` as ``digits_fp32`` and ``digits_fp16`` with labels and real warmup samples.

    ``delay_us`` (the batching window) changes the config: a model whose files are all unchanged is
    not republished, so callers that need a new version pass another value.
    """
    from pipeline.data.artifacts import Artifact
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.triton.config import model_config_from_artifact, warmup_files
    from pipeline.triton.repository import publish_repository

    signature = signature_from_onnx(onnx_path)
    artifacts = [Artifact("fp32", "onnx", onnx_path), Artifact("fp16", "onnx", onnx_path)]
    configs, extra = {}, {}
    for artifact in artifacts:
        name = artifact.triton_name("digits")
        configs[name] = model_config_from_artifact(
            artifact, name=name, signature=signature, max_batch=8,
            labels_file="labels.txt" if labels else None, classifier_output="probs" if labels else None,
            warmup=warmup_data(), preferred_batch_sizes=[4], max_queue_delay_us=delay_us,
        )
        extra[name] = {**warmup_files(signature, warmup_data(), 8), **({"labels.txt": LABELS} if labels else {})}
    return publish_repository(
        artifacts, model="digits", repository=repo, configs=configs, extra_files=extra,
        version_policy=policy, report=report, reproduce="python -m pipeline build --name digits",
    )


def main(repo: Path, workdir: Path) -> None:
    onnx_path = two_io_onnx(workdir / "padded.onnx", pad_bytes=4 << 20)
    publish_two(onnx_path, repo, "new")  # warm the imports
    print("ready", flush=True)
    count = 0
    while True:
        publish_two(onnx_path, repo, "replace" if count % 3 == 2 else "new", delay_us=101 + count)  # a change each time
        count += 1
        print(f"published {count}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
