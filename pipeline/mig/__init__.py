"""Instances per MIG slice: profile tables, nvidia-smi parsers, memory per model instance, the
plan, per-profile Triton configs and a deployment bundle (launch script, compose, Kubernetes).

May import: core, data, backend, triton.
"""
