"""Triton Inference Server: model configs (a ``ModelConfig`` printed with ``text_format``), the model
repository and its atomic publishing (local and S3), the embedded server and its supervisor, the
served verification and its gate, and the production deploy bundle.

May import: core, data, backend, accuracy.
"""
