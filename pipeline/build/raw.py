"""The build's raw-input steps (``--raw-inputs image``): what the preprocessing does, the image files it is judged
on, the variant the ensemble serves, and the gate that sends the files through Triton before anything is published."""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.accuracy.evaldata import EvalData
from pipeline.accuracy.gates import Gates, tolerance_for
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.build.config import BuildConfig
from pipeline.core.errors import CheckFailed, PipelineError
from pipeline.core.stagecache import Stage
from pipeline.data.artifacts import Artifact
from pipeline.data.raw_files import ImageFiles, ImagePreprocess, TextSamples, image_files, is_image_folder, is_text_file, reference_tensor, text_samples
from pipeline.data.tensors import ModelSignature
from pipeline.stages.tokenizer_export import read_model_tokenizer
from pipeline.triton.ensemble import RawInputs

log = logging.getLogger(__name__)

RawSamples = ImageFiles | TextSamples

RAW_EVAL_DIR = "raw_eval"  # the bundled model's evaluation digits as PNG files, in its workspace


def pixel_scaling(saved: Path, cfg: BuildConfig) -> str:
    """How image files become the model's input everywhere in the build (calibration and evaluation folders, the
    raw-input ensemble): ``raw`` (0..255) when the model scales its input itself (a Rescaling of 1/255 or 1/127.5, a
    Normalization), else ``--preprocess``; the build says which when they differ."""
    from pipeline.stages.savedmodel import read_input_scaling

    scaling = read_input_scaling(saved)
    if not scaling:
        return cfg.preprocess
    if cfg.preprocess != "raw":
        log.info("images are fed as 0..255: the model's own %s scales them (--preprocess %s not applied)", next(iter(scaling.values())),
                 cfg.preprocess)
    return "raw"


def image_preprocess_of(saved: Path, signature: ModelSignature, cfg: BuildConfig) -> ImagePreprocess:
    """What the ensemble does to an image for this model: its one image input, ``--resize``, and the scale of the
    model's own Rescaling/Normalization layer or else ``--preprocess`` (the build says which, in one line)."""
    from pipeline.stages.image_preprocess import image_preprocess_for
    from pipeline.stages.savedmodel import read_input_scaling

    if len(signature.inputs) != 1:
        raise PipelineError(f"--raw-inputs image needs a model with one image input; this one has {len(signature.inputs)} "
                            f"({', '.join(s.name for s in signature.inputs)})", "leave --raw-inputs out for this model")
    spec = signature.inputs[0]
    pre = image_preprocess_for(spec, cfg.resize, cfg.preprocess, read_input_scaling(saved).get(spec.name), cfg.resize_filter)
    log.info("raw inputs: %s", pre.describe())
    return pre


def raw_image_files(cfg: BuildConfig, bundled: bool, workspace_root: Path, classes: list[str] | None) -> RawSamples | None:
    """The raw inputs the raw-input gate sends: ``--eval-data`` when it is a folder of images or a file of sentences; for
    the bundled model its evaluation digits written as PNG files of assorted sizes; else None (the gate cannot run)."""
    if cfg.eval_data is not None and cfg.raw_inputs == "text":
        return text_samples(cfg.eval_data, classes) if is_text_file(cfg.eval_data) else None
    if cfg.eval_data is not None and is_image_folder(cfg.eval_data):
        return image_files(cfg.eval_data, classes)
    if bundled:
        from pipeline.models.digits import write_image_folder

        folder = workspace_root / RAW_EVAL_DIR
        if not folder.is_dir():
            write_image_folder(folder.with_name(folder.name + ".partial"))
            folder.with_name(folder.name + ".partial").rename(folder)
        return image_files(folder, classes)
    return None


def text_eval_data(samples: TextSamples, tokens: Path) -> EvalData:
    """The tensor-path evaluation data of a file of sentences: keras-hub's preprocessing of each, with the file's labels."""
    from pipeline.core.fingerprint import hash_path

    with np.load(tokens) as arrays:
        inputs = {name: arrays[name] for name in arrays.files}
    labels = np.asarray(samples.labels, np.int64) if samples.labels is not None else None
    # the labels and class names are part of what the gates judge: keyed with the tokens
    key = hashlib.sha256(f"{hash_path(tokens)}:{samples.labels}:{samples.classes}".encode()).hexdigest()
    return EvalData.single(inputs, labels, f"{len(samples.texts)} sentences of {samples.path} (keras-hub preprocessing)", key)


