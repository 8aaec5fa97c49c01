"""Raw images → the model's input tensor, as one ONNX graph (``build --raw-inputs image``).

The graph a Triton ensemble runs in front of the model (pipeline/triton/ensemble.py):

``bytes (uint8 [-1], a JPEG or PNG file) → DecodeImage → RGB → [grayscale] → fit → resize → scale → [1, H, W, C]``

* decoding is onnxruntime-extensions' ``DecodeImage`` (domain ``com.microsoft.extensions``), which gives BGR
  HWC uint8; the channels are put in RGB order here, as PIL and Keras read images;
* grayscale is PIL's ``L`` conversion (``(19595 R + 38470 G + 7471 B + 2¹⁵) >> 16``);
* fit is the build's ``--resize`` policy (stretch, centre crop, pad with black), computed from the
  image's own size inside the graph, with the arithmetic of :func:`pipeline.data.raw_files.fitted_image` (Keras's for the crop);
* resizing follows ``--resize-filter`` (:data:`pipeline.data.raw_files.RESIZE_FILTERS`): ``bilinear`` is ONNX ``Resize``
  linear with half-pixel centres, as ``tf.image.resize`` (Keras's ``image_dataset_from_directory`` and ``Resizing``);
  ``pil-bilinear`` adds ``antialias=1`` (opset 18), which follows PIL's filter (its support widens when shrinking),
  rounded back to 0..255 as PIL's uint8 result is (``keras.utils.load_img``);
* scaling is ``x · a + b`` per channel: from ``--preprocess`` when the model has no scaling layer of
  its own, and none when it has (the model takes 0..255 then).

The second graph, ``image_preprocess_onnx(..., decoded=True)``, is the same from decoded uint8 HWC images (clients that
decode themselves). Both take one image per request: images differ in size until they are resized.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.data.raw_files import BYTES_INPUT, HWC_INPUT, PREPROCESS_SCALES, SPEC_KEY, ImagePreprocess
from pipeline.data.tensors import TensorSpec

log = logging.getLogger(__name__)

EXTENSIONS_DOMAIN = "com.microsoft.extensions"  # onnxruntime-extensions' domain of its image ops
OPSET = 18  # Resize's antialias attribute
PREFIX = "preprocess/"  # the graph's own node and tensor names


def image_preprocess_for(spec: TensorSpec, fit: str | None, preprocess: str, model_scaling: str | None,
                         resize_filter: str = "bilinear") -> ImagePreprocess:
    """The preprocessing for image input ``spec``: its size and channels from the model, the fit from ``--resize``
    (stretch when not given), the filter from ``--resize-filter``, the scale from the model's own layer (``model_scaling`` says which: then none here)
    or from ``preprocess``. PipelineError (one line) when the input is not an image of a fixed size."""
    from pipeline.stages.calibration_images import image_layout

    if np.dtype(spec.dtype).kind != "f":
        raise PipelineError(f"--raw-inputs image: model input '{spec.name}' takes {np.dtype(spec.dtype).name}, and the preprocessing "
                            "makes float32 pixels", "export the model with a float image input (the scaling inside it)")
    try:
        layout = image_layout(spec, None)
    except PipelineError as exc:
        raise PipelineError(f"--raw-inputs image: {exc.problem}", "the input must be an image of a fixed size (NHWC or NCHW, 1 or 3 "
                            "channels): export the model with its height and width") from None
    if model_scaling is not None:
        scale, offset = (1.0,) * layout.channels, (0.0,) * layout.channels
        scaling = f"no scaling here: the model's own {model_scaling} takes 0..255 (--preprocess not applied)"
    else:
        if layout.channels == 1 and preprocess == "imagenet":
            raise PipelineError(f"--preprocess imagenet needs an RGB input; '{spec.name}' has one channel",
                                "pass --preprocess unit, symmetric or raw")
        scale, offset = PREPROCESS_SCALES[preprocess]
        scale, offset = scale[: layout.channels], offset[: layout.channels]
        scaling = f"--preprocess {preprocess} (the model has no Rescaling/Normalization layer)"
    return ImagePreprocess(spec.name, layout.height, layout.width, layout.channels, layout.channels_first, fit or "stretch",
                           tuple(float(s) for s in scale), tuple(float(o) for o in offset), scaling, interpolation=resize_filter)


def image_preprocess_onnx(pre: ImagePreprocess, dst: Path, *, decoded: bool = False) -> Path:
    """Write the preprocessing graph for ``pre`` to ``dst``: from an encoded image (input :data:`BYTES_INPUT`),
    or with ``decoded`` from a uint8 HWC RGB image (input :data:`HWC_INPUT`)."""
    import onnx
    from onnx import TensorProto, helper

    nodes: list[onnx.NodeProto] = []
    consts: list[onnx.TensorProto] = []

    # Every name of the graph's own gets a prefix, so none can clash with the model input's name (its one output).
    def const(name: str, value: np.ndarray) -> str:
        consts.append(onnx.numpy_helper.from_array(np.asarray(value), PREFIX + name))
        return PREFIX + name

    def node(op: str, inputs: list[str], output: str, domain: str = "", final: bool = False, **attrs: Any) -> str:
        inputs = [i if i in ("", BYTES_INPUT, HWC_INPUT) or i.startswith(PREFIX) else PREFIX + i for i in inputs]
        name = output if final else PREFIX + output
        nodes.append(helper.make_node(op, inputs, [name], name=name, domain=domain, **attrs))
        return name

    if decoded:
        source = helper.make_tensor_value_info(HWC_INPUT, TensorProto.UINT8, ["height", "width", 3])
        rgb = HWC_INPUT
    else:
        source = helper.make_tensor_value_info(BYTES_INPUT, TensorProto.UINT8, ["bytes"])
        image = node("DecodeImage", [BYTES_INPUT], "decoded", domain=EXTENSIONS_DOMAIN)
        # BGR to RGB with one Gather, each index capped at the last channel there is: a one-channel result is read three
        # times (the guard in front refuses grayscale JPEGs, which DecodeImage 0.15.2 mangles; a Slice and Expand here
        # made ONNX Runtime 1.32 reuse a buffer too early: garbage out)
        order = [2, 1, 0] if pre.channel_order == "RGB" else [0, 1, 2]
        channels = node("Gather", [node("Shape", [image], "decoded_shape"), const("i2", np.array(2, np.int64))], "decoded_channels", axis=0)
        last = node("Sub", [channels, const("one", np.array(1, np.int64))], "decoded_last_channel")
        picks = node("Min", [const("rgb_order", np.array(order, np.int64)), last], "rgb_picks")
        rgb = node("Gather", [image, picks], "decoded_rgb", axis=2)
    pixels = node("Cast", [rgb], "pixels", to=TensorProto.FLOAT)
    if pre.channels == 1:
        weights = const("luma_weights", np.array([19595, 38470, 7471], np.float32) / np.float32(65536))
        luma = node("Mul", [pixels, weights], "luma_parts")
        summed = node("ReduceSum", [luma, const("channel_axis", np.array([2], np.int64))], "luma_sum", keepdims=1)
        pixels = node("Floor", [node("Add", [summed, const("half", np.array(0.5, np.float32))], "luma_rounding")], "luma")
    if pre.interpolation == "bilinear" and pre.fit == "pad":
        rounded = _resized_with_pad(pre, pixels, node, const)
    else:
        rounded = _resized(pre, _fit(pre, pixels, node, const), node, const)
    laid = node("Transpose", [rounded], "chw", perm=[2, 0, 1]) if pre.channels_first else rounded
    batched = node("Unsqueeze", [laid, const("batch_axis", np.array([0], np.int64))], "batched")
    per_channel = (pre.channels, 1, 1) if pre.channels_first else (pre.channels,)
    # the last node computes (Add, not Unsqueeze): ONNX Runtime 1.32 gave out garbage when the graph's output was an
    # Unsqueeze viewing an earlier buffer, after the custom op (measured: 2 of 10 JPEGs)
    scaled = node("Mul", [batched, const("scale", np.array(pre.scale, np.float32).reshape(per_channel))], "scaled_only")
    node("Add", [scaled, const("offset", np.array(pre.offset, np.float32).reshape(per_channel))], pre.input, final=True)
    shape = [1, pre.channels, pre.height, pre.width] if pre.channels_first else [1, pre.height, pre.width, pre.channels]
    graph = helper.make_graph(nodes, "image_preprocess", [source], [helper.make_tensor_value_info(pre.input, TensorProto.FLOAT, shape)], consts)
    opsets = [helper.make_opsetid("", OPSET)] + ([] if decoded else [helper.make_opsetid(EXTENSIONS_DOMAIN, 1)])
    model = helper.make_model(graph, opset_imports=opsets, producer_name="keras-trt-pipeline")
    model.ir_version = 8  # ONNX Runtime 1.19 (NGC 24.10) loads IR ≤ 10; 8 is what opset 18 needs
    model.metadata_props.add(key=SPEC_KEY, value=pre.to_json())
    if decoded:
        onnx.checker.check_model(model, full_check=True)
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    return dst


def _resized(pre: ImagePreprocess, fitted: str, node, const) -> str:  # type: ignore[no-untyped-def]
    """``fitted`` resized to the input's size by ``pre.interpolation`` (:data:`pipeline.data.raw_files.RESIZE_FILTERS`)."""
    sizes = const("target_size", np.array([pre.height, pre.width], np.int64))
    attrs: dict[str, Any] = {"axes": [0, 1], "coordinate_transformation_mode": "half_pixel"}
    if pre.interpolation == "bilinear":  # tf.image.resize: the half-pixel linear filter as it is, float out
        return node("Resize", [fitted, "", "", sizes], "resized", mode="linear", **attrs)
    if pre.interpolation == "pil-bilinear":
        # exclude_outside: the filter's weights past the border are dropped and the rest renormalized, as PIL does
        # (without it the edge row counts twice: 20 grey levels off at a pad's black border)
        attrs.update(mode="linear", antialias=1, exclude_outside=1)
    else:
        attrs.update(mode=pre.interpolation, nearest_mode="floor")
    resized = node("Resize", [fitted, "", "", sizes], "resized", **attrs)
    return node("Clip", [node("Round", [resized], "resized_rounded"), const("zero", np.array(0, np.float32)),
                         const("full", np.array(255, np.float32))], "resized_uint8_range")  # PIL's uint8 result


