"""Data files the pipeline reads (see each file's own source note)."""