def image_eval_data(files: ImageFiles, pre: ImagePreprocess) -> EvalData:
    """The tensor-path evaluation data of an image folder: Keras's preprocessing of each file, with the folder's labels."""
    inputs = {pre.input: np.stack([reference_tensor(p, pre) for p in files.files])}
    labels = np.asarray(files.labels, np.int64) if files.labels is not None else None
    digest = hashlib.sha256(f"{pre.to_json()}:{files.labels}:{files.classes}".encode())
    for path in files.files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return EvalData.single(inputs, labels, f"{len(files.files)} images of {files.folder} (Keras preprocessing)", digest.hexdigest())


def served_variant(cfg: BuildConfig, variants: Sequence[Artifact], results: Mapping[str, Any]) -> Artifact:
    """The variant the ensemble serves: ``--raw-variant``, else the fastest ONNX variant at batch 1 (the latency stage)
    among those that passed their gate (FP32 always has)."""
    candidates = {v.precision: v for v in variants if v.kind == "onnx" and v.precision != "u8"}
    if cfg.raw_variant is not None:
        if cfg.raw_variant not in candidates:
            raise PipelineError(f"--raw-variant {cfg.raw_variant} is not among this build's published variants ({', '.join(candidates)})",
                                f"build it too (e.g. --{cfg.raw_variant.replace('int8cpu', 'int8-cpu')}) or pick another")
        return candidates[cfg.raw_variant]
    failed = {v["precision"] for v in (results.get("accuracy") or {}).get("variants", []) if not v.get("passed")}
    speed: dict[str, float] = {}
    for row in (results.get("latency") or {}).get("variants", []):
        ones = [b["median_ms"] for b in row.get("batches", []) if b.get("batch") == 1]
        if row.get("kind") == "onnx" and ones:
            speed[row["precision"]] = ones[0]
    passing = [p for p in candidates if p not in failed]
    best = min(passing, key=lambda p: (speed.get(p, float("inf")), p != "fp32"))
    log.info("raw inputs: the ensemble serves %s (%s)", best,
             f"{speed[best]:.3g} ms at batch 1, the fastest that passed its gate" if best in speed else "no latency measured")
    return candidates[best]


def gate_raw_inputs(gate_repository: Path, model: str, variant: Artifact, samples: RawSamples, reference: list[dict[str, np.ndarray]],
                    fp32_onnx: Path, kinds: dict[str, OutputKind], gates: Gates, workdir: Path, tensor_data: EvalData | None = None,
                    described: str = "", pairing: Sequence[int] | None = None) -> dict[str, Any]:
    """The raw-input gate on ``gate_repository`` (the ensemble, the step in front and ``variant``, published there
    first) against ``reference`` (the FP32 model on Keras's preprocessing of the same samples): the report; CheckFailed
    (one line, naming output and figure) when the answers differ past the variant's tolerance, or when, with labels on
    both, the accuracy from raw inputs falls below the tensor path's (FP32 on ``tensor_data``) by more than the variant's
    accuracy limit: a preprocessing declared unlike training (``--preprocess``) fails there. ``pairing`` gives, per raw
    file, its sample's index in ``tensor_data`` when the files are those samples (then the comparison is paired)."""
    from pipeline.triton.raw_gate import hold_to_tensor_path, raw_gate

    tolerance = tolerance_for(variant.precision, gates)
    report = raw_gate(gate_repository, model, variant.precision, samples, reference, kinds, tolerance, workdir=workdir)
    report["preprocess"] = described
    tensor_right = _tensor_right(fp32_onnx, tensor_data, kinds) if tensor_data is not None else None
    if tensor_right is not None and tensor_data is not None:
        paired = tensor_right[list(pairing)] if pairing is not None and max(pairing, default=-1) < len(tensor_right) else None
        hold_to_tensor_path(report, float(tensor_right.mean()), tensor_data.num_samples, tolerance, paired)
        report["tensor_samples"] = tensor_data.num_samples
        if paired is not None and isinstance(samples, ImageFiles):  # for verify --data with these files again, by content
            from pipeline.triton.raw_gate import file_digests

            report["tensor_right_by_file"] = {d: int(r) for d, r in zip(file_digests(samples), paired, strict=True)}
    if report["failures"]:
        raise CheckFailed(f"raw inputs through the ensemble '{model}' answer unlike the model on Keras's preprocessing of the same "
                          f"{report['files']} inputs: {report['failures'][0]}",
                          "check the preprocessing against training (--preprocess, --resize, channel order, the tokenizer's vocabulary); "
                          "the ensemble was not published")
    for line in report["undecided"]:
        log.warning("raw inputs: %s", line)
    return report


