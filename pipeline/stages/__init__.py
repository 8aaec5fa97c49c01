"""Build stages: each takes a path in and writes a path out (the model's source, SavedModel, ONNX,
parity, FP16, INT8 and the CPU INT8, uint8 inputs, the TensorRT check and engine, accuracy, latency),
with their helpers (calibration, Q/DQ placement, the accuracy-aware fallback, dynamic shape profiles
from ``--shape`` and the data). The build and ``inspect`` read what a stage wrote (the profiles, an
engine's metadata) through that stage's module.

May import: core, data, backend, accuracy.
"""
