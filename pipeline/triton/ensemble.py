"""Raw requests in, answers out: the Triton ensemble in front of a published variant (``build --raw-inputs``).

Four models answer a client that sends an image file (``<model>_guard``: pipeline/triton/python_models/image_guard/,
which lets through only files the decoder can take without harm, first):

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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.data.artifacts import Artifact
from pipeline.data.tensors import ModelSignature
from pipeline.data.workspace import ModelData

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

from pipeline.backend.extensions import LIBRARY_FILE
from pipeline.data.raw_files import BYTES_INPUT, HWC_INPUT, ImagePreprocess

LABELS_FILE = ModelData.LABELS
PREPROCESS_SUFFIX = "_preprocess"
HWC_SUFFIX = "_hwc"  # the ensemble for clients that decode themselves: uint8 HWC RGB of any size
ENSEMBLE_VERSION = 1  # an ensemble's version folder is empty; Triton needs one


def preprocess_name(model: str, decoded: bool = False) -> str:
    """The Triton name of ``model``'s preprocessing model (``decoded``: the one from uint8 HWC images)."""
    return f"{model}{PREPROCESS_SUFFIX}{HWC_SUFFIX if decoded else ''}"


def ensemble_name(model: str, decoded: bool = False) -> str:
    """The Triton name of ``model``'s raw-input ensemble: ``<model>``, or ``<model>_hwc`` for decoded images."""
    return f"{model}{HWC_SUFFIX if decoded else ''}"


GUARD_MODEL = Path(__file__).parent / "python_models" / "image_guard" / "model.py"
GUARD_SUFFIX = "_guard"
GUARD_OUTPUT = "image_checked"
MAX_BYTES = 64 << 20  # the largest image file the guard lets through
MAX_PIXELS = 64 << 20  # and the most pixels: a file that decodes to more is a decompression bomb


def guard_name(model: str) -> str:
    """The Triton name of ``model``'s image guard (pipeline/triton/python_models/image_guard/)."""
    return f"{model}{GUARD_SUFFIX}"


def guard_config(model: str, instances: int = 1) -> ModelConfig:
    """The guard's config: a Python model (every NGC Triton has the backend) on CPU instances, one file in (TYPE_STRING
    [1], as clients send files), its bytes out (uint8 [-1], what the decoder takes), the limits as parameters."""
    from pipeline.triton.config import _pb

    pb = _pb()
    cfg = pb.ModelConfig(name=guard_name(model), backend="python", max_batch_size=0, default_model_filename="model.py")
    cfg.input.add(name=BYTES_INPUT, data_type=pb.TYPE_STRING, dims=[1])
    cfg.output.add(name=GUARD_OUTPUT, data_type=pb.TYPE_UINT8, dims=[-1])
    cfg.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=instances)
    cfg.parameters["max_bytes"].string_value = str(MAX_BYTES)
    cfg.parameters["max_pixels"].string_value = str(MAX_PIXELS)
    return cfg


def preprocess_config(model: str, pre: ImagePreprocess, library: str | None, instances: int = 1) -> ModelConfig:
    """The preprocessing model's config: one encoded image in (uint8 [-1]), or with no ``library`` one decoded uint8
    HWC RGB image of any size; the model's input tensor out ([1, H, W, C] float32); CPU instances; the custom-op
    library ``library`` (decoding needs it, the rest is standard ONNX).

    ``library`` is relative to the repository's root (``<model>_preprocess/libortextensions.so``): Triton's C++
    ONNX Runtime backend hands the name to ``dlopen`` as it is (onnxruntime_backend ``src/onnxruntime.cc``,
    ``RegisterCustomOpsLibrary``), which reads a relative path from the server's working directory, and the deploy
    bundles start the server in the repository's folder; the local Python-based backend reads it the same way."""
    from pipeline.triton.config import _pb

    pb = _pb()
    decoded = library is None
    cfg = pb.ModelConfig(name=preprocess_name(model, decoded), platform="onnxruntime_onnx", backend="onnxruntime", max_batch_size=0,
                         default_model_filename="model.onnx")
    cfg.input.add(name=HWC_INPUT if decoded else BYTES_INPUT, data_type=pb.TYPE_UINT8, dims=[-1, -1, 3] if decoded else [-1])
    shape = [1, pre.channels, pre.height, pre.width] if pre.channels_first else [1, pre.height, pre.width, pre.channels]
    cfg.output.add(name=pre.input, data_type=pb.TYPE_FP32, dims=shape)
    cfg.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=instances)
    if library is not None:
        cfg.model_operations.op_library_filename.append(library)
    # Memory patterns off (the backend's enable_mem_pattern): every image decodes to its own size, and with them ONNX
    # Runtime 1.32 handed out the first run's output from a block the next run reuses (measured: the first answer of
    # a session changed under it; with the arena off too, the heap broke).
    cfg.parameters["enable_mem_pattern"].string_value = "0"
    return cfg