def _tensor_right(fp32_onnx: Path, data: EvalData, kinds: dict[str, OutputKind]) -> np.ndarray | None:
    """Per sample of the build's evaluation tensors, whether FP32's top-1 is right (None without labels or a classes output)."""
    from pipeline.backend.onnxrt import session_from_onnx

    output = next((name for name, kind in kinds.items() if kind.kind == "classes"), None)
    if output is None or any(output not in b.targets for b in data.buckets):
        return None
    session = session_from_onnx(fp32_onnx)
    right = [session.run([output], b.inputs)[0].argmax(-1).reshape(-1) == b.targets[output].reshape(-1) for b in data.buckets]
    return np.concatenate(right) if right else None


def gate_settings(settings: Any, root: Path) -> Any:
    """Publish settings for the gate's own repository: no MIG configs, no deploy bundle, version 1 only."""
    return replace(settings, repository=root, mig=None, deploy_plans=None, version_policy="replace", bundle=False)


@dataclass(frozen=True)
class RawIn:
    """A build's raw inputs: the image preprocessing (images), the samples, keras-hub's tokens of sentences, and the
    tensor-path evaluation data made of them when ``--eval-data`` named them."""

    pre: ImagePreprocess | None = None
    samples: RawSamples | None = None
    text_tokens: Path | None = None
    tensor_data: EvalData | None = None
    tokenizer: Path | None = None  # --tokenizer's files for the served tokenizer (else the model's own, from the SavedModel)
    pairing: tuple[int, ...] | None = None  # per raw file, its sample in the build's evaluation data (the files are those samples)


def raw_inputs_of(cfg: BuildConfig, saved: Path, signature: ModelSignature, source: Any, bundled: bool, ctx: Any) -> RawIn:
    """What the build knows of raw inputs before its gates: for ``--raw-inputs image`` or an image folder as
    ``--eval-data``, the preprocessing and the files; for ``--raw-inputs text``, the sentences and keras-hub's tokens of
    them (the model's own preprocessor, in a child process)."""
    labels = ctx.data_dir.labels
    classes = [line.strip() for line in labels.read_text().splitlines() if line.strip()] if labels.is_file() else None
    images_given = cfg.eval_data is not None and is_image_folder(cfg.eval_data)
    if cfg.raw_inputs == "text":
        samples = raw_image_files(cfg, bundled, ctx.ws.root, classes)
        texts = samples if isinstance(samples, TextSamples) else None
        if cfg.tokenizer is not None:
            folder, tokens = _given_tokenizer(cfg.tokenizer, texts, signature, ctx)
        else:
            read_model_tokenizer(saved)  # a model without a servable tokenizer fails now, not after its gates
            folder, tokens = None, _text_tokens(source, texts, signature, ctx) if texts is not None else None
        if texts is None or tokens is None:
            return RawIn(tokenizer=folder)
        return RawIn(samples=texts, text_tokens=tokens, tensor_data=text_eval_data(texts, tokens), tokenizer=folder)
    if cfg.raw_inputs != "image" and not images_given:
        return RawIn()
    pre = image_preprocess_of(saved, signature, cfg)
    files = raw_image_files(cfg, bundled, ctx.ws.root, classes)
    data = image_eval_data(files, pre) if images_given and isinstance(files, ImageFiles) else None
    pairing = None  # the tensor path's samples are these files (a folder given), or the digits they were drawn from
    if isinstance(files, ImageFiles) and images_given:
        pairing = tuple(range(len(files.files)))
    elif isinstance(files, ImageFiles) and bundled and cfg.eval_data is None:
        pairing = tuple(int(p.stem) for p in files.files)  # pipeline.models.digits.write_image_folder names them so
    return RawIn(pre, files, None, data, pairing=pairing)


