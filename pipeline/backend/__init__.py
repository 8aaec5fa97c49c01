"""Running models: ONNX Runtime sessions with Q/DQ evaluated as TensorRT does (onnxrt), Polygraphy
runners for every kind of model the pipeline compares (runners), memory budgets of a run from the
graph alone (budget), and which ONNX operators TensorRT's parser takes (trt_support, with its rules
as data in ``onnx_trt_ops.json``). TensorRT's own seam (building, binding and running plans) lives
beside the engine stage in stages/.

May import: core, data.
"""
