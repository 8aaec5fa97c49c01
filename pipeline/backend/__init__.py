"""Running models. ONNX Runtime: sessions with Q/DQ evaluated as TensorRT does (onnxrt), and which x86
CPUs compute a CPU INT8 model as it was gated (cpu_kernels). Polygraphy runners for every kind of
model the pipeline compares (runners); memory budgets of a run from the graph alone (budget).
TensorRT: which ONNX operators its parser takes (trt_support, its rules as data in
``onnx_trt_ops.json``), whether it can run here (tensorrt_env), the one seam into it (trt_seam; its
build half trt_compile, shared with TensorRT-RTX in trt_rtx), plans run on batches (plan_runner) and
bound to where they load (plan_binding).

May import: core, data.
"""