def _given_tokenizer(path: Path, texts: TextSamples | None, signature: ModelSignature, ctx: Any) -> tuple[Path, Path | None]:
    """``--tokenizer``'s files for the served tokenizer, and keras-hub's tokens of the sentences with it (the reference),
    a cached stage. The sequence length is the model's token input's, which must be fixed."""
    from pipeline.stages.tokenizer_export import given_tokenizer_files

    lengths = {s.shape[1] for s in signature.inputs if len(s.shape) == 2}
    length = next(iter(lengths)) if len(lengths) == 1 else None
    if not isinstance(length, int) or length < 2 or len(lengths) != 1:
        raise PipelineError(f"--tokenizer: the model's token inputs ({', '.join(f'{s.name} {list(s.shape)}' for s in signature.inputs)}) "
                            "need one fixed sequence length, [batch, L], to pad to", "export the model with a fixed sequence length")
    folder, tokens = ctx.ws.root / "tokenizer_given", ctx.ws.root / "text_reference.npz"
    ctx.run(Stage("tokenizer", given_tokenizer_files, inputs={"path": path},
                  settings={"texts": list(texts.texts) if texts else [], "inputs": [s.name for s in signature.inputs],
                            "dtypes": [str(s.dtype) for s in signature.inputs], "sequence_length": length},
                  outputs={"dst": folder, "tokens": tokens}))
    return folder, tokens if texts is not None else None


def _text_tokens(source: Any, samples: TextSamples, signature: ModelSignature, ctx: Any) -> Path:
    """keras-hub's tokens of the sentences (the model's own preprocessor), a cached stage."""
    from pipeline.stages.text_reference import keras_hub_tokens_from_source

    dst = ctx.ws.root / "text_reference.npz"
    inputs = [s.name for s in signature.inputs]
    ctx.run(Stage("text-reference", keras_hub_tokens_from_source, inputs={"source": source}, environment={"model": source.spec},
                  settings={"texts": list(samples.texts), "inputs": inputs, "dtypes": [str(s.dtype) for s in signature.inputs]},
                  outputs={"dst": dst}))
    return dst