def _resized_with_pad(pre: ImagePreprocess, pixels: str, node, const) -> str:  # type: ignore[no-untyped-def]
    """``tf.image.resize_with_pad``: shrunk or grown by the larger of the two ratios (float32, floor), bilinear, then
    black borders, the top and left ones floor((target − exact size) / 2)."""
    hw = node("Cast", [node("Slice", [node("Shape", [pixels], "image_shape"), const("s0", np.array([0], np.int64)),
                                      const("s2", np.array([2], np.int64))], "image_hw")], "image_hw_float", to=1)
    target = const("target_hw", np.array([pre.height, pre.width], np.float32))
    ratio = node("ReduceMax", [node("Div", [hw, target], "hw_ratios"), const("r0", np.array([0], np.int64))], "ratio", keepdims=1)
    inner = node("Div", [hw, ratio], "inner_hw")
    sizes = node("Cast", [node("Floor", [inner], "inner_hw_floor")], "inner_sizes", to=7)
    resized = node("Resize", [pixels, "", "", sizes], "resized", mode="linear", axes=[0, 1], coordinate_transformation_mode="half_pixel")
    before = node("Cast", [node("Max", [node("Floor", [node("Div", [node("Sub", [target, inner], "spare_hw"), const("two_f", np.array(2.0, np.float32))],
                                                                    "half_spare_hw")], "pad_before_floor"), const("zero_f", np.array(0.0, np.float32))],
                                "pad_before_float")], "pad_before", to=7)
    after = node("Sub", [node("Sub", [const("target_sizes", np.array([pre.height, pre.width], np.int64)), sizes], "pad_total"), before], "pad_after")
    no_channel_pad = const("no_channel_pad", np.array([0], np.int64))
    pads = node("Concat", [before, no_channel_pad, after, no_channel_pad], "pads", axis=0)
    return node("Pad", [resized, pads, const("black", np.array(0.0, np.float32))], "resized_padded", mode="constant")


