"""Triton model repository: model configs, atomic publishing, and the production deploy bundle."""