def ensemble_config(model: str, variant: str, variant_signature: ModelSignature, pre: ImagePreprocess,
                    labels_file: str | None, classifier_output: str | None, decoded: bool = False) -> ModelConfig:
    """The ensemble ``model`` (``<model>_hwc`` with ``decoded``): an encoded image (or a decoded uint8 HWC one) through
    its preprocessing into ``variant``; every output of the variant with its batch axis of 1, the classifier output
    with ``labels_file``."""
    from pipeline.triton.config import _pb, triton_dtype

    pb = _pb()
    source = HWC_INPUT if decoded else BYTES_INPUT
    cfg = pb.ModelConfig(name=ensemble_name(model, decoded), platform="ensemble", max_batch_size=0)
    if decoded:
        cfg.input.add(name=source, data_type=pb.TYPE_UINT8, dims=[-1, -1, 3])
    else:  # one file as one string element (BYTES on the wire); the guard hands its bytes on as uint8
        cfg.input.add(name=source, data_type=pb.TYPE_STRING, dims=[1])
    checked = source
    if not decoded:  # files go through the guard before the decoder (pipeline/triton/python_models/image_guard/)
        step = cfg.ensemble_scheduling.step.add(model_name=guard_name(model), model_version=-1)
        step.input_map[BYTES_INPUT] = BYTES_INPUT
        step.output_map[GUARD_OUTPUT] = f"{BYTES_INPUT}__checked"
        checked = f"{BYTES_INPUT}__checked"
    for spec in variant_signature.outputs:
        dims = [1] + [d if isinstance(d, int) and d > 0 else -1 for d in spec.shape[1:]]
        out = cfg.output.add(name=spec.name, data_type=getattr(pb, triton_dtype(spec.dtype)), dims=dims)
        if labels_file and spec.name == classifier_output:
            out.label_filename = labels_file
    step = cfg.ensemble_scheduling.step.add(model_name=preprocess_name(model, decoded), model_version=-1)
    step.input_map[source] = checked
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
    """What a build publishes for raw requests: the variant the ensemble serves, and the step in front of it: for
    images the preprocessing graph with its custom-op library, for text the tokenizer's files."""

    kind: str  # "image" | "text"
    variant: Artifact  # the published variant the ensemble serves
    preprocess: Path | None = None  # image: the ONNX graph (pipeline/stages/image_preprocess.py)
    preprocess_hwc: Path | None = None  # image: the same from decoded uint8 HWC images (no custom op)
    library: Path | None = None  # image: onnxruntime-extensions' library, shipped inside the preprocessing model's folder
    tokenizer: Path | None = None  # text: the folder of tokenizer_settings.json and vocabulary.txt (pipeline/stages/tokenizer_export.py)
    instances: int = 1  # CPU instances of each step in front of the variant (they take one image or request at a time)

    def fingerprint(self) -> str:
        """The content hash of what the ensemble is made of (what the stage cache keys on)."""
        from pipeline.core.fingerprint import hash_path

        parts = [self.kind, self.variant.triton_name("m"), self.variant.fingerprint(), str(self.instances)]
        sources = [WORDPIECE_MODEL, WORDPIECE_MODEL.parent / TOKENIZER_MODULE, GUARD_MODEL]  # the files published, not __pycache__
        parts += [hash_path(p) for p in (self.preprocess, self.preprocess_hwc, self.library, self.tokenizer, *sources) if p is not None]
        return ":".join(parts)


