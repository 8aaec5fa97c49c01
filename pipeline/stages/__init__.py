"""Build stages: each takes a path in and writes a path out."""