def raw_input_stages(raw_in: RawIn, variants: list[Artifact], onnx_fp32: Path, data: EvalData, kinds: dict[str, OutputKind],
                     ctx: Any, settings: Any, saved: Path) -> RawInputs:
    """The step in front of the variant (the image preprocessing graph, or the model's tokenizer), the variant the
    ensemble serves, and the raw-input gate through Triton on a repository of its own (the ensemble, that step and the
    variant), before anything is published. ``ctx`` is the build's context (pipeline.build.orchestrator.BuildContext),
    ``settings`` its publish settings; ``text_tokens`` keras-hub's tokens of the text samples (the reference)."""
    from pipeline.build.publish import repository_from_artifacts
    from pipeline.triton.raw_gate import image_reference_feeds, reference_outputs, text_reference_feeds

    pre, samples, text_tokens = raw_in.pre, raw_in.samples, raw_in.text_tokens
    variant = served_variant(ctx.cfg, variants, ctx.manifest.results)
    if ctx.cfg.raw_inputs == "text":
        raw = RawInputs("text", variant, tokenizer=_tokenizer_files(raw_in.tokenizer or read_model_tokenizer(saved), onnx_fp32, ctx),
                        instances=ctx.cfg.raw_instances)
        described = "tokenize with the model's own WordPiece vocabulary and settings (keras-hub's rules, in a Python model)"
    else:
        raw, described = _image_step(pre, variant, ctx)
    if samples is None:
        want = "a folder of images (one sub-folder per class)" if raw.kind == "image" else "a CSV of labeled sentences (text,label)"
        ctx.manifest.not_run("raw-gate", f"nothing raw to judge the ensemble on: give --eval-data {want}")
        log.warning("raw inputs: the ensemble is not gated (give --eval-data %s)", want)
        return raw
    started = time.perf_counter()
    gate_repo = ctx.ws.root / "raw_gate_repository"
    shutil.rmtree(gate_repo, ignore_errors=True)  # only what this build serves: a variant an earlier build picked goes
    repository_from_artifacts([raw.variant], {v.precision: v.path for v in variants}, data.head(1), gate_settings(settings, gate_repo),
                              {}, ctx.cfg.command, raw=raw)
    if isinstance(samples, ImageFiles):
        assert pre is not None
        feeds = image_reference_feeds(samples, pre)
    else:
        assert text_tokens is not None
        feeds = text_reference_feeds(text_tokens)
    reference = reference_outputs(onnx_fp32, feeds, list(kinds))
    report = gate_raw_inputs(gate_repo, ctx.name, raw.variant, samples, reference, onnx_fp32, kinds, ctx.cfg.gates, ctx.cfg.workdir,
                             None if isinstance(samples, TextSamples) else data, described, raw_in.pairing)
    ctx.manifest.results["raw_inputs"] = report
    ctx.manifest.ran("raw-gate", time.perf_counter() - started, f"{report['files']} raw inputs through the ensemble in the embedded tritonserver")
    return raw


def _image_step(pre: ImagePreprocess | None, variant: Artifact, ctx: Any) -> tuple[RawInputs, str]:
    from pipeline.backend.extensions import extensions_library, require_loadable_in_triton
    from pipeline.stages.image_preprocess import image_preprocess_onnx

    assert pre is not None
    dst, hwc = ctx.ws.root / "preprocess.onnx", ctx.ws.root / "preprocess_hwc.onnx"
    ctx.run(Stage("preprocess", image_preprocess_onnx, settings={"pre": pre}, outputs={"dst": dst}))
    ctx.run(Stage("preprocess-hwc", image_preprocess_onnx, settings={"pre": pre, "decoded": True}, outputs={"dst": hwc}))
    library = extensions_library(ctx.cfg.extensions_library)
    if ctx.cfg.extensions_library is not None:  # given for production: it must load where the bundles run it
        require_loadable_in_triton(library, "NGC Triton")
    log.info("raw inputs: custom ops from %s", library.describe())
    return RawInputs("image", variant, preprocess=dst, preprocess_hwc=hwc, library=library.path, instances=ctx.cfg.raw_instances), pre.describe()


def _tokenizer_files(exported: Path, onnx_fp32: Path, ctx: Any) -> Path:
    """The tokenizer files (``exported``: the model's own, from the savedmodel stage, or ``--tokenizer``'s) in the workspace, padding to length buckets:
    powers of two below the preprocessor's sequence length, and that length (a request pays for its own length); only
    that length when the model's token inputs have a fixed one."""
    import json

    from pipeline.data.tensors import signature_from_onnx
    from pipeline.stages.tokenizer_export import SETTINGS_FILENAME

    folder = ctx.ws.root / "tokenizer"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(exported, folder)
    settings = json.loads((folder / SETTINGS_FILENAME).read_text())
    length = int(settings["sequence_length"])
    fixed = any(len(s.shape) > 1 and isinstance(s.shape[1], int) and s.shape[1] > 0 for s in signature_from_onnx(onnx_fp32).inputs)
    settings["buckets"] = [length] if fixed else sorted({b for b in (8, 16, 32, 64, 128, 256, 512) if b < length} | {length})
    (folder / SETTINGS_FILENAME).write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    log.info("raw inputs: the model's tokenizer (%s, vocabulary of %d, sequence length %d, padded to %s)", settings.get("kind"),
             settings.get("vocabulary_size"), length, settings["buckets"])
    return folder
