"""Keras → ONNX → FP16/INT8 (explicit Q/DQ) → TensorRT → Triton: a deployment pipeline."""

__version__ = "0.1.0"
