"""Keras → ONNX → FP16/INT8 (explicit Q/DQ) → TensorRT → Triton: a deployment pipeline.

The packages, each importing only what its ``__init__`` names (``May import:``), so the imports run
one way, from the command line down to the plumbing (checked by tests/test_layering.py)::

    cli.py, __main__.py   the command line: registers the commands of commands/
    commands/             the commands: flags and config files turned into calls of what is below
    build/                the build: its options, the orchestrator, publishing
    reports/              what a person reads: terminal tables, the HTML page, charts
    tune/                 serving configurations chosen by load tests
    loadtest/  mig/       load tests of a Triton server; instances per MIG slice
    triton/   inspect/    configs, repositories, the server, served verification; what a model is
    stages/   models/     build stages (a path in, a path out); the bundled model
    accuracy/ backend/    judging a variant against FP32; running models (ONNX Runtime, TensorRT)
    data/                 a model's inputs and outputs, sample files, a build's files on disk
    core/                 plumbing: errors, atomic files, the stage cache, logs, options

This module holds the version alone and imports nothing, so any module may read it.
"""

__version__ = "0.1.0"
