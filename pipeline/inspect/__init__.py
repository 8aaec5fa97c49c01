"""`python -m pipeline inspect`: what a model is, and whether TensorRT's ONNX parser takes it (see report.py)."""