def _fit(pre: ImagePreprocess, pixels: str, node, const) -> str:  # type: ignore[no-untyped-def]
    """The image brought to the input's aspect ratio by ``pre.fit``, with the arithmetic of
    ``pipeline.data.raw_files.fitted_image`` (Python's round: half to even, as ONNX Round)."""
    if pre.fit == "stretch":
        return pixels
    ratio = const("aspect", np.array(pre.width / pre.height, np.float32))
    hw_int = node("Slice", [node("Shape", [pixels], "image_shape"), const("s0", np.array([0], np.int64)),
                            const("s2", np.array([2], np.int64))], "image_hw")
    hw = node("Cast", [hw_int], "image_hw_float", to=1)
    h = node("Gather", [hw, const("i0", np.array(0, np.int64))], "image_h", axis=0)
    w = node("Gather", [hw, const("i1", np.array(1, np.int64))], "image_w", axis=0)
    as_w = node("Round", [node("Mul", [h, ratio], "h_times_aspect")], "w_at_aspect")  # round(h · W/H): the pad's canvas
    as_h = node("Round", [node("Div", [w, ratio], "w_over_aspect")], "h_at_aspect")  # round(w / (W/H))
    # the crop's box as keras.utils.load_img(keep_aspect_ratio=True) takes it: h·W // H and w·H // W (exact in float32)
    floor_w = node("Floor", [node("Div", [node("Mul", [h, const("out_w", np.array(pre.width, np.float32))], "h_by_W"),
                                          const("out_h", np.array(pre.height, np.float32))], "h_by_W_over_H")], "crop_w_floor")
    floor_h = node("Floor", [node("Div", [node("Mul", [w, "out_h"], "w_by_H"), "out_w"], "w_by_H_over_W")], "crop_h_floor")
    half = const("two", np.array(2.0, np.float32))
    if pre.fit == "crop":
        new_h, new_w = node("Min", [h, floor_h], "crop_h"), node("Min", [w, floor_w], "crop_w")
        top = node("Floor", [node("Div", [node("Sub", [h, new_h], "spare_h"), half], "half_spare_h")], "crop_top")
        left = node("Floor", [node("Div", [node("Sub", [w, new_w], "spare_w"), half], "half_spare_w")], "crop_left")
        starts = node("Cast", [node("Concat", [node("Unsqueeze", [top, const("a0", np.array([0], np.int64))], "top1"),
                                               node("Unsqueeze", [left, "a0"], "left1")], "crop_starts", axis=0)], "crop_starts_int", to=7)
        ends = node("Add", [starts, node("Cast", [node("Concat", [node("Unsqueeze", [new_h, "a0"], "new_h1"),
                                                                   node("Unsqueeze", [new_w, "a0"], "new_w1")], "crop_size", axis=0)],
                                         "crop_size_int", to=7)], "crop_ends")
        return node("Slice", [pixels, starts, ends, const("hw_axes", np.array([0, 1], np.int64))], "fitted")
    if pre.fit != "pad":
        raise PipelineError(f"unknown fit '{pre.fit}'", "use stretch, crop or pad")
    canvas_h, canvas_w = node("Max", [h, as_h], "canvas_h"), node("Max", [w, as_w], "canvas_w")
    top = node("Floor", [node("Div", [node("Sub", [canvas_h, h], "pad_h"), half], "half_pad_h")], "pad_top")
    left = node("Floor", [node("Div", [node("Sub", [canvas_w, w], "pad_w"), half], "half_pad_w")], "pad_left")
    bottom = node("Sub", [node("Sub", [canvas_h, h], "pad_h2"), top], "pad_bottom")
    right = node("Sub", [node("Sub", [canvas_w, w], "pad_w2"), left], "pad_right")
    zero = const("fzero", np.array(0.0, np.float32))
    parts = [node("Unsqueeze", [v, const(f"u_{v}", np.array([0], np.int64))], f"{v}_1") for v in (top, left)]
    parts.append(node("Unsqueeze", [zero, const("u_z0", np.array([0], np.int64))], "zero_1a"))
    parts += [node("Unsqueeze", [v, const(f"u_{v}", np.array([0], np.int64))], f"{v}_1") for v in (bottom, right)]
    parts.append(node("Unsqueeze", [zero, const("u_z1", np.array([0], np.int64))], "zero_1b"))
    pads = node("Cast", [node("Concat", parts, "pads_float", axis=0)], "pads", to=7)
    return node("Pad", [pixels, pads, const("black", np.array(0.0, np.float32))], "fitted", mode="constant")