def raw_input_models(raw: RawInputs, model: str, variant_signature: ModelSignature, labels: bytes | None, classifier_output: str | None,
                     max_batch: int) -> tuple[list[Artifact], dict[str, Any], dict[str, dict[str, bytes]]]:
    """The step in front of the variant and the ensemble as artifacts, their configs and their files, ready for
    :func:`pipeline.triton.repository.publish_repository`."""
    label_file = LABELS_FILE if labels is not None else None
    label_files = {LABELS_FILE: labels} if labels is not None else {}
    if raw.kind == "text":
        assert raw.tokenizer is not None
        step = Artifact("raw", "tokenize", WORDPIECE_MODEL)
        settings = json.loads((raw.tokenizer / TOKENIZER_SETTINGS).read_text())
        made = [(settings.get("input_names") or {}).get(name, name) for name in settings["outputs"]]  # the model's names
        configs = {
            tokenize_name(model): tokenize_config(model, made, variant_signature, max_batch, raw.instances),
            model: text_ensemble_config(model, raw.variant.triton_name(model), variant_signature, made, max_batch,
                                        label_file, classifier_output),
        }
        files = {tokenize_name(model): {name: (raw.tokenizer / name).read_bytes() for name in (TOKENIZER_SETTINGS, VOCABULARY)}
                 | {TOKENIZER_MODULE: (WORDPIECE_MODEL.parent / TOKENIZER_MODULE).read_bytes()}, model: label_files}
        return [step, Artifact("raw", "ensemble", raw.tokenizer / TOKENIZER_SETTINGS)], configs, files
    from pipeline.data.raw_files import preprocess_of

    assert raw.preprocess is not None and raw.library is not None and raw.preprocess_hwc is not None
    pre = preprocess_of(raw.preprocess)
    variant = raw.variant.triton_name(model)
    configs = {
        preprocess_name(model): preprocess_config(model, pre, f"{preprocess_name(model)}/{LIBRARY_FILE}", raw.instances),
        model: ensemble_config(model, variant, variant_signature, pre, label_file, classifier_output),
        preprocess_name(model, True): preprocess_config(model, pre, None, raw.instances),
        ensemble_name(model, True): ensemble_config(model, variant, variant_signature, pre, label_file, classifier_output, decoded=True),
        guard_name(model): guard_config(model, raw.instances),
    }
    files = {preprocess_name(model): {LIBRARY_FILE: raw.library.read_bytes()}, model: label_files, preprocess_name(model, True): {},
             ensemble_name(model, True): dict(label_files), guard_name(model): {}}
    models = [Artifact("raw", "guard", GUARD_MODEL), Artifact("raw", "preprocess", raw.preprocess), Artifact("raw", "ensemble", raw.preprocess),
              Artifact("raw", "preprocess_hwc", raw.preprocess_hwc), Artifact("raw", "ensemble_hwc", raw.preprocess_hwc)]
    return models, configs, files


# ---- text: the WordPiece tokenizer as a Python model (pipeline/triton/python_models/wordpiece/) -------------------

WORDPIECE_MODEL = Path(__file__).parent / "python_models" / "wordpiece" / "model.py"
TOKENIZER_MODULE = "wordpiece_tokenizer.py"  # beside config.pbtxt: a version folder holds only the model file
TOKENIZER_SETTINGS = "tokenizer_settings.json"
VOCABULARY = "vocabulary.txt"
TOKENIZE_SUFFIX = "_tokenize"


def tokenize_name(model: str) -> str:
    """The Triton name of ``model``'s tokenizer model."""
    return f"{model}{TOKENIZE_SUFFIX}"


def tokenize_config(model: str, outputs: list[str], variant_signature: ModelSignature, max_batch: int, instances: int = 1) -> ModelConfig:
    """The tokenizer's config: ``text`` (one UTF-8 string per row) in, the variant's token inputs out (int, [-1]), a
    Python model (``backend: "python"``: every NGC Triton has it) on CPU instances, batched as the variant is."""
    from pipeline.data.raw_files import TEXT_INPUT
    from pipeline.triton.config import _pb, triton_dtype

    pb = _pb()
    cfg = pb.ModelConfig(name=tokenize_name(model), backend="python", max_batch_size=max_batch, default_model_filename="model.py")
    cfg.input.add(name=TEXT_INPUT, data_type=pb.TYPE_STRING, dims=[1])
    dtypes = {s.name: s.dtype for s in variant_signature.inputs}
    for name in outputs:
        cfg.output.add(name=name, data_type=getattr(pb, triton_dtype(dtypes[name])), dims=[-1])
    cfg.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=instances)
    cfg.dynamic_batching.SetInParent()
    return cfg


def text_ensemble_config(model: str, variant: str, variant_signature: ModelSignature, token_outputs: list[str], max_batch: int,
                         labels_file: str | None, classifier_output: str | None) -> ModelConfig:
    """The ensemble ``model`` for text: sentences through ``<model>_tokenize`` into ``variant``, batched as the variant."""
    from pipeline.data.raw_files import TEXT_INPUT
    from pipeline.triton.config import _pb, triton_dtype

    pb = _pb()
    cfg = pb.ModelConfig(name=model, platform="ensemble", max_batch_size=max_batch)
    cfg.input.add(name=TEXT_INPUT, data_type=pb.TYPE_STRING, dims=[1])
    for spec in variant_signature.outputs:
        out = cfg.output.add(name=spec.name, data_type=getattr(pb, triton_dtype(spec.dtype)),
                             dims=[d if isinstance(d, int) and d > 0 else -1 for d in spec.shape[1:]])
        if labels_file and spec.name == classifier_output:
            out.label_filename = labels_file
    step = cfg.ensemble_scheduling.step.add(model_name=tokenize_name(model), model_version=-1)
    step.input_map[TEXT_INPUT] = TEXT_INPUT
    for name in token_outputs:
        step.output_map[name] = f"{name}__tokenized"
    step = cfg.ensemble_scheduling.step.add(model_name=variant, model_version=-1)
    for name in token_outputs:
        step.input_map[name] = f"{name}__tokenized"
    for spec in variant_signature.outputs:
        step.output_map[spec.name] = spec.name
    return cfg
