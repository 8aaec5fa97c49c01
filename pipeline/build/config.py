"""Typed settings of a build: the one source of every build option (flag, default, help, check).

``python -m pipeline build --help`` is generated from :class:`BuildConfig` (pipeline/commands/build.py);
adding an option is adding a field here and using it in its stage (see pipeline/core/options.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.accuracy.gates import Gates
from pipeline.accuracy.outputkinds import KINDS, parse_output_kinds
from pipeline.backend.budget import DEFAULT_MAX_MEMORY_GIB
from pipeline.backend.trt_rtx import COMPUTE_CAPABILITIES, DEFAULT_COMPUTE_CAPABILITY
from pipeline.backend.trt_seam import PolygraphyTensorRT, TensorRT
from pipeline.core.errors import PipelineError
from pipeline.core.objectstore import S3Url, local_only
from pipeline.core.options import (
    at_least,
    calibration_root_option,
    check_options,
    eval_data_option,
    in_range,
    option,
    repository_option,
)
from pipeline.data.profiles import SHAPE_SYNTAX, well_formed
from pipeline.data.raw_files import RESIZE_FILTERS
from pipeline.data.workspace import Workspace
from pipeline.stages.calibration import ASPECT_TOLERANCE, PREPROCESS_MODES, RESIZE_MODES
from pipeline.stages.int8 import CALIBRATION_METHODS
from pipeline.stages.int8_fallback import FallbackSettings
from pipeline.stages.source import DEFAULT_MODEL, ModelSource

__all__ = ["BuildConfig", "Gates", "Workspace"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")

MODEL = "model"
OUTPUTS = "outputs"
CONVERSION = "conversion"
PRECISION = "precision (the precision lives in the ONNX graph; engines are strongly typed)"
ENGINES = "TensorRT engines (need the 'tensorrt' extra and an NVIDIA GPU; skipped with one line otherwise)"
SERVED = "served check"
RAW = "raw requests (an ensemble that takes image files or sentences and answers with class names)"
FLEET = "many models (pipeline/commands/fleet.py)"


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build needs; each field is one ``python -m pipeline build`` option."""

    model: str = option(DEFAULT_MODEL, "a .keras file, a Keras 2 .h5 file, a SavedModel folder, or module:function returning a Keras model "
                                       "(default: the bundled digits CNN)", metavar="PATH|MODULE:FUNC", group=MODEL)
    name: str | None = option(None, "model name in the workdir and Triton (default: file stem, folder name, or module name)", group=MODEL)
    eval_data: Path | None = eval_data_option(MODEL)
    output_kinds: tuple[str, ...] = option((), f"what an output is, when the detected kind is wrong: NAME=KIND with KIND one of {', '.join(KINDS)}; "
                                               "repeat for more outputs (see README, Accuracy gates)", flag="--output-kind", metavar="NAME=KIND", group=MODEL)
    imports: tuple[str, ...] = option((), "import these Python modules before loading the model (modules that register custom Keras layers "
                                          "with @keras.saving.register_keras_serializable), comma-separated or repeated", flag="--import",
                                      metavar="MODULE", group=MODEL)
    allow_lambda: bool = option(False, "load Lambda layers of a .keras or .h5 file, which runs Python code stored in the file "
                                       "(refused otherwise: use only for files you trust)", group=MODEL)
    workdir: Path = option(Path("build"), "build artifacts, manifest, server logs and the reports folder", metavar="DIR", group=OUTPUTS)
    report_dir: Path | None = option(None, "where the HTML page index.html goes (default: <workdir>/reports)", metavar="DIR", group=OUTPUTS)
    repository: Path | S3Url = repository_option(OUTPUTS)
    version_policy: str = option("new", "add a new numbered version, or replace the pipeline's versions", choices=("new", "replace"), group=OUTPUTS)
    triton_image: str | None = option(None, "NGC tritonserver image for the deploy bundle, or a bare NGC tag such as 24.10-py3 (default: "
                                            "nvcr.io/nvidia/tritonserver:24.10-py3, Triton 2.51 as served here); with TensorRT plans to build, "
                                            "refused before any stage unless its TensorRT, from a source, is the one building them",
                                      metavar="IMAGE", group=OUTPUTS)
    mig: str | None = option(None, "add per-MIG-profile configs and a launch bundle, e.g. H200-141GB or A100-80GB:3x2g.20gb,1x1g.10gb "
                                   "(see mig-plan)", metavar="GPU[:LAYOUT]", group=OUTPUTS)
    opset: int = option(17, "ONNX opset, 17 or newer", check=lambda v: None if v >= 17 else "is too old", fix="use --opset 17 or newer",
                        group=CONVERSION)
    external_data: bool = option(False, "store every ONNX variant's weights in a <file>.data beside it (ONNX's external data), as a model "
                                        "with over 256 MiB of weights always is (the 2 GB protobuf limit, and memory)", group=CONVERSION)
    max_batch: int = option(64, "largest batch the deployment serves", check=in_range(1, 4096), fix="use a value from 1 to 4096", group=CONVERSION)
    fp16: bool = option(False, "add an FP16 ONNX variant (FP32 inputs/outputs; Softmax and other sensitive ops kept FP32)", group=PRECISION)
    fp16_keep_op_types: tuple[str, ...] = option((), "FP16: also keep these ONNX op types in FP32, comma-separated or repeated, "
                                                     "e.g. Softmax,LayerNormalization", metavar="TYPE,...", group=PRECISION)
    fp16_keep_nodes: tuple[str, ...] = option((), "FP16: keep these nodes of model.fp32.onnx in FP32 (node names, comma-separated or repeated)",
                                              metavar="NAME,...", group=PRECISION)
    int8: bool = option(False, "add an INT8 variant: explicit Q/DQ, symmetric int8, zero point 0, per-channel weights", group=PRECISION)
    int8_cpu: bool | None = option(None, "the CPU INT8 variant (<name>_int8cpu: uint8 activations, 7-bit int8 weights, run by ONNX "
                                         "Runtime's integer kernels on CPU instances, faster than FP32 there and right on every x86-64 CPU). "
                                         "With --int8 it is added unasked, and left out with one line when its gate does not pass; "
                                         "--int8-cpu asks for it (its gate then decides the build, as every named variant's does; "
                                         "works without --int8 too); --no-int8-cpu leaves it out", group=PRECISION)
    int8_fallback: bool = option(True, "do not keep the costliest quantized nodes in float when an INT8 variant's gate does not pass "
                                       "(by default they are, as few as the gate needs, and the report lists them)",
                                 flag="--no-int8-fallback", group=PRECISION)
    int8_fallback_max_share: float = option(0.5, "INT8 fallback: at most this share of the quantized nodes (and at least 2) may be kept in float",
                                            check=in_range(0.01, 1.0), metavar="SHARE", group=PRECISION)
    int8_keep_nodes: tuple[str, ...] = option((), "INT8: keep these Conv/ConvTranspose/Gemm/MatMul nodes of model.fp32.onnx in float (no Q/DQ "
                                              "on their inputs; a failed INT8 gate names the layers that add the most error), comma-separated "
                                              "or repeated", metavar="NAME,...", group=PRECISION)
    int8_table_min_mib: float = option(64.0, "INT8: embedding tables (float, read only by Gather) of at least this size are stored int8 "
                                             "with a scale per row, weights only (a quarter of their bytes); smaller ones stay float",
                                       check=in_range(0.0, 1e9), metavar="MIB", group=PRECISION)
    uint8_input: float | None = option(None, "image models: add <name>_u8, the FP32 model taking uint8 NHWC image inputs with × SCALE "
                                             "folded into the graph (a quarter of the bytes per request; SCALE 1 when the model rescales "
                                             "0..255 itself), gated against FP32 within the parity tolerance", metavar="SCALE",
                                        check=lambda v: None if v is None or v > 0 else "must be positive", fix="e.g. --uint8-input 0.00392156862745098 (1/255)",
                                        group=PRECISION)
    calibration: Path | None = option(None, "INT8 calibration data: an .npz (one array per input), a folder with calib.npz or <input>.npy "
                                            "files, or a folder of JPEG/PNG images (default: <calibration-root>/<name>/)",
                                      metavar="PATH", group=PRECISION)
    calibration_root: Path = calibration_root_option(PRECISION)
    calibration_method: str = option("percentile", "how activation ranges are chosen (see README for the measurements behind the default)",
                                     choices=CALIBRATION_METHODS, group=PRECISION)
    preprocess: str = option("unit", "how image files become the input (calibration and evaluation folders, the --raw-inputs ensemble): "
                                     "unit = 0..1, symmetric = -1..1, imagenet = RGB mean/std, raw = 0..255; a model with its own "
                                     "Rescaling(1/255)/Normalization layer takes 0..255 whatever this says",
                             choices=PREPROCESS_MODES, group=PRECISION)
    resize: str | None = option(None, f"how image files are fitted to the input: stretch, crop (centre) or pad (black borders); "
                                      f"calibration refuses images whose aspect ratio differs by more than {ASPECT_TOLERANCE:g}x without it, "
                                      "the --raw-inputs ensemble stretches",
                                choices=RESIZE_MODES, group=PRECISION)
    max_memory_gib: float = option(DEFAULT_MAX_MEMORY_GIB, "memory budget that sizes calibration batches from the model's activations "
                                                           "(see README, Memory)", check=in_range(0.25, 4096), metavar="GIB", group=PRECISION)
    shapes: tuple[str, ...] = option((), "dynamic-shape profile of an input, dims joined by x, e.g. image:1x8x8x1/64x8x8x1/64x8x8x1; "
                                         "repeat for more inputs; naming an input again starts the next profile (default: batch 1/max/max)",
                                     flag="--shape", metavar="INPUT:MIN/OPT/MAX", group=ENGINES)
    engine: bool = option(True, "do not build TensorRT engines even where possible", flag="--no-engine", group=ENGINES)
    plans_at_deploy: bool = option(False, "build no plan here: record, beside each GPU ONNX variant, its profiles and golden inputs/outputs, "
                                          "so the deploy bundle builds the plan with the serving release's own TensorRT (its NGC TensorRT "
                                          "container) and serves it only if it matches (see docs/ngc.md)", group=ENGINES)
    optimization_level: int = option(3, "TensorRT builder optimization level", check=in_range(0, 5), metavar="0-5", group=ENGINES)
    tf32: bool = option(True, "build FP32 engines without TF32 (TensorRT's default lets FP32 layers use TF32 tensor cores: faster on "
                              "Ampere and newer, FP16-like 10-bit mantissa; the FP32 engine's gate follows: --tf32-atol, "
                              "else --fp32-engine-atol)", flag="--no-tf32", group=ENGINES)
    hardware_compatible: bool = option(False, "build hardware-compatible plans (TensorRT's AMPERE_PLUS level) that load on any GPU of "
                                              "compute capability 8.0 or newer, for mixed fleets; they can be slower (see docs/tensorrt.md)",
                                       group=ENGINES)
    workspace: int | None = option(None, "cap TensorRT's workspace memory pool (scratch memory for layer tactics) at MIB mebibytes when "
                                         "building plans (default: TensorRT's, up to the GPU's memory; a MIG slice needs it capped)",
                                   metavar="MIB", check=lambda v: None if v is None or v >= 1 else "must be at least 1",
                                   fix="e.g. --workspace 1024, or leave it out", group=ENGINES)
    require_tensorrt: bool = option(False, "fail the build when a GPU variant does not parse or build with TensorRT (where TensorRT cannot "
                                           "run: the TensorRT-RTX check, else the hand-written parser rules) instead of going on with "
                                           "its ONNX variant served by ONNX Runtime", group=ENGINES)
    check_compute_capability: str = option(DEFAULT_COMPUTE_CAPABILITY, "without TensorRT, build the GPU variants with TensorRT-RTX ahead "
                                                                       "of time for this compute capability (a check: those plans are "
                                                                       "never published; see docs/tensorrt.md)",
                                           choices=COMPUTE_CAPABILITIES, metavar="MAJOR.MINOR", group=ENGINES)
    allow_plan_host_code: bool = option(False, "let TensorRT run host code embedded in a plan when it is deserialized (only "
                                               "version-compatible plans have any; the pipeline builds none): off unless you trust the plan",
                                        group=ENGINES)
    raw_inputs: str | None = option(None, "also publish an ensemble <name> that answers raw requests: image = JPEG/PNG bytes in (decoded, "
                                          "fitted by --resize, resized, scaled as the model was trained); text = sentences in (the keras-hub "
                                          "task's own WordPiece tokenizer); the variant's answers and top-k class names out; gated through "
                                          "Triton on --eval-data's raw inputs (a folder of images, one sub-folder per class; a CSV text,label)",
                                    choices=("image", "text"), group=RAW)
    resize_filter: str = option("bilinear", "how the image ensemble resizes, as the model's training loader did: bilinear = "
                                            "tf.image.resize (keras.utils.image_dataset_from_directory, keras.layers.Resizing); "
                                            "pil-bilinear = PIL's antialiased filter (keras.utils.load_img(interpolation='bilinear'))",
                                choices=tuple(RESIZE_FILTERS), group=RAW)
    tokenizer: Path | None = option(None, "for --raw-inputs text on a model whose inputs are token ids and a mask (token_ids/input_ids, "
                                          "padding_mask/attention_mask, segment_ids/token_type_ids) and that carries no keras-hub "
                                          "preprocessor: its WordPiece tokenizer, a keras-hub preset folder or a vocab.txt",
                                    metavar="PATH", group=RAW)
    raw_variant: str | None = option(None, "the variant the raw-input ensemble serves (default: the fastest ONNX variant that passed its gate)",
                                     choices=("fp32", "fp16", "int8", "int8cpu"), group=RAW)
    raw_instances: int = option(2, "CPU instances of each step in front of the variant (guard, decoder, tokenizer): each takes one image "
                                   "or request at a time, and one became the ensemble's limit on a GPU server", check=in_range(1, 64),
                                metavar="N", group=RAW)
    extensions_library: Path | None = option(None, "onnxruntime-extensions' standalone libortextensions.so to ship for the ensemble's decoder "
                                                   "(default: the PyPI wheel's, which only a Python process loads: the deploy bundle refuses it)",
                                             metavar="PATH", group=RAW)
    verify_served: bool = option(False, "after publishing, start the embedded tritonserver and run `verify` on the new variants", group=SERVED)
    verify_url: str | None = option(None, "after publishing, verify through this running Triton (HTTP) instead", metavar="HOST:PORT", group=SERVED)
    fleet: Path | None = option(None, "build every model a fleet file lists ([[model]] tables of these options, over the command line's) "
                                      "into --repository, one after another; a failed model never stops the others (exit 1 naming them)",
                                metavar="TOML", group=FLEET)
    fleet_index: int | None = option(None, "with --fleet: build only the model at this index (from 0; what each pod of --k8s-job runs)",
                                     metavar="N", check=at_least(0), group=FLEET)
    k8s_job: Path | None = option(None, "with --fleet: write an Indexed Kubernetes Job (one model per index, publishing into an s3:// "
                                        "--repository) and its ConfigMap to this file instead of building", metavar="YAML", group=FLEET)
    job_image: str = option("keras-trt-pipeline:latest", "with --k8s-job: the image holding this pipeline", metavar="IMAGE", group=FLEET)
    gpu_product: str | None = option(None, "with --k8s-job: the GPU the engines are built on and served on (node label "
                                           "nvidia.com/gpu.product, e.g. NVIDIA-H200); needed unless --no-engine", metavar="PRODUCT", group=FLEET)
    gates: Gates = field(default_factory=Gates)
    # The TensorRT every engine step goes through (pipeline.backend.trt_seam); not an option: a caller
    # without TensorRT (the CI tests) passes its own implementation here.
    tensorrt: TensorRT = field(default_factory=PolygraphyTensorRT, repr=False, compare=False)
    # How this build was asked for: recorded in the manifest and beside artifacts; not an option.
    command: str = "python -m pipeline build"

    @property
    def precisions(self) -> tuple[str, ...]:
        return (("fp32",) + (("fp16",) if self.fp16 else ()) + (("int8",) if self.int8 else ()) + (("int8cpu",) if self.with_int8_cpu else ())
                + (("u8",) if self.uint8_input is not None else ()))

    @property
    def with_int8_cpu(self) -> bool:
        """Whether the CPU INT8 variant is made: asked for, or added unasked with --int8."""
        return bool(self.int8_cpu) or (self.int8 and self.int8_cpu is None)

    @property
    def calibrates(self) -> bool:
        """Whether an INT8 variant needs calibration data."""
        return self.int8 or self.with_int8_cpu

    @property
    def optional_precisions(self) -> frozenset[str]:
        """Variants the user did not name: left out with one line, not a failed build, when their gate does not pass."""
        return frozenset({"int8cpu"} if self.int8_cpu is None else ())

    @property
    def fallback(self) -> FallbackSettings:
        return FallbackSettings(enabled=self.int8_fallback, max_share=self.int8_fallback_max_share)

    def model_name(self, source: ModelSource) -> str:
        """``--name``, else the file stem / folder name / module name (``digits`` for the default)."""
        if self.name:
            name = self.name
        elif source.path is not None:
            name = source.path.stem if source.kind in ("keras", "h5") else source.path.resolve().name
        else:
            name = source.spec.partition(":")[0].rsplit(".", 1)[-1]
        if not _NAME.match(name):
            raise PipelineError(
                f"model name '{name}' is not a valid Triton model name",
                "pass --name with letters, digits, '_' or '-' (at most 64 characters)",
            )
        return name

    def validate(self) -> None:
        """Check option values that need no model; raise PipelineError on the first bad one."""
        check_options(self)
        parse_output_kinds(self.output_kinds)
        for text in self.shapes:
            if not well_formed(text):
                raise PipelineError(f"malformed --shape '{text}': expected {SHAPE_SYNTAX}", "write e.g. --shape image:1x8x8x1/32x8x8x1/64x8x8x1")
        if self.eval_data is not None and not self.eval_data.exists():
            raise PipelineError(f"evaluation data '{self.eval_data}' does not exist", "pass an .npz (or a folder of .npy files) with one array "
                                "per input (and labels), a folder of images (one sub-folder per class) or a CSV of sentences to --eval-data")
        if self.calibrates and self.calibration is not None and not self.calibration.exists():
            raise PipelineError(f"calibration data '{self.calibration}' does not exist", "pass an .npz file or a folder of .npy files or images to --calibration")
        if self.mig and isinstance(self.repository, S3Url):
            local_only(self.repository, "build --mig (its launch bundle serves a mounted repository)")
        self._validate_raw_inputs()

    def _validate_raw_inputs(self) -> None:
        """The raw-input options, before any work: they belong together, and what they name must exist."""
        if self.raw_inputs is None:
            given = [flag for flag, value in (("--raw-variant", self.raw_variant), ("--extensions-library", self.extensions_library),
                                              ("--resize-filter", None if self.resize_filter == "bilinear" else self.resize_filter),
                                              ("--tokenizer", self.tokenizer)) if value is not None]
            if given:
                raise PipelineError(f"{' and '.join(given)} {'only apply' if len(given) > 1 else 'only applies'} with --raw-inputs", "add --raw-inputs image (or text), or leave them out")
            return
        built = {"fp32"} | ({"fp16"} if self.fp16 else set()) | ({"int8"} if self.int8 else set()) | ({"int8cpu"} if self.with_int8_cpu else set())
        if self.raw_variant is not None and self.raw_variant not in built:
            raise PipelineError(f"--raw-variant {self.raw_variant} is not among the variants this build makes ({', '.join(sorted(built))})",
                                f"build it too (--{self.raw_variant.replace('int8cpu', 'int8-cpu')}) or pick one of those")
        if self.raw_inputs == "image":
            if isinstance(self.repository, S3Url):
                raise PipelineError("--raw-inputs image ships a custom-op library inside the repository, which a server reading s3:// "
                                    "cannot load (the config names it relative to the repository's folder)",
                                    "publish to a folder (and sync it to the bucket for a mounted deployment), or leave --raw-inputs out")
            if self.extensions_library is not None and not self.extensions_library.is_file():
                raise PipelineError(f"--extensions-library {self.extensions_library} does not exist",
                                    "pass the libortextensions.so built from onnxruntime-extensions' sources")
        elif self.extensions_library is not None:
            raise PipelineError("--extensions-library only applies to --raw-inputs image (text needs no custom ops)", "leave it out")
        elif self.resize_filter != "bilinear":
            raise PipelineError(f"--resize-filter {self.resize_filter} only applies to --raw-inputs image", "leave it out")
        if self.tokenizer is not None and self.raw_inputs != "text":
            raise PipelineError("--tokenizer only applies to --raw-inputs text", "leave it out, or use --raw-inputs text")
        if self.tokenizer is not None and not self.tokenizer.exists():
            raise PipelineError(f"--tokenizer {self.tokenizer} does not exist",
                                "pass a keras-hub preset folder or a WordPiece vocabulary file (vocab.txt)")
