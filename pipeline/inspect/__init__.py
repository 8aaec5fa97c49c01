"""What a model is: inputs, outputs, dynamic axes, profiles, op counts, Q/DQ nodes, and whether
TensorRT's ONNX parser takes it (report); ``python -m pipeline inspect`` is commands/inspect.py.

May import: core, data, backend, stages.
"""
