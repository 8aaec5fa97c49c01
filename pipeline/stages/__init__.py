"""Build stages: each takes a path in and writes a path out (SavedModel, ONNX, parity, FP16, INT8,
the CPU INT8, the TensorRT check and engine, accuracy, latency), with the helpers only they use and
TensorRT's seam (tensorrt_env, trt_seam, trt_compile, trt_rtx, plan_runner, plan_binding).

May import: core, data, backend, accuracy.
"""
