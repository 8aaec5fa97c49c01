"""Raw requests in, answers out: the Triton ensemble in front of a published variant (``build --raw-inputs image``).

Three models answer a client that sends an image file:

* ``<model>_preprocess``: the ONNX graph of pipeline/stages/image_preprocess.py (decode, fit, resize,
  scale), served by the onnxruntime backend with onnxruntime-extensions' library shipped in its own
  folder (``model_operations { op_library_filename }``); CPU instances, where decoding runs anyway;
* the variant the build picked (``<model>_fp32``, …), batched by its own dynamic batcher;
* ``<model>``: the ensemble (``platform: "ensemble"``) wiring the two, its classifier output carrying
  ``labels.txt`` so a client asks for the top k through Triton's classification extension
  (``class_count``) and gets ``score:index:label`` strings.

Images differ in size until they are resized, so the ensemble and the preprocessing take one image per
request (``max_batch_size: 0``); the variant's dynamic batcher joins the requests of many clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.data.artifacts import Artifact
from pipeline.data.tensors import ModelSignature
from pipeline.data.workspace import ModelData

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

from pipeline.backend.extensions import LIBRARY_FILE
from pipeline.data.raw_files import BYTES_INPUT, ImagePreprocess

LABELS_FILE = ModelData.LABELS
PREPROCESS_SUFFIX = "_preprocess"
ENSEMBLE_VERSION = 1  # an ensemble's version folder is empty; Triton needs one


def preprocess_name(model: str) -> str:
    """The Triton name of ``model``'s preprocessing model."""
    return f"{model}{PREPROCESS_SUFFIX}"


def preprocess_config(model: str, pre: ImagePreprocess, library: str) -> ModelConfig:
    """The preprocessing model's config: one encoded image in (uint8 [-1]), the model's input tensor out
    ([1, H, W, C] float32), CPU instances, the custom-op library ``library``.

    ``library`` is relative to the repository's root (``<model>_preprocess/libortextensions.so``): Triton's C++
    ONNX Runtime backend hands the name to ``dlopen`` as it is (onnxruntime_backend ``src/onnxruntime.cc``,
    ``RegisterCustomOpsLibrary``), which reads a relative path from the server's working directory, and the deploy
    bundles start the server in the repository's folder; the local Python-based backend reads it the same way."""
    from pipeline.triton.config import _pb

    pb = _pb()
    cfg = pb.ModelConfig(name=preprocess_name(model), platform="onnxruntime_onnx", backend="onnxruntime", max_batch_size=0,
                         default_model_filename="model.onnx")
    cfg.input.add(name=BYTES_INPUT, data_type=pb.TYPE_UINT8, dims=[-1])
    shape = [1, pre.channels, pre.height, pre.width] if pre.channels_first else [1, pre.height, pre.width, pre.channels]
    cfg.output.add(name=pre.input, data_type=pb.TYPE_FP32, dims=shape)
    cfg.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)
    cfg.model_operations.op_library_filename.append(library)
    return cfg


def ensemble_config(model: str, variant: str, variant_signature: ModelSignature, pre: ImagePreprocess,
                    labels_file: str | None, classifier_output: str | None) -> ModelConfig:
    """The ensemble ``model``: an encoded image through ``<model>_preprocess`` into ``variant``; every output of
    the variant with its batch axis of 1, the classifier output with ``labels_file``."""
    from pipeline.triton.config import _pb, triton_dtype

    pb = _pb()
    cfg = pb.ModelConfig(name=model, platform="ensemble", max_batch_size=0)
    cfg.input.add(name=BYTES_INPUT, data_type=pb.TYPE_UINT8, dims=[-1])
    for spec in variant_signature.outputs:
        dims = [1] + [d if isinstance(d, int) and d > 0 else -1 for d in spec.shape[1:]]
        out = cfg.output.add(name=spec.name, data_type=getattr(pb, triton_dtype(spec.dtype)), dims=dims)
        if labels_file and spec.name == classifier_output:
            out.label_filename = labels_file
    step = cfg.ensemble_scheduling.step.add(model_name=preprocess_name(model), model_version=-1)
    step.input_map[BYTES_INPUT] = BYTES_INPUT
    step.output_map[pre.input] = f"{pre.input}__preprocessed"
    step = cfg.ensemble_scheduling.step.add(model_name=variant, model_version=-1)
    step.input_map[pre.input] = f"{pre.input}__preprocessed"
    for spec in variant_signature.outputs:
        step.output_map[spec.name] = spec.name
    return cfg


def ensemble_steps(cfg: Any) -> list[str]:
    """The composing models of an ensemble config, in step order."""
    return [step.model_name for step in cfg.ensemble_scheduling.step]


@dataclass(frozen=True)
class RawInputs:
    """What a build publishes for raw requests: the preprocessing graph, the variant it feeds, the custom-op library."""

    preprocess: Path  # the ONNX graph (pipeline/stages/image_preprocess.py)
    variant: Artifact  # the published variant the ensemble serves
    library: Path  # onnxruntime-extensions' library, shipped inside the preprocessing model's folder

    def fingerprint(self) -> str:
        """The content hash of what the ensemble is made of (what the stage cache keys on)."""
        from pipeline.core.fingerprint import hash_path

        return f"{hash_path(self.preprocess)}:{self.variant.triton_name('m')}:{self.variant.fingerprint()}:{hash_path(self.library)}"


def raw_input_models(raw: RawInputs, model: str, variant_signature: ModelSignature, labels: bytes | None,
                     classifier_output: str | None) -> tuple[list[Artifact], dict[str, Any], dict[str, dict[str, bytes]]]:
    """The preprocessing model and the ensemble as artifacts, their configs and their files, ready for
    :func:`pipeline.triton.repository.publish_repository`."""
    from pipeline.data.raw_files import preprocess_of

    pre = preprocess_of(raw.preprocess)
    preprocess = Artifact("raw", "preprocess", raw.preprocess)
    ensemble = Artifact("raw", "ensemble", raw.preprocess)
    configs = {
        preprocess_name(model): preprocess_config(model, pre, f"{preprocess_name(model)}/{LIBRARY_FILE}"),
        model: ensemble_config(model, raw.variant.triton_name(model), variant_signature, pre,
                               LABELS_FILE if labels is not None else None, classifier_output),
    }
    files = {preprocess_name(model): {LIBRARY_FILE: raw.library.read_bytes()},
             model: {LABELS_FILE: labels} if labels is not None else {}}
    return [preprocess, ensemble], configs, files
