"""What a model takes and gives, the samples fed to it, and the files a build hands on.

A model's inputs and outputs read from its ONNX file (tensors) and its optimization profiles as
values (profiles); sample arrays from ``.npz``/``.npy`` files and their length buckets, for
calibration, evaluation and load tests (arrays, buckets), and the uint8 a client sends for a ``_u8``
variant (uint8_wire); a build's variants and their Triton names (artifacts); where a build's and a
model's files live on disk (workspace).

May import: core.
"""
